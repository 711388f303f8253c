"""Three teams, three deadlines, one cluster: admission and priority at work.

Each job gets its own ``deadline_training`` group, planned against the same cluster from the teams'
step-time estimates on the first run and from the history store afterwards. The jobs are planned
one after the other, earliest deadline first, each once the previous one is submitted, so each
admission sees the guarantees already given. Admission reserves units for the jobs it guarantees, runs the rest best effort
(with the earliest deadline that would have passed as a counter-offer), and the priority ladder
orders their pods by laxity: the tight ``ranking`` job outranks ``embeddings``, which outranks the
relaxed ``forecast`` job.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from qosflow_airflow.task_group import deadline_training

RESOURCES = {"unit": "cpu", "min": 1, "max": 2, "per_node": 2, "memory_per_unit": "1Gi"}
TRAINER = ["python", "-m", "qosflow.trainer", "--width", "256"]
RUN = "{{ dag_run.run_after | ts_nodash | lower }}"

with DAG(
    dag_id="qosflow_multi_tenant",
    description="Three training jobs with different deadlines sharing one cluster",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["qosflow", "example"],
    doc_md=__doc__,
) as dag:
    submitted = None
    for team, steps, deadline in (
        ("ranking", 300, "PT4M"),
        ("embeddings", 300, "PT8M"),
        ("forecast", 200, "PT20M"),
    ):
        group = deadline_training(
            {
                "name": f"{team}-{RUN}",
                "key": team,
                "total_steps": steps,
                "deadline": deadline,
                "resources": RESOURCES,
                "checkpoint_every_steps": 20,
                "dwell_seconds": 20,
                "step_seconds_estimate": 0.3,  # the teams' guess on 1 CPU; history replaces it
                "command": TRAINER,
            },
            rounds=3,
            group_id=team,
            poll_interval=3.0,
        )
        if submitted is not None:  # admit after the guarantees already given
            submitted >> group.children[f"{team}.plan"]
        submitted = group.children[f"{team}.submit"]
