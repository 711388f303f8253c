"""Re-running a DAG run's steps finds the same job (issue 15): the job id and a relative deadline
come from the run, re-planning re-attaches, and racing or retried restarts converge."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from qosflow.core.cluster import Phase
from qosflow.core.errors import ClusterError

T0 = 1_800_000_000.0


def when(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


class FakeTI:
    """XCom in a dict, per task id; knows its DAG and map index like a task instance."""

    def __init__(self, dag_id: str = "nightly", map_index: int = -1) -> None:
        self.dag_id, self.map_index = dag_id, map_index
        self.task_id = ""
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))


def context(ti: FakeTI, run_id: str = "scheduled__2027-01-15", **dag_run: Any) -> dict[str, Any]:
    run = SimpleNamespace(run_id=run_id, dag_id=ti.dag_id, **dag_run)
    return {"ti": ti, "dag": SimpleNamespace(dag_id=ti.dag_id), "run_id": run_id, "dag_run": run}


def run(op: Any, ctx: dict[str, Any]) -> Any:
    ti = ctx["ti"]
    ti.task_id = op.task_id
    result = op.execute(ctx)
    if result is not None:
        ti.xcoms[(op.task_id, "return_value")] = json.loads(json.dumps(result))
    return result


CKPT = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "qosflow-checkpoints"}}


def job(**over: Any) -> dict[str, Any]:
    data = {
        "name": "nightly-retrain",
        "key": "nightly",
        "total_steps": 400,
        "deadline": "PT10M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "image": "registry.example/trainer:1",
        "pod": {"volumes": [CKPT]},
        "checkpoint": {"volume": "ckpt"},
        "dwell_seconds": 10,
        "margin_seconds": 5,
        "step_seconds_estimate": 1.0,
    }
    data.update(over)
    return data


def plan_op(**kw: Any) -> Any:
    from qosflow_airflow.operators.plan import PlanTrainingOperator

    return PlanTrainingOperator(task_id="plan", job=kw.pop("job", job()), **kw)


def submit_op() -> Any:
    from qosflow_airflow.operators.plan import SubmitTrainingOperator

    return SubmitTrainingOperator(task_id="submit", plan_task_id="plan")


def promises(tmp_path: Any, now: float) -> list[str]:
    """The guarantees on the job board (where the plan step records its job)."""
    from qosflow.store.board import JobBoard
    from qosflow.store.history import HistoryStore

    store = HistoryStore(f"sqlite:///{tmp_path}/history.db")
    try:
        with JobBoard(store, "qosflow").session(now) as board:
            return [e.job_id for e in board.entries("cpu") if e.active and e.guaranteed]
    finally:
        store.close()


# ------------------------------------------------------------------ one run, one job


def test_replanning_one_dag_run_three_times_gives_one_workflow_and_one_promise(
    fake_cluster: Any, tmp_path: Any
) -> None:
    """Plan + submit cleared and run again three times, minutes apart, with a relative
    deadline: every time the same job id and deadline, one workflow, one promise."""
    ti = FakeTI()
    ctx = context(ti, queued_at=when(T0 - 30), run_after=when(T0 - 60))
    fake_cluster.clock = T0
    plans = []
    for _ in range(3):
        plans.append(run(plan_op(job=job(deadline="PT30M")), ctx))
        run(submit_op(), ctx)
        fake_cluster.clock += 120.0  # the user clears the task group a while later
    assert len({p["job_id"] for p in plans}) == 1
    assert len({p["job"]["deadline"] for p in plans}) == 1
    assert plans[0]["job"]["deadline"] == when(T0 - 30 + 1800).isoformat()  # queued + PT30M
    assert [r.name for r in fake_cluster.requests] == [f"{plans[0]['job_id']}-s0"]
    running = [s for s in fake_cluster.list_jobs() if not s.phase.finished]
    assert len(running) == 1
    assert promises(tmp_path, fake_cluster.clock) == [plans[0]["job_id"]]
    # the re-plan counted its own running segment as its own capacity, not as someone else's
    assert {p["verdict"] for p in plans} == {"guaranteed"}
    assert json.loads(fake_cluster.requests[0].plan)["run"] == {
        "dag_id": "nightly",
        "run_id": "scheduled__2027-01-15",
        "map_index": -1,
    }


def test_the_job_id_comes_from_the_run_not_the_deadline(fake_cluster: Any) -> None:
    from qosflow.core.spec import load_job
    from qosflow_airflow.operators.plan import plan_job_id
    from qosflow_airflow.run import RunIdentity

    a = load_job(job(), now=when(T0))
    b = load_job(job(), now=when(T0 + 500))  # PT10M resolved later: another deadline
    run_1 = RunIdentity("nightly", "scheduled__1")
    assert plan_job_id(a, run_1) == plan_job_id(b, run_1)
    assert plan_job_id(a, run_1) != plan_job_id(a, RunIdentity("nightly", "scheduled__2"))
    assert plan_job_id(a, run_1) != plan_job_id(a, RunIdentity("other", "scheduled__1"))
    assert plan_job_id(a, run_1) != plan_job_id(a, replace(run_1, map_index=3))
    other_key = load_job(job(key="weekly"), now=when(T0))
    assert plan_job_id(a, run_1) != plan_job_id(other_key, run_1)
    assert plan_job_id(a, None) != plan_job_id(b, None)  # no run: the deadline stands in


@pytest.mark.parametrize(
    ("anchor", "dag_run", "expected"),
    [
        ("queued", {"queued_at": T0 - 300, "run_after": T0 - 400}, T0 - 300),
        ("queued", {"run_after": T0 - 400, "logical_date": T0 - 86_400}, T0 - 400),
        ("logical", {"queued_at": T0 - 300, "logical_date": T0 - 1000}, T0 - 1000),
        ("logical", {"run_after": T0 - 400}, T0 - 400),
        ("plan", {"queued_at": T0 - 300}, T0),
        ("queued", {}, T0),  # the run says nothing: the plan time
    ],
)
def test_relative_deadlines_count_from_the_chosen_anchor(
    fake_cluster: Any, anchor: str, dag_run: dict[str, float], expected: float
) -> None:
    fake_cluster.clock = T0
    ctx = context(FakeTI(), **{k: when(v) for k, v in dag_run.items()})
    plan = run(plan_op(job=job(deadline="PT30M"), deadline_anchor=anchor), ctx)
    assert plan["job"]["deadline"] == when(expected + 1800).isoformat()
    assert plan["job"]["submitted_at"] == expected and plan["planned_at"] == T0


def test_an_hh_mm_deadline_is_the_next_such_time_after_the_anchor(fake_cluster: Any) -> None:
    # queued at 05:50 UTC, planned at 06:10 (it waited behind another run): today's 06:00
    queued = datetime(2027, 1, 15, 5, 50, tzinfo=UTC).timestamp()
    fake_cluster.clock = queued + 1200
    ctx = context(FakeTI(), queued_at=when(queued))
    plan = run(plan_op(deadline="06:00"), ctx)
    assert plan["job"]["deadline"] == "2027-01-15T06:00:00+00:00"  # not tomorrow's
    assert plan["verdict"] == "best_effort"  # 10 minutes late already: nothing to guarantee


def test_an_unknown_anchor_is_refused_when_the_dag_is_parsed() -> None:
    with pytest.raises(ValueError, match="deadline_anchor"):
        plan_op(deadline_anchor="tomorrow")


def test_the_task_group_passes_the_anchor_to_the_plan_step() -> None:
    import pendulum
    from airflow.sdk import DAG

    from qosflow_airflow.task_group import deadline_training

    with DAG("anchor", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        deadline_training(job(), rounds=1, group_id="t", deadline_anchor="logical")
        deadline_training(job(), rounds=1, group_id="u")
    assert dag.get_task("t.plan").deadline_anchor == "logical"
    assert dag.get_task("u.plan").deadline_anchor == "queued"


# ------------------------------------------------------------------ re-attach after a restart


def _restart(cluster: Any, st: Any, reason: str = "t") -> Any:
    from qosflow_airflow.restart import checkpoint_restart

    return checkpoint_restart(
        cluster, st, units=2, priority_class="qosflow-high", priority=20, reason=reason
    )


def _running_state(fake_cluster: Any, polls: int = 4) -> Any:
    from qosflow.core.spec import load_job
    from qosflow_airflow.restart import submit_request
    from qosflow_airflow.state import TrainingState, job_to_dict

    st = TrainingState(
        job=job_to_dict(load_job(job(), now=when(fake_cluster.clock))),
        workflow="nightly-s0",
        segment=0,
        units=1,
        priority_class="qosflow-normal",
        priority=10,
        guaranteed=True,
        checkpoint_dir="/var/lib/qosflow/checkpoints/x",
        job_id="nightly",
    )
    fake_cluster.submit(submit_request(st, segment=0, resume=False))
    for _ in range(polls):
        fake_cluster.status(st.workflow)
    return st


def test_a_retried_restart_keeps_the_step_the_job_was_stopped_at(fake_cluster: Any) -> None:
    st = _running_state(fake_cluster)
    first = _restart(fake_cluster, st)
    stopped_at = fake_cluster.jobs["nightly-s0"].steps_done
    assert first.resumed_from == stopped_at > 0 and first.state.resumed_from == stopped_at
    for _ in range(5):  # the new segment trains on
        fake_cluster.status("nightly-s1")
    assert fake_cluster.jobs["nightly-s1"].steps_done > stopped_at
    again = _restart(fake_cluster, st, "retry")  # the rescale task's second try re-attaches
    assert again.status.name == "nightly-s1" and len(fake_cluster.requests) == 2
    assert again.resumed_from == stopped_at  # not the new segment's progress
    assert again.state.resumed_from == stopped_at


def test_the_rescale_step_records_where_the_job_resumed_from(fake_cluster: Any) -> None:
    from qosflow_airflow.operators.rescale import RescaleOperator

    st = _running_state(fake_cluster)
    _restart(fake_cluster, st)  # the first try restarted, then its worker died
    stopped_at = fake_cluster.jobs["nightly-s0"].steps_done
    for _ in range(5):
        fake_cluster.status("nightly-s1")
    ti = FakeTI()
    ti.xcoms[("submit", "state")] = st.to_dict()
    decision = {"action": "scale_up", "units": 2, "reason": "behind", "median_finish": T0}
    decision |= {"conservative_finish": T0, "deadline": T0 + 600, "margin": 5.0}
    ti.xcoms[("watch", "return_value")] = {"decision": decision}
    op = RescaleOperator(task_id="rescale", watch_task_id="watch", state_task_ids=["submit"])
    record = run(op, {"ti": ti})
    assert record["how"] == "restart" and record["resumed_from"] == stopped_at
    assert f"stopped at step {stopped_at}" in record["reason"]
    assert ti.xcoms[("rescale", "state")]["resumed_from"] == stopped_at


def test_the_loser_of_two_racing_restarts_reattaches_instead_of_failing(fake_cluster: Any) -> None:
    """Two tries of one rescale race: the winner stops and resubmits while the loser is between
    its checks; the loser finds the winner's segment and re-attaches (no error, one segment)."""
    st = _running_state(fake_cluster)
    stop, raced = fake_cluster.stop, []

    def stop_while_the_other_try_wins(name: str, *, message: str = "") -> Any:
        ended = stop(name, message=message)
        if not raced:
            raced.append(True)
            _restart(fake_cluster, st, "the other try")  # stops (already), resubmits s1
        return ended

    with mock.patch.object(fake_cluster, "stop", side_effect=stop_while_the_other_try_wins):
        loser = _restart(fake_cluster, st)
    assert raced and loser.status.name == "nightly-s1" and not loser.finished
    assert loser.resumed_from == fake_cluster.jobs["nightly-s0"].steps_done > 0
    assert [r.name for r in fake_cluster.requests] == ["nightly-s0", "nightly-s1"]


def test_a_restart_retried_after_its_stop_ended_failed_resumes(fake_cluster: Any) -> None:
    # the first try's stop ended Failed (exit 143 after the SIGTERM checkpoint), then its worker
    # died before resubmitting: the retry sees a Failed segment that *was stopped*, and resumes
    st = _running_state(fake_cluster)
    s0 = fake_cluster.jobs["nightly-s0"]
    message = "Stopped with strategy 'Stop': main: Error (exit code 143)"
    fake_cluster.jobs["nightly-s0"] = replace(s0, phase=Phase.FAILED, message=message)
    again = _restart(fake_cluster, st, "retry")
    assert again.state.workflow == "nightly-s1" and again.resumed_from == s0.steps_done
    # a segment that failed on its own is still not ours to resume
    st2 = _running_state(fake_cluster)
    fake_cluster.jobs["nightly-s1"] = replace(
        fake_cluster.jobs["nightly-s1"], phase=Phase.FAILED, message="OOMKilled"
    )
    with pytest.raises(ClusterError, match="OOMKilled"):
        _restart(fake_cluster, replace(st2, segment=1, workflow="nightly-s1"))


def test_a_segment_still_running_elsewhere_is_a_retryable_refusal(fake_cluster: Any) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from qosflow_airflow.operators.base import airflow_error
    from qosflow_airflow.restart import submit_request

    st = _running_state(fake_cluster)
    stray = replace(st, segment=5, workflow="nightly-s5")
    fake_cluster.submit(submit_request(stray, segment=5, resume=True))
    with pytest.raises(ClusterError, match="still running") as err:
        _restart(fake_cluster, st)
    assert err.value.retryable
    mapped = airflow_error(err.value)
    assert isinstance(mapped, AirflowException) and not isinstance(mapped, AirflowFailException)


def test_a_replan_after_a_restart_reattaches_to_the_newest_segment(fake_cluster: Any) -> None:
    ti = FakeTI()
    ctx = context(ti, queued_at=when(fake_cluster.clock))
    plan = run(plan_op(initial_units=1), ctx)
    run(submit_op(), ctx)
    st = __import__("qosflow_airflow.state", fromlist=["x"]).TrainingState.from_dict(
        ti.xcoms[("submit", "state")]
    )
    for _ in range(4):
        fake_cluster.status(st.workflow)
    _restart(fake_cluster, st)
    stopped_at = fake_cluster.jobs[st.workflow].steps_done
    run(plan_op(initial_units=1), ctx)  # the task group cleared: plan and submit again
    run(submit_op(), ctx)
    again = ti.xcoms[("submit", "state")]
    assert again["workflow"] == f"{plan['job_id']}-s1" and again["segment"] == 1
    assert again["units"] == 2 and again["priority_class"] == "qosflow-high"
    assert again["resumed_from"] == stopped_at
    assert len(fake_cluster.requests) == 2  # s0 and s1: nothing new


def test_a_retried_finish_follows_the_job_to_its_newest_segment(fake_cluster: Any) -> None:
    """A failed finish try's state is gone; the cluster's segments say where the job went."""
    from qosflow_airflow.restart import checkpoint_pause, newest_segment

    st = _running_state(fake_cluster)  # the rounds' state: segment 0
    assert newest_segment(fake_cluster, st) == st  # nothing happened since
    fake_cluster.resize("nightly-s0", 2)  # a failed try resized it in place ...
    assert newest_segment(fake_cluster, st) == st.evolve(units=2)  # ... and the cluster says so
    fake_cluster.resize("nightly-s0", 1)
    first = _restart(fake_cluster, st)  # the finish step's first try restarted it ...
    moved = newest_segment(fake_cluster, st)
    assert (moved.workflow, moved.segment, moved.units) == ("nightly-s1", 1, 2)
    assert moved.priority_class == "qosflow-high" and not moved.paused
    for _ in range(3):
        fake_cluster.status("nightly-s1")
    paused = checkpoint_pause(fake_cluster, first.state, reason="t")  # ... and then paused it
    again = newest_segment(fake_cluster, st)
    assert again.paused and again.workflow == "nightly-s1"
    assert again.resumed_from == paused.resumed_from > 0  # the watch resumes it from there
