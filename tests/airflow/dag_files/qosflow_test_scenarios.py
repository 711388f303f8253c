"""One deadline-training DAG whose job is set per run (``dag.test(run_conf=...)``) by the tests."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from qosflow_airflow.task_group import deadline_training

with DAG(
    dag_id="qosflow_test_scenarios",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    render_template_as_native_obj=True,
    params={
        "name": Param("scenario", type="string"),
        "steps": Param(100, type="integer"),
        "deadline": Param("PT5M", type="string"),
        "if_not_guaranteed": Param("run_best_effort", type="string"),
        "width": Param(512, type="integer"),
        "step_s": Param(
            None, type=["null", "number"], description="the user's estimate of s/step on 1 CPU"
        ),
        "initial_units": Param(None, type=["null", "integer"]),
        "report_dir": Param(".qosflow/reports", type="string"),
        "command": Param(None, type=["null", "array"], description="instead of the trainer's"),
    },
) as dag:
    deadline_training(
        {
            "name": "{{ params.name }}",
            "total_steps": "{{ params.steps }}",
            "deadline": "{{ params.deadline }}",
            "if_not_guaranteed": "{{ params.if_not_guaranteed }}",
            "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
            "checkpoint_every_steps": 20,
            "step_seconds_estimate": "{{ params.step_s }}",
            "margin_seconds": 5,
            "dwell_seconds": 8,
            "command": "{{ params.command or ['python', '-m', 'qosflow_trainer', "
            "'--width=' ~ params.width] }}",
        },
        rounds=3,
        initial_units="{{ params.initial_units }}",
        poll_interval=1.0,
        report_dir="{{ params.report_dir }}",
    )
