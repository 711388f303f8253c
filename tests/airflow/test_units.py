"""Fast tests of the provider without a cluster: packaging, hook, state, watch, branch, restart."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from unittest import mock

import pytest

from qosflow.core.cluster import JobStatus, Phase
from qosflow.core.errors import ClusterError, SpecError
from qosflow.core.spec import load_job

T0 = 1_800_000_000.0


CKPT = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "qosflow-checkpoints"}}


def job(**over):
    data = {
        "name": "unit-job",
        "total_steps": 400,
        "deadline": "PT10M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "image": "registry.example/trainer:1",
        "pod": {"volumes": [CKPT]},
        "checkpoint": {"volume": "ckpt"},
        "dwell_seconds": 10,
        "margin_seconds": 5,
    }
    data.update(over)
    return data


def spec(**over):
    return load_job(job(**over), now=datetime.fromtimestamp(T0, UTC))


def state(**over):
    from qosflow_airflow.state import TrainingState, job_to_dict

    base = dict(
        job=job_to_dict(spec()),
        workflow="unit-job-s0",
        segment=0,
        units=1,
        priority_class="qosflow-normal",
        priority=10,
        guaranteed=True,
        checkpoint_dir="/var/lib/qosflow/checkpoints/x",
    )
    base.update(over)
    return TrainingState(**base)


# ------------------------------------------------------------------ packaging and connection


def test_provider_registers_the_connection_type_and_hook():
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    assert "qosflow" in pm.providers
    hook = pm.hooks["qosflow_argo"]
    assert hook is not None
    assert hook.hook_class_name == "qosflow_airflow.hooks.argo.QosflowArgoHook"
    assert hook.connection_id_attribute_name == "qosflow_conn_id"


def test_connection_fields_become_a_cluster_config(monkeypatch):
    from qosflow_airflow.hooks.argo import QosflowArgoHook

    conn = {
        "conn_type": "qosflow_argo",
        "host": "https://argo.example:2746/",
        "password": "s3cret",
        "extra": {
            "namespace": "ml",
            "kube_url": "https://k8s.example:6443",
            "verify_ssl": "false",
            "ca_cert": "/etc/ca.pem",
            "history_url": "postgresql+psycopg://u@db/qosflow",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_TEST", json.dumps(conn))
    config = QosflowArgoHook("qosflow_test").config
    assert config.argo_url == "https://argo.example:2746"
    assert config.namespace == "ml"
    assert config.token == "s3cret"
    assert config.kube_url == "https://k8s.example:6443"
    assert config.verify_ssl is False
    assert config.ca_cert == "/etc/ca.pem"
    assert config.history_url == "postgresql+psycopg://u@db/qosflow"


def test_connection_defaults_and_bad_fields_name_the_field():
    from qosflow_airflow.hooks.argo import config_from_connection

    config = config_from_connection(host="argo:2746", password=None, extra=None)
    assert config.argo_url == "https://argo:2746"
    assert config.namespace == "qosflow"
    assert config.history_url.startswith("sqlite:///")
    with pytest.raises(SpecError) as err:
        config_from_connection(host="h", password=None, extra={"verify_ssl": "maybe"})
    assert err.value.field == "extra.verify_ssl"
    with pytest.raises(SpecError) as err:
        config_from_connection(host="", password=None, extra=None)
    assert err.value.field == "host"


def test_hook_init_is_cheap_and_builds_an_argo_cluster(monkeypatch):
    from qosflow_airflow.hooks.argo import QosflowArgoHook

    hook = QosflowArgoHook("does_not_exist")  # no lookup yet
    assert hook.qosflow_conn_id == "does_not_exist"
    monkeypatch.setenv(
        "AIRFLOW_CONN_QOSFLOW_X",
        json.dumps(
            {
                "conn_type": "qosflow_argo",
                "host": "http://127.0.0.1:9",
                "password": "t",
                "extra": {"kube_url": "http://127.0.0.1:9"},
            }
        ),
    )
    cluster = QosflowArgoHook("qosflow_x").get_cluster()
    assert type(cluster).__name__ == "ArgoCluster"
    assert cluster.namespace == "qosflow"


# ------------------------------------------------------------------ state


def test_job_spec_survives_the_xcom_round_trip():
    from qosflow_airflow.state import TrainingState, job_from_dict, job_to_dict

    original = spec(resources={"unit": "cpu", "min": 1, "max": 4, "levels": [1, 2, 4]})
    again = job_from_dict(json.loads(json.dumps(job_to_dict(original))))
    assert again == original
    st = state(last_rescale_at=T0 + 5)
    assert TrainingState.from_dict(json.loads(json.dumps(st.to_dict()))) == st


def test_an_edited_xcom_cannot_smuggle_in_an_invalid_spec():
    from qosflow_airflow.state import job_from_dict, job_to_dict

    data = job_to_dict(spec())
    data["resources"]["min"] = 0
    with pytest.raises(SpecError) as err:
        job_from_dict(data)
    assert err.value.field == "resources.min"


# ------------------------------------------------------------------ deadline parsing


def test_clock_deadline_is_the_next_such_time_in_the_dag_timezone():
    import pendulum

    from qosflow_airflow.operators.plan import resolve_deadline

    tz = pendulum.timezone("Europe/Amsterdam")
    one_am = datetime(2026, 6, 1, 23, 0, tzinfo=UTC)  # 01:00 in Amsterdam (CEST)
    assert resolve_deadline("06:00", now=one_am, tz=tz) == "2026-06-02T04:00:00+00:00"
    seven_am = datetime(2026, 6, 2, 5, 0, tzinfo=UTC)  # 07:00 local: tomorrow's 06:00
    assert resolve_deadline("06:00", now=seven_am, tz=tz) == "2026-06-03T04:00:00+00:00"
    assert resolve_deadline(" PT3M ", now=one_am, tz=tz) == "PT3M"


def test_bad_job_input_fails_without_retry_naming_the_field(fake_cluster):
    from airflow.sdk.exceptions import AirflowFailException

    from qosflow_airflow.operators.plan import PlanTrainingOperator

    op = PlanTrainingOperator(task_id="plan", job=job(total_steps=0))
    with pytest.raises(AirflowFailException, match=r"total_steps: must be >= 1"):
        op.execute({"ti": mock.MagicMock(), "dag": None})
    op = PlanTrainingOperator(task_id="plan", job=job(), initial_units="3")
    with pytest.raises(AirflowFailException, match=r"initial_units: must be one of \[1, 2\]"):
        op.execute({"ti": mock.MagicMock(), "dag": None})


def test_a_gpu_job_on_a_cluster_without_gpus_is_told_so_and_nothing_is_submitted(fake_cluster):
    from airflow.sdk.exceptions import AirflowFailException

    from qosflow_airflow.operators.plan import PlanTrainingOperator

    fake_cluster.capacity_units = 0
    spec = job()
    spec["resources"] = {**spec["resources"], "unit": "gpu"}
    op = PlanTrainingOperator(task_id="plan", job=spec)
    with pytest.raises(AirflowFailException, match=r"resources.unit: no node .* offers a GPU"):
        op.execute({"ti": mock.MagicMock(), "dag": None})
    assert fake_cluster.requests == []


def test_a_job_that_would_checkpoint_onto_the_pods_own_disk_is_refused_at_plan(
    fake_cluster, monkeypatch, tmp_path
):
    """Without a checkpoint volume (none in the spec, none on the connection) a checkpoint-restart
    would start from step 0: the plan step refuses, before any promise, board row or submit."""
    from airflow.sdk.exceptions import AirflowFailException

    from qosflow.store.board import JobBoard
    from qosflow.store.history import HistoryStore
    from qosflow_airflow.operators.plan import PlanTrainingOperator

    bare = {
        "conn_type": "qosflow_argo",
        "host": "http://127.0.0.1:1",
        "extra": {"history_url": f"sqlite:///{tmp_path}/bare.db", "image": "registry.example/t:1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_DEFAULT", json.dumps(bare))
    spec = {k: v for k, v in job().items() if k not in ("pod", "checkpoint")}
    op = PlanTrainingOperator(task_id="plan", job=spec)
    with pytest.raises(AirflowFailException, match=r"checkpoint: is required.*pod's own disk"):
        op.execute(_ctx("r-disk"))
    store = HistoryStore(f"sqlite:///{tmp_path}/bare.db")
    try:  # no promise, no board row
        with store.promise_ledger(fake_cluster.clock) as ledger:
            assert ledger.pending("cpu") == {}
        with JobBoard(store, "qosflow").session(fake_cluster.clock) as board:
            assert board.entries("cpu") == []
    finally:
        store.close()
    scratch = {**job(), "pod": {"volumes": [{"name": "ckpt", "emptyDir": {}}]}}
    with pytest.raises(AirflowFailException, match=r"checkpoint.volume: 'ckpt' cannot hold"):
        PlanTrainingOperator(task_id="plan", job=scratch).execute(_ctx("r-scratch"))
    assert fake_cluster.requests == []
    # with the connection's claim the same spec plans, and its segment mounts the claim
    plan = PlanTrainingOperator(task_id="plan", job=spec)
    monkeypatch.setenv(
        "AIRFLOW_CONN_QOSFLOW_DEFAULT",
        json.dumps({**bare, "extra": {**bare["extra"], "checkpoint_claim": "shared"}}),
    )
    assert plan.execute(_ctx("r-claim"))["job"]["checkpoint"]["volume"] == "qosflow-checkpoints"


@pytest.mark.parametrize(
    ("nodes", "verdict"),
    [({"a": 8, "b": 8, "c": 0}, "guaranteed"), ({"a": 8, "b": 4, "c": 4}, "best_effort")],
)
def test_a_16_gpu_job_is_guaranteed_only_when_two_nodes_worth_of_gpus_are_free(
    fake_cluster, nodes, verdict
):
    """16 GPUs on 8-GPU nodes are two pods of 8: 16 free GPUs spread 8 + 4 + 4 cannot hold them."""
    from qosflow_airflow.operators.plan import PlanTrainingOperator

    fake_cluster.capacity_units, fake_cluster.nodes = 16, nodes
    spec = job(
        name="ddp",
        deadline="PT2H",
        launcher="torchrun",
        resources={"unit": "gpu", "min": 16, "max": 32, "levels": [16, 32], "per_node": 8},
        step_seconds_estimate=1.0,
    )
    plan = PlanTrainingOperator(task_id="plan", job=spec).execute(_ctx(f"r-{verdict}"))
    assert plan["verdict"] == verdict, plan["reason"]


# ------------------------------------------------------------------ branch


def test_each_action_maps_to_its_configured_task():
    from airflow.sdk.exceptions import AirflowFailException

    from qosflow_airflow.operators.branch import branch_for

    branches = {
        "done": "g.done",
        "on_track": "g.continue",
        "scale_up": "g.rescale",
        "scale_down": "g.rescale",
        "bump": "g.bump",
        "at_risk": "g.bump",
    }
    for action, task_id in branches.items():
        assert branch_for({"action": action}, branches) == task_id
    at_risk = {"action": "at_risk", "units": 2}
    assert branch_for(at_risk, branches, current_units=1) == "g.rescale"
    assert branch_for(at_risk, branches, current_units=2) == "g.bump"
    # above the throughput knee a smaller size is faster: at risk follows the target down too
    assert branch_for({"action": "at_risk", "units": 1}, branches, current_units=2) == "g.rescale"
    assert branch_for({"action": "at_risk", "units": 1}, branches) == "g.bump"  # no current size
    with pytest.raises(AirflowFailException, match="unknown action"):
        branch_for({"action": "panic"}, branches)
    with pytest.raises(AirflowFailException, match="no branch configured"):
        branch_for({"action": "bump"}, {"done": "g.done"})


def test_branch_keys_are_exactly_the_core_actions():
    from qosflow.core.decide import Action
    from qosflow_airflow.operators.branch import ACTIONS, DeadlineBranchOperator

    assert set(ACTIONS) == {a.value for a in Action}
    with pytest.raises(ValueError, match="unknown actions"):
        DeadlineBranchOperator(task_id="b", watch_task_id="w", branches={"panik": "x"})


def test_the_branch_operator_rescales_down_when_at_risk_with_a_smaller_target():
    from qosflow_airflow.operators.branch import DeadlineBranchOperator

    op = DeadlineBranchOperator(
        task_id="decide",
        watch_task_id="w",
        branches={"at_risk": "g.bump", "scale_up": "g.up", "scale_down": "g.down"},
    )
    event = {"decision": {"action": "at_risk", "units": 2}, "units": 4}
    assert op.choose_branch({"ti": _ti({("w", "return_value"): event})}) == "g.down"
    event = {"decision": {"action": "at_risk", "units": 4}, "units": 4}
    assert op.choose_branch({"ti": _ti({("w", "return_value"): event})}) == "g.bump"


# ------------------------------------------------------------------ admission and job ids


def _ctx(run_id, xcoms=None):
    ti = _ti(dict(xcoms or {}))
    return {"ti": ti, "dag": None, "run_id": run_id}


def _plan(name, deadline, run_id, **over):
    from qosflow_airflow.operators.plan import PlanTrainingOperator

    data = job(name=name, deadline=deadline, step_seconds_estimate=1.0)
    data.update(over)
    return PlanTrainingOperator(task_id="plan", job=data).execute(_ctx(run_id))


def _submit(plan, run_id):
    from qosflow_airflow.operators.plan import SubmitTrainingOperator

    ctx = _ctx(run_id, {("plan", "return_value"): plan})
    return SubmitTrainingOperator(task_id="submit", plan_task_id="plan").execute(ctx)


def test_plan_admits_against_the_jobs_already_guaranteed_on_the_cluster(fake_cluster):
    from airflow.sdk.exceptions import AirflowFailException

    alone = _plan("first", "PT10M", "r1")
    assert alone["verdict"] == "guaranteed" and alone["admitted"] == []
    first = _plan("first", "PT10M", "r1")  # a retried plan: its own promise does not count
    assert first["verdict"] == "guaranteed" and first["units"] == 2
    assert first["job_id"] == alone["job_id"]
    _submit(first, "r1")
    block = json.loads(fake_cluster.requests[0].plan)["admission"]
    assert block["kind"] == "guaranteed" and block["total_steps"] == 400
    assert block["levels"] == [1, 2] and len(block["step_time"]) == 2
    second = _plan("second", "PT10M", "r2")  # fits alone, not next to "first"
    assert second["admitted"] == [first["job_id"]]
    assert second["verdict"] == "best_effort"
    deadline = datetime.fromisoformat(second["job"]["deadline"]).timestamp()
    assert second["counter_offer"] > deadline
    with pytest.raises(AirflowFailException, match=r"rejected at admission.*counter-offer"):
        _plan("second", "PT10M", "r3", if_not_guaranteed="reject")
    later = _plan("second", "PT30M", "r4")  # a later deadline fits next to it
    assert later["verdict"] == "guaranteed"


def test_two_plans_before_either_is_submitted_cannot_both_be_guaranteed(fake_cluster):
    """Two DAGs plan at the same instant: the first promise is in the ledger, not yet on the
    cluster, and still counts; a promise whose workflow never appears lapses after its TTL."""
    from qosflow.store.ledger import PROMISE_TTL_S

    first = _plan("first", "PT10M", "r1")
    assert first["verdict"] == "guaranteed" and not fake_cluster.requests
    second = _plan("second", "PT10M", "r2")
    assert second["admitted"] == [first["job_id"]]
    assert second["verdict"] == "best_effort"
    fake_cluster.clock += PROMISE_TTL_S + 1.0  # first's submit never ran
    third = _plan("second", "PT10M", "r3")
    assert third["admitted"] == [] and third["verdict"] == "guaranteed"


def test_best_effort_and_finished_jobs_reserve_nothing(fake_cluster):
    from dataclasses import replace

    first = _plan("first", "PT10M", "r1")
    _submit(first, "r1")
    best = _plan("third", "PT10M", "r3")  # next to "first": best effort
    assert best["verdict"] == "best_effort"
    _submit(best, "r3")
    assert json.loads(fake_cluster.requests[1].plan)["admission"]["kind"] == "best_effort"
    wf = f"{first['job_id']}-s0"
    fake_cluster.jobs[wf] = replace(fake_cluster.jobs[wf], phase=Phase.SUCCEEDED)
    again = _plan("second", "PT10M", "r4")
    assert again["admitted"] == [] and again["verdict"] == "guaranteed", again["reason"]


def test_each_run_gets_its_own_workflows_and_a_retried_submit_reattaches(fake_cluster):
    first = _plan("ctr-nightly", "PT10M", "scheduled__1")
    second = _plan("ctr-nightly", "PT20M", "scheduled__2")
    assert first["job_id"] != second["job_id"]
    assert first["job_id"].startswith("ctr-nightly-")
    a = _submit(first, "scheduled__1")
    b = _submit(second, "scheduled__2")
    assert a["workflow"] == f"{first['job_id']}-s0" != b["workflow"]
    assert _submit(first, "scheduled__1")["workflow"] == a["workflow"]  # a retry: same workflow
    assert len(fake_cluster.requests) == 2
    assert {r.checkpoint_dir.rsplit("/", 1)[-1] for r in fake_cluster.requests} == {
        first["job_id"],
        second["job_id"],
    }
    long = _plan("x" * 63, "PT20M", "scheduled__3")
    assert len(long["job_id"]) <= 59  # room for "-s99": a workflow name is a label value
    assert len(_submit(long, "scheduled__3")["workflow"]) <= 63


# ------------------------------------------------------------------ task group structure


def test_task_group_wires_rounds_with_trigger_rules():
    import pendulum
    from airflow.sdk import DAG

    from qosflow_airflow.task_group import deadline_training

    with DAG("tg", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        deadline_training(job(), rounds=2, group_id="t")
    ids = set(dag.task_ids)
    for k in (1, 2):
        for t in ("watch", "decide", "rescale", "bump", "continue", "done"):
            assert f"t.round_{k}.{t}" in ids
    assert dag.get_task("t.submit").upstream_task_ids == {"t.plan"}
    w2 = dag.get_task("t.round_2.watch")
    assert w2.upstream_task_ids == {"t.round_1.rescale", "t.round_1.bump", "t.round_1.continue"}
    assert w2.trigger_rule == "none_failed_min_one_success"
    finish = dag.get_task("t.finish")
    assert finish.trigger_rule == "all_done"
    assert finish.upstream_task_ids == {
        "t.round_1.done",
        "t.round_2.done",
        "t.round_2.rescale",
        "t.round_2.bump",
        "t.round_2.continue",
    }
    assert dag.get_task("t.round_1.decide").downstream_task_ids == {
        "t.round_1.rescale",
        "t.round_1.bump",
        "t.round_1.continue",
        "t.round_1.done",
    }
    # newest state first: round 2 acts read round 1's acts before the submit
    assert dag.get_task("t.round_2.rescale").state_task_ids == [
        "t.round_1.rescale",
        "t.round_1.bump",
        "t.submit",
    ]
    assert dag.get_task("t.plan").retries == 0
    with pytest.raises(ValueError, match="rounds"):
        deadline_training(job(), rounds=0)


# ------------------------------------------------------------------ watch


def status(phase=Phase.RUNNING, steps=0, units=1, **kw):
    return JobStatus("unit-job-s0", "unit-job", 0, phase, steps, 400, units, **kw)


def test_watch_reports_a_decision_only_after_it_held_for_the_dwell_time():
    from qosflow_airflow.watch import Watcher

    w = Watcher(spec=spec(deadline="PT4M"), workflow="unit-job-s0", hold_s=10.0)
    events = []
    for i in range(12):  # 1 step/s on 1 unit: 400 steps need ~400 s > 240 s
        events.append(w.observe(status(steps=5 * i), now=T0 + 5 * i, free_units=1))
    first = next(i for i, e in enumerate(events) if e is not None)
    ev = events[first]
    assert ev.status == "decision"
    assert ev.decision.action.value in {"scale_up", "at_risk", "bump"}
    assert ev.time - w.held_since >= 10.0
    assert ev.to_dict()["units"] == 1  # the branch compares the target with it
    assert len(ev.samples) == first + 1


def test_watch_ends_with_the_pod_message_when_the_workflow_fails():
    from qosflow_airflow.watch import Watcher

    w = Watcher(spec=spec(), workflow="unit-job-s0", hold_s=1e9)
    assert w.observe(status(steps=3), now=T0, free_units=1) is None
    ev = w.observe(status(Phase.FAILED, steps=5, message="OOMKilled"), now=T0 + 5, free_units=1)
    assert ev.status == "failed"
    assert "OOMKilled" in ev.message
    from qosflow_airflow.watch import EndWatch

    done = EndWatch(spec=spec(), workflow="unit-job-s0")
    ev = done.observe(
        status(Phase.SUCCEEDED, steps=400, finished_at=T0 + 9), now=T0 + 10, free_units=1
    )
    assert ev.status == "done" and ev.finished_at == T0 + 9
    assert ev.decision.action.value == "done"


# ------------------------------------------------------------------ trigger idiom


def test_trigger_serialises_to_an_equal_trigger():
    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    t = DeadlineProgressTrigger(
        state=state().to_dict(), samples=[[T0, 3, 1]], poll_interval=0.0, hold_seconds=4.0
    )
    path, kwargs = t.serialize()
    assert path == "qosflow_airflow.triggers.progress.DeadlineProgressTrigger"
    json.dumps(kwargs)
    assert DeadlineProgressTrigger(**kwargs).serialize() == (path, kwargs)


def _sensor(**kw):
    from qosflow_airflow.sensors.progress import DeadlineProgressSensor

    return DeadlineProgressSensor(
        task_id="watch", state_task_ids=["submit"], poll_interval=0.0, **kw
    )


def _ti(xcoms):
    ti = mock.MagicMock()
    ti.xcom_pull.side_effect = lambda task_ids, key="return_value": xcoms.get((task_ids, key))
    return ti


def _defer_and_run(sensor, context):
    from airflow.sdk.exceptions import TaskDeferred

    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    assert deferred.value.method_name == "execute_complete"
    _path, kwargs = deferred.value.trigger.serialize()
    trigger = DeadlineProgressTrigger(**json.loads(json.dumps(kwargs)))  # a new triggerer
    return asyncio.run(trigger.run().asend(None))


def test_defer_serialise_run_execute_complete_done(fake_cluster):
    fake_cluster.submit(
        __import__("qosflow_airflow.restart", fromlist=["x"]).submit_request(
            state(), segment=0, resume=False
        )
    )
    fake_cluster.rate = 10.0  # 400 steps in 40 s of fake time: far ahead, finishes
    sensor = _sensor(hold_seconds=1e9)
    context = {"ti": _ti({("submit", "state"): state().to_dict()})}
    event = _defer_and_run(sensor, context)
    assert event.payload["status"] == "done"
    result = sensor.execute_complete(context, event.payload)
    assert result["decision"]["action"] == "done"
    assert result["workflow"] == "unit-job-s0"


def test_failed_pod_fails_the_sensor_with_the_pod_message_and_nothing_resubmits(fake_cluster):
    from airflow.sdk.exceptions import AirflowFailException

    from qosflow_airflow.restart import submit_request

    fake_cluster.submit(submit_request(state(), segment=0, resume=False))
    fake_cluster.fail_at_step = 20
    sensor = _sensor()
    context = {"ti": _ti({("submit", "state"): state().to_dict()})}
    event = _defer_and_run(sensor, context)
    with pytest.raises(AirflowFailException, match="OOMKilled"):
        sensor.execute_complete(context, event.payload)
    assert len(fake_cluster.requests) == 1


def test_a_trigger_never_fires_sooner_than_its_settle_time(fake_cluster, monkeypatch):
    """apache/airflow#72716: a trigger that fires at once can get its task failed."""
    from qosflow_airflow.restart import submit_request
    from qosflow_airflow.triggers import progress

    fake_cluster.submit(submit_request(state(), segment=0, resume=False))
    fake_cluster.rate = 10.0  # done at the first poll
    waited: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waited.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(progress.asyncio, "sleep", sleep)
    monkeypatch.setattr(progress, "SETTLE_S", 30.0)  # the production default, made long
    t = progress.DeadlineProgressTrigger(state=state().to_dict(), poll_interval=0.0)
    event = asyncio.run(t.run().asend(None))
    assert event.payload["status"] == "done"
    assert waited and 25.0 < max(waited) <= 30.0  # it waited out the rest before firing
    waited.clear()
    quick = progress.DeadlineProgressTrigger(
        state=state().to_dict(), poll_interval=0.0, settle_seconds=0.0
    )
    assert asyncio.run(quick.run().asend(None)).payload["status"] == "done"
    assert not [w for w in waited if w > 0]


def test_cluster_errors_end_the_trigger_with_an_error_event(fake_cluster):
    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    t = DeadlineProgressTrigger(state=state(workflow="missing-s0").to_dict(), poll_interval=0.0)
    event = asyncio.run(t.run().asend(None))
    assert event.payload["status"] == "error"
    assert "missing-s0" in event.payload["message"]


def test_poke_mode_uses_the_same_watch(fake_cluster):
    from qosflow_airflow.restart import submit_request

    fake_cluster.submit(submit_request(state(), segment=0, resume=False))
    fake_cluster.rate = 10.0
    sensor = _sensor(deferrable=False, hold_seconds=1e9)
    context = {"ti": _ti({("submit", "state"): state().to_dict()})}
    results = [sensor.poke(context) for _ in range(12)]
    done = [r for r in results if r.is_done]
    assert done and done[0].xcom_value["status"] == "done"


# ------------------------------------------------------------------ checkpoint-restart


def test_restart_stops_before_resubmitting_and_resumes_from_the_checkpoint(fake_cluster):
    from qosflow_airflow.restart import checkpoint_restart, submit_request

    st = state()
    fake_cluster.submit(submit_request(st, segment=0, resume=False))
    for _ in range(4):
        fake_cluster.status(st.workflow)
    r = checkpoint_restart(
        fake_cluster, st, units=2, priority_class="qosflow-high", priority=20, reason="test"
    )
    assert r.state.workflow == "unit-job-s1" and r.state.units == 2
    assert r.resumed_from == fake_cluster.jobs["unit-job-s0"].steps_done > 0
    assert fake_cluster.requests[-1].resume is True
    running = [s for s in fake_cluster.list_jobs("unit-job") if not s.phase.finished]
    assert [s.name for s in running] == ["unit-job-s1"]
    again = checkpoint_restart(
        fake_cluster, st, units=2, priority_class="qosflow-high", priority=20, reason="retry"
    )
    assert again.status.name == "unit-job-s1"
    assert len(fake_cluster.requests) == 2  # the retry re-attached


def test_restart_refuses_a_stale_checkpoint(fake_cluster):
    from dataclasses import replace

    from qosflow_airflow.restart import checkpoint_restart, submit_request

    st = state()
    fake_cluster.submit(submit_request(st, segment=0, resume=False))
    fake_cluster.status(st.workflow)
    stale = replace(fake_cluster.jobs[st.workflow], phase=Phase.STOPPED, steps_done=1)
    with (
        mock.patch.object(fake_cluster, "stop", return_value=stale),
        pytest.raises(ClusterError, match="stale checkpoint"),
    ):
        checkpoint_restart(fake_cluster, st, units=2, priority_class="x", priority=1, reason="t")
    assert len(fake_cluster.requests) == 1


def test_a_stop_that_ends_failed_still_resumes_from_its_checkpoint(fake_cluster):
    from dataclasses import replace

    from qosflow_airflow.restart import checkpoint_restart, submit_request

    st = state()
    fake_cluster.submit(submit_request(st, segment=0, resume=False))
    for _ in range(3):
        fake_cluster.status(st.workflow)

    def stop_ends_failed(name, *, message=""):  # the pod exits 143 after its SIGTERM checkpoint
        fake_cluster.jobs[name] = replace(
            fake_cluster.jobs[name], phase=Phase.FAILED, message="exit code 143"
        )
        return fake_cluster.jobs[name]

    with mock.patch.object(fake_cluster, "stop", side_effect=stop_ends_failed):
        r = checkpoint_restart(
            fake_cluster, st, units=2, priority_class="x", priority=1, reason="t"
        )
    assert r.resumed_from == fake_cluster.jobs[st.workflow].steps_done > 0
    assert r.state.workflow == "unit-job-s1" and not r.finished
    assert fake_cluster.requests[-1].resume is True and len(fake_cluster.requests) == 2
    assert fake_cluster.status("unit-job-s1").steps_done >= r.resumed_from


def test_a_stop_that_ends_failed_without_progress_raises_and_resubmits_nothing(fake_cluster):
    from dataclasses import replace

    from qosflow_airflow.restart import checkpoint_restart, submit_request

    st = state()
    fake_cluster.submit(submit_request(st, segment=0, resume=False))
    running = replace(fake_cluster.jobs[st.workflow], phase=Phase.RUNNING, steps_done=None)
    failed = replace(running, phase=Phase.FAILED, message="CrashLoop")
    with (
        mock.patch.object(fake_cluster, "status", return_value=running),
        mock.patch.object(fake_cluster, "stop", return_value=failed),
        pytest.raises(ClusterError, match=r"no usable checkpoint.*CrashLoop"),
    ):
        checkpoint_restart(fake_cluster, st, units=2, priority_class="x", priority=1, reason="t")
    assert len(fake_cluster.requests) == 1


# ------------------------------------------------------------------ report


def test_report_has_a_verdict_table_and_a_labelled_plot(tmp_path):
    from qosflow.core.speed import ProgressSample
    from qosflow_airflow.report import Mark, Report

    samples = [
        ProgressSample(T0 + 10 * i, 10 * i * (1 if i < 5 else 2), 1 if i < 5 else 2)
        for i in range(12)
    ]
    report = Report(
        job="r",
        total_steps=180,
        start=T0,
        deadline=T0 + 130,
        finished_at=T0 + 110,
        succeeded=True,
        schedule=[(T0, 0), (T0 + 60, 80), (T0 + 125, 180)],
        samples=samples,
        marks=[
            Mark(T0 + 45, "scale_up", 2, "behind the schedule"),
            Mark(T0 + 46, "in_place", 2, "resized in place from 1 to 2 cpu"),
        ],
    )
    assert report.met and report.margin_s == 20
    assert report.verdict() == "r: deadline met, 20 s early"
    assert "behind the schedule" in report.table()
    fig = report.figure()
    ax = fig.axes[0]
    assert "deadline met" in ax.get_title()
    assert ax.get_xlabel() and ax.get_ylabel() and fig.axes[1].get_ylabel() == "size (units)"
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {
        "planned schedule (must be done by)",
        "actual progress",
        "deadline",
        "decision / action",
        "size (units)",
    } <= labels
    png = report.plot(tmp_path / "r.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    late = Report(
        job="r",
        total_steps=10,
        start=T0,
        deadline=T0 + 5,
        finished_at=T0 + 9,
        succeeded=True,
        schedule=[],
        samples=[],
        marks=[],
    )
    assert late.verdict() == "r: deadline MISSED, 4 s late" and not late.met


def test_the_watch_is_primed_with_the_sizes_its_key_history_measured(tmp_path):
    """new_watcher: the prior is the history's fit, and the sizes it was fitted on count as
    observed, so a run that has measured 1 CPU may plan 2 when earlier runs measured 2."""
    from qosflow.core.speed import ProgressSample
    from qosflow.store.history import HistoryStore
    from qosflow_airflow.triggers.progress import new_watcher

    url = f"sqlite:///{tmp_path}/history.db"
    key = spec().key
    store = HistoryStore(url)
    try:
        store.record_samples(key, "cpu", [ProgressSample(10.0 * i, 20 * i, 2) for i in range(30)])
    finally:
        store.close()
    primed = new_watcher(state(), history_url=url, hold_s=0.0)
    empty = new_watcher(state(), history_url="", hold_s=0.0)
    assert [m.units for m in primed.known] == [2] and primed.prior is not None
    assert empty.known == () and empty.prior is None


def test_a_timing_above_one_node_is_recorded_for_the_key_and_counts_for_its_next_job(
    fake_cluster, tmp_path
):
    """The first job was timed at 2 CPUs (two nodes of 1); the next, timed at 1, is planned on it.

    400 steps at 1 s on 1 CPU miss a 6-minute deadline; at 2 CPUs (0.55 s a step) they make
    it, but past one node a plan counts only on what was measured there.
    """
    from qosflow.store.history import HistoryStore
    from qosflow_airflow.state import job_to_dict
    from qosflow_airflow.triggers.progress import new_watcher

    fake_cluster.capacity_units = 4  # room for both jobs' promises
    cpus = {"unit": "cpu", "min": 1, "max": 2, "per_node": 1}
    alone = _plan("nightly", "PT6M", "r0", resources=cpus)
    assert alone["verdict"] != "guaranteed"  # nothing measured past one node yet

    timed = _plan(
        "nightly",
        "PT6M",
        "r1",
        resources=cpus,
        step_seconds_estimate=0.55,
        step_seconds_estimate_at=2,
    )
    assert timed["verdict"] == "guaranteed" and timed["units"] == 2
    store = HistoryStore(f"sqlite:///{tmp_path}/history.db")
    try:
        assert [(m.units, m.step_time) for m in store.timings("nightly", "cpu")] == [(2, 0.55)]
    finally:
        store.close()

    later = _plan("nightly", "PT6M", "r2", resources=cpus)  # timed at 1 CPU only
    assert later["verdict"] == "guaranteed" and later["units"] == 2
    watch = new_watcher(
        state(job=job_to_dict(spec(name="nightly", resources=cpus))),
        history_url=f"sqlite:///{tmp_path}/history.db",
        hold_s=0.0,
    )
    assert [(m.units, m.step_time) for m in watch.timings] == [(2, 0.55)]
