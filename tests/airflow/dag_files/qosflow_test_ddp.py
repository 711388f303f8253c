"""A data-parallel deadline job: `unit: worker` (1 or 2 pods of one CPU) under torchrun."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from qosflow_airflow.task_group import deadline_training

with DAG(
    dag_id="qosflow_test_ddp",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "name": Param("ddp", type="string"),
        "steps": Param(1500, type="integer"),
        "deadline": Param("PT20M", type="string"),
        "report_dir": Param(".qosflow/reports", type="string"),
    },
) as dag:
    deadline_training(
        {
            "name": "{{ params.name }}",
            "total_steps": "{{ params.steps }}",
            "deadline": "{{ params.deadline }}",
            "resources": {"unit": "worker", "min": 1, "max": 2, "per_worker": {"cpu": 1}},
            "checkpoint_every_steps": 50,
            "margin_seconds": 5,
            "dwell_seconds": 8,
            "command": ["python", "-m", "qosflow_trainer", "--ddp", "--width", "128"],
        },
        rounds=3,
        initial_units=1,
        poll_interval=1.0,
        report_dir="{{ params.report_dir }}",
        deadline_anchor="plan",  # the deadline counts from the plan, whatever the queue did
        on_miss="warn",  # the test's deadline is one its history promises and the host may miss
    )
