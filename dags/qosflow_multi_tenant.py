"""Three teams, three deadlines, one 2-CPU cluster: the cluster allocator shares the CPUs.

Every plan step and every watch of every job runs the same cluster allocator on the namespace's
job board (``qosflow.core.allocator.allocate``); each step acts on its own job only. The run tells
one story, sized at the start from what the trainer does on this cluster right now:

1. ``measure`` runs the trainer as pods of the cluster (two 1-CPU pods side by side, then one
   2-CPU pod), records what they measured as the three teams' history (the plan steps fit their
   speed beliefs on it) and sizes the jobs from the measured speeds (:func:`size_jobs`).
2. ``forecast`` arrives first: a long job, guaranteed on the empty cluster, and its team starts
   it on both CPUs (``initial_units``; the allocator would give it the spare CPU anyway).
3. ``ranking`` arrives ``ARRIVAL_S`` later with a tight deadline: it makes it only if it starts
   within about ``LATENCY_S``, on one CPU. The allocator re-plans both guarantees on the
   capacity timeline: ``forecast`` is ahead of what its guarantee needs (its deadline minus its
   margin), so it can lend a CPU while ``ranking`` runs. ``ranking`` is guaranteed,
   ``forecast``'s watch gives one CPU back and takes it again once ``ranking`` is done, and both
   deadlines are met. Deciding per job (each watch alone, ``qosflow.core.decide``) would not have done
   this: a job gives units back on its own only when a smaller size still finishes by its
   deadline minus *twice* its margin, which ``forecast`` never does before it ends. So it would
   keep both CPUs, and ``ranking`` would start only when ``forecast`` ends: at the speeds
   measured at the start, ``GAP_S`` after its deadline.
4. ``embeddings`` arrives last, once ``ranking`` trains, and wants its result sooner than even
   both CPUs could deliver it: admission says so at once, runs it best effort and names the
   earliest deadline it could guarantee next to the two promises already given (the
   counter-offer). It runs on what the guarantees leave.

Each team's deadline counts from its own arrival (``deadline_anchor="plan"``). Every step may be
retried once (``default_args``): the steps re-attach to what a failed try left running.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from qosflow_airflow.task_group import deadline_training

WIDTH = 512
"""The reference trainer's width (its step cost)."""
ARRIVAL_S = 25.0
"""``ranking`` arrives this long after ``forecast`` was planned."""
LATENCY_S = 45.0
"""Allowed for one give-back: the watch's poll and hold, then the decide and rescale steps."""
SLACK = 2.0
"""What a busy cluster and the plans' conservative step times may add to a measured median."""
SAFETY_S = 25.0
"""Room left in ``forecast``'s plan once it has lent ``ranking`` a CPU."""
RANKING_S = 30.0
"""``ranking``'s work on one CPU (median seconds)."""
GAP_S = 30.0
"""Deciding per job, ``ranking`` would end this long after its deadline (at measured speeds)."""
MARGINS = {"ranking": 15.0, "embeddings": 10.0}
"""``margin_seconds`` of the small jobs (``forecast``'s is sized: :func:`size_jobs`)."""
EMBEDDINGS_S = 20.0
"""``embeddings``' work on one CPU (median seconds)."""
CHECKPOINT_S = 8.0
"""One CPU's work between two checkpoints (seconds): a rescale loses at most that much.

Counted in seconds, not steps, like every size here: on a slow or busy machine a fixed count of
steps could exceed a small job's whole length, which the plan step refuses
(``checkpoint_every_steps`` must be at most ``total_steps``)."""
TEAMS = ("forecast", "ranking", "embeddings")
RUN = "{{ dag_run.run_after | ts_nodash | lower }}"


def size_jobs(rate1: float, rate2: float) -> dict[str, dict[str, Any]]:
    """Steps, deadline (seconds from its arrival) and margin of each job, from measured speeds.

    ``rate1``: steps per second on one CPU while the other CPU is busy too; ``rate2``: on two.
    Work is counted in one-CPU seconds; ``s`` is the speed-up of the second CPU.

    * ``ranking``: ``RANKING_S`` of work; its deadline allows one give-back, the work at
      ``SLACK`` times its measured speed, and its margin.
    * ``forecast``: so long that, on both CPUs to its end, ``ranking`` could only start after it
      and would end ``GAP_S`` late. Its deadline minus twice its margin is just before its end on
      two CPUs, so its own rule never gives a CPU back. Its margin is what lending a CPU until
      ``ranking``'s deadline costs its plan at ``SLACK`` times its measured speeds, plus
      ``SAFETY_S``; the allocator plans guarantees to the deadline minus one margin, so it can
      lend the CPU.
    * ``embeddings``: ``EMBEDDINGS_S`` of work, due sooner than both CPUs could finish it.
    """
    s = max(rate2 / rate1, 1.05)
    ranking_d = LATENCY_S + RANKING_S * SLACK + MARGINS["ranking"]
    work = max(s * (ARRIVAL_S + ranking_d + GAP_S) - RANKING_S, 3 * RANKING_S)
    lent = LATENCY_S + RANKING_S * SLACK
    lending = ARRIVAL_S * (1 - SLACK) + work * (SLACK - 1) / s + lent * (1 - 1 / s)
    margin = lending + SAFETY_S + 5.0  # deadline - margin: its plan with lending, SAFETY_S spare
    forecast_d = work / s + 2 * margin - 5.0  # deadline - 2 margins: 5 s before its end on two
    return {
        "forecast": {
            "steps": round(work * rate1),
            "deadline_s": round(forecast_d),
            "margin_s": round(margin),
        },
        "ranking": {
            "steps": round(RANKING_S * rate1),
            "deadline_s": round(ranking_d),
            "margin_s": MARGINS["ranking"],
        },
        "embeddings": {
            "steps": round(EMBEDDINGS_S * rate1),
            "deadline_s": round(0.8 * EMBEDDINGS_S / s + MARGINS["embeddings"]),
            "margin_s": MARGINS["embeddings"],
        },
        "speeds": {"one_cpu": rate1, "two_cpus": rate2, "speedup": s},
        "checkpoint_every_steps": max(round(CHECKPOINT_S * rate1), 1),
    }


@task
def measure() -> dict[str, dict[str, Any]]:
    """Measure the trainer as pods of the cluster, record it as history, size the jobs."""
    from qosflow_airflow.calibrate import measure_pods, steady_rate
    from qosflow_airflow.hooks.argo import QosflowArgoHook

    hook = QosflowArgoHook()
    pods = partial(
        measure_pods,
        hook.get_cluster(),
        defaults=hook.config.defaults,
        width=WIDTH,
    )
    side_by_side = pods((1, 1), seconds=12.0)
    (both,) = pods((2,), seconds=20.0)  # sustained: timed on its second half
    rates = [steady_rate(s) for s in side_by_side] + [steady_rate(both, skip=0.5)]
    if min(rates) <= 0:
        raise RuntimeError(f"a trainer pod made no progress while measured: {rates} steps/s")
    sizes = size_jobs(sum(rates[:2]) / 2, rates[2])
    store = hook.get_history()
    try:
        for team in TEAMS:  # one model family: the measurement is every team's first history
            store.record_samples(team, "cpu", [*side_by_side[0], *both])
    finally:
        store.close()
    print(f"measured and sized: {sizes}")
    return sizes


@task.sensor(poke_interval=2.0, timeout=300, mode="poke")
def arrives(after: str, seconds: float, ti: Any = None) -> bool:
    """True once ``seconds`` have passed since the job of plan step ``after`` was planned."""
    plan = ti.xcom_pull(task_ids=after)
    return bool(plan) and time.time() >= float(plan["planned_at"]) + seconds


@task.sensor(poke_interval=2.0, timeout=300, mode="poke")
def trains(plan_task: str, ti: Any = None) -> bool:
    """True once the job of plan step ``plan_task`` has a segment running on the cluster."""
    from qosflow.core.cluster import Phase
    from qosflow_airflow.hooks.argo import QosflowArgoHook

    plan = ti.xcom_pull(task_ids=plan_task)
    segments = QosflowArgoHook().get_cluster().list_jobs(plan["job_id"]) if plan else []
    return any(s.phase is Phase.RUNNING for s in segments)


def job(team: str) -> dict[str, Any]:
    """The team's job spec; its size comes from ``measure``."""
    return {
        "name": f"{team}-{RUN}",
        "key": team,
        "total_steps": f"{{{{ ti.xcom_pull(task_ids='measure')['{team}']['steps'] }}}}",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2, "memory_per_unit": "1Gi"},
        "checkpoint_every_steps": "{{ ti.xcom_pull(task_ids='measure')['checkpoint_every_steps'] }}",
        "margin_seconds": f"{{{{ ti.xcom_pull(task_ids='measure')['{team}']['margin_s'] }}}}",
        "dwell_seconds": 10,
        "command": ["python", "-m", "qosflow_trainer", "--width", str(WIDTH)],
    }


with DAG(
    dag_id="qosflow_multi_tenant",
    description="Three training jobs with different deadlines sharing one 2-CPU cluster",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["qosflow", "example"],
    doc_md=__doc__,
) as dag:
    groups = {
        team: deadline_training(
            job(team),
            rounds=2,
            group_id=team,
            deadline=f"PT{{{{ ti.xcom_pull(task_ids='measure')['{team}']['deadline_s'] }}}}S",
            deadline_anchor="plan",
            initial_units=2 if team == "forecast" else None,
            poll_interval=3.0,
            # embeddings was told at plan it runs best effort: its miss warns, theirs would fail
            on_miss="warn" if team == "embeddings" else "fail",
        )
        for team in TEAMS
    }
    forecast, ranking, embeddings = (groups[t].children for t in TEAMS)
    measure() >> forecast["forecast.plan"]
    ranking_arrives = arrives.override(task_id="ranking_arrives")("forecast.plan", ARRIVAL_S)
    forecast["forecast.submit"] >> ranking_arrives >> ranking["ranking.plan"]
    embeddings_arrives = trains.override(task_id="embeddings_arrives")("ranking.plan")
    ranking["ranking.submit"] >> embeddings_arrives >> embeddings["embeddings.plan"]
