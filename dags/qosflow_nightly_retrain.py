"""Nightly retrain with a deadline: data prep → deadline training → publish.

Every night at 01:00 (the DAG's timezone) the model is retrained and must be ready by 06:00 the
same morning. Nobody picks a number of CPUs: ``deadline_training`` plans the smallest size that
meets the deadline, launches the training as an Argo Workflow, watches its progress in rounds and
rescales or bumps its priority as needed; ``publish`` runs only when the training succeeded.

Params (set them when triggering, e.g. ``airflow dags trigger -c '{"deadline": "PT3M"}'``):

* ``deadline`` — ``HH:MM`` in the DAG's timezone (default ``06:00``), an ISO instant or an ISO
  duration from planning time (the demo uses ``PT3M``);
* ``initial_units`` — force the first size (the demo starts on 1 CPU so the job must scale up);
* ``total_steps`` and ``width`` — the size of the reference training run.
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Param

from qosflow_airflow.task_group import deadline_training

JOB = {
    "name": "retrain-{{ dag_run.run_after | ts_nodash | lower }}",
    "key": "nightly-retrain",
    "total_steps": "{{ params.total_steps }}",
    "deadline": "PT5H",
    "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2, "memory_per_unit": "1Gi"},
    "checkpoint_every_steps": 20,
    "margin_seconds": 10,
    "dwell_seconds": 15,
    "command": ["python", "-m", "qosflow_trainer", "--width", "{{ params.width }}"],
}

with DAG(
    dag_id="qosflow_nightly_retrain",
    description="Nightly retrain that must be done by 06:00",
    schedule="0 1 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="Europe/Amsterdam"),
    catchup=False,
    max_active_runs=1,
    tags=["qosflow", "example"],
    params={
        "deadline": Param("06:00", type="string", description="HH:MM, ISO instant or duration"),
        "initial_units": Param(None, type=["null", "integer"], description="first size"),
        "total_steps": Param(600, type="integer", minimum=1),
        "width": Param(512, type="integer", minimum=8),
    },
    doc_md=__doc__,
) as dag:
    prepare = EmptyOperator(task_id="prepare_data", doc_md="Extract and validate the training set.")
    training = deadline_training(
        JOB,
        rounds=4,
        conn_id="qosflow_default",
        deadline="{{ params.deadline }}",
        initial_units="{{ params.initial_units }}",
        poll_interval=2.0,
    )
    publish = EmptyOperator(task_id="publish_model", doc_md="Push the model to the registry.")
    prepare >> training >> publish
