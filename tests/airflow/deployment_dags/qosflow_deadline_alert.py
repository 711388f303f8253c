"""A nightly-style training whose deadline is too short: the run a missed deadline makes.

The test (``tests/airflow/test_plugin.py``) sizes the job from this machine's trainer speed
(``total_steps`` in the run's conf) so that even both CPUs cannot make ``DEADLINE``: the plan
says best effort, a round scales it up with its reason, the job ends late, the finish step
records and reports and then fails the run (``on_miss="fail"``, the default), and the DAG's
Deadline Alert (:func:`qosflow_airflow.deadline_alert`) fires from the triggerer while the run
is still going.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from qosflow_airflow import deadline_alert
from qosflow_airflow.task_group import deadline_training

DEADLINE = "PT20S"
JOB = {
    "name": "late-retrain",
    "key": "deadline-alert-check",
    "total_steps": "{{ params.total_steps }}",
    "deadline": DEADLINE,
    "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2, "memory_per_unit": "1Gi"},
    "checkpoint_every_steps": 20,
    "margin_seconds": 3,
    "dwell_seconds": 4,
    "step_seconds_estimate": "{{ params.step_s }}",
    "command": ["python", "-m", "qosflow_trainer", "--width={{ params.width }}"],
}

with DAG(
    dag_id="qosflow_deadline_alert",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    deadline=deadline_alert(JOB),
    render_template_as_native_obj=True,
    params={
        "total_steps": Param(400, type="integer", minimum=1),
        "width": Param(512, type="integer", minimum=8),
        "step_s": Param(None, type=["null", "number"]),
    },
) as dag:
    deadline_training(JOB, rounds=2, initial_units=1, poll_interval=1.0)
