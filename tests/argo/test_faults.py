"""Fault injection on the local cluster: operations succeed within the retry budget or fail
clearly, and a segment never gets a second workflow."""

from __future__ import annotations

import random

import pytest

from qosflow.core.cluster import Phase, ResizeState
from qosflow.core.errors import ClusterError
from qosflow.local import FaultRule
from qosflow_argo.argo_cluster import ArgoCluster
from qosflow_argo.retry import RetryPolicy

from .conftest import Target

CREATE = r"^/api/v1/workflows/qosflow$"


class Sleeps:
    """Records every wait of the client and moves the virtual clock by it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.target.clock.advance(seconds)


def client(t: Target, sleeps: Sleeps, **policy: float) -> ArgoCluster:
    return t.make(sleep=sleeps, retry=RetryPolicy(**policy), rng=random.Random(11))  # type: ignore[arg-type]


def test_5xx_and_429_are_retried_honouring_retry_after(local_target: Target) -> None:
    t = local_target
    req = t.request("flaky")
    t.cluster.submit(req)
    path = rf"^/api/v1/workflows/qosflow/{req.name}$"
    t.local.faults.add(FaultRule("status", "GET", path, "argo", status=500, count=2))
    t.local.faults.add(FaultRule("status", "GET", path, "argo", status=503, retry_after=2.0))
    t.local.faults.add(FaultRule("status", "GET", path, "argo", status=429, retry_after=3.0))
    sleeps = Sleeps(t)
    status = client(t, sleeps).status(req.name)
    assert status.name == req.name
    assert t.local.faults.fired[-3:] == [2, 1, 1]
    assert len(sleeps.waits) == 4 and sleeps.waits[2] >= 2.0 and sleeps.waits[3] >= 3.0


def test_connection_dropped_after_create_is_recovered_without_a_duplicate(
    local_target: Target,
) -> None:
    # the server stores the workflow, then the connection dies: the caller "crashed" before
    # recording it; the retried create gets 409 and adopts the stored workflow
    t = local_target
    t.local.faults.add(FaultRule("drop_after", "POST", CREATE, "argo"))
    req = t.request("dropped")
    status = client(t, Sleeps(t)).submit(req)
    assert status.name == req.name and t.local.faults.fired[-1] == 1
    assert [s.name for s in t.cluster.list_jobs(req.job)] == [req.name]
    # a later submit of the same segment (the caller restarting) finds it too
    assert t.cluster.submit(req).name == req.name
    assert len(t.cluster.list_jobs(req.job)) == 1


def test_connection_dropped_before_handling_is_retried(local_target: Target) -> None:
    t = local_target
    t.local.faults.add(FaultRule("drop", "POST", CREATE, "argo", count=2))
    req = t.request("reset")
    assert client(t, Sleeps(t)).submit(req).phase in (Phase.PENDING, Phase.RUNNING)
    assert t.local.faults.fired[-1] == 2
    assert len(t.cluster.list_jobs(req.job)) == 1


def test_slow_create_times_out_and_the_retry_never_duplicates(local_target: Target) -> None:
    t = local_target
    t.local.faults.add(FaultRule("delay", "POST", CREATE, "argo", delay_s=1.0))
    req = t.request("slow")
    status = client(t, Sleeps(t), timeout_s=0.3).submit(req)
    assert status.name == req.name
    t.local.wait_until(lambda: t.local.faults.fired[-1] == 1, timeout_s=10)
    assert len(t.cluster.list_jobs(req.job)) == 1


def test_persistent_5xx_fails_clearly_within_the_budget(local_target: Target) -> None:
    t = local_target
    t.local.faults.add(FaultRule("status", "POST", CREATE, "argo", status=503, count=None))
    sleeps = Sleeps(t)
    req = t.request("down")
    with pytest.raises(ClusterError) as err:
        client(t, sleeps, budget_s=20.0, attempts=50).submit(req)
    assert err.value.retryable and err.value.status == 503
    assert "POST /api/v1/workflows/qosflow: gave up after" in str(err.value)
    assert sum(sleeps.waits) <= 20.0
    assert t.cluster.list_jobs(req.job) == []


def test_an_outage_longer_than_six_tries_is_ridden_out_within_the_time_budget(
    local_target: Target,
) -> None:
    # ten 503s in a row: more tries than the old count of six allowed, far less than 60 s
    t = local_target
    t.local.faults.add(FaultRule("status", "POST", CREATE, "argo", status=503, count=10))
    sleeps = Sleeps(t)
    req = t.request("outage")
    status = client(t, sleeps).submit(req)
    assert status.name == req.name and t.local.faults.fired[-1] == 10
    assert len(sleeps.waits) == 10 and sum(sleeps.waits) <= 60.0
    assert [s.name for s in t.cluster.list_jobs(req.job)] == [req.name]


def test_a_segment_that_fails_after_training_for_long_is_still_retried(
    local_target: Target,
) -> None:
    # the pod trains 400 s (longer than the old maxDuration of 5 minutes), then crashes: the
    # template's retryStrategy starts another attempt, bounded by the workflow's deadline
    from qosflow.local import Script

    t = local_target
    req = t.request("longfail", total_steps=1000)
    t.runner.by_workflow = {req.name: Script(fail_at_step=400)}
    cluster = t.cluster
    cluster.submit(req)

    def attempts() -> list[str]:
        return [p for p, proc in t.runner.launched.items() if proc.spec.workflow == req.name]

    t.wait(cluster, req.name, lambda s: len(attempts()) >= 2, step_s=10.0, timeout_s=900.0)
    assert cluster.status(req.name).phase is Phase.RUNNING  # retried, not failed
    wf = cluster.argo.get_workflow(req.name)
    assert wf["spec"]["activeDeadlineSeconds"] >= 3600  # the bound: deadline + grace


def test_4xx_is_not_retried(local_target: Target) -> None:
    t = local_target
    t.local.faults.add(
        FaultRule("status", "GET", r"^/api/v1/workflows/qosflow$", "argo", status=403)
    )
    sleeps = Sleeps(t)
    with pytest.raises(ClusterError) as err:
        client(t, sleeps).list_jobs()
    assert err.value.status == 403 and not err.value.retryable and sleeps.waits == []


def test_kubernetes_faults_during_resize_and_stop_are_retried(local_target: Target) -> None:
    t = local_target
    req = t.request("kfault", total_steps=10_000)
    cluster = client(t, Sleeps(t))
    cluster.submit(req)
    t.wait(cluster, req.name, lambda s: s.pod_name is not None and (s.steps_done or 0) > 0)
    t.local.faults.add(FaultRule("status", "PATCH", r"/resize$", "kube", status=503, count=1))
    t.local.faults.add(FaultRule("drop", "GET", r"/pods/", "kube", count=1))
    t.local.faults.add(FaultRule("status", "PUT", r"/stop$", "argo", status=500, count=1))
    assert cluster.resize(req.name, 2).state is ResizeState.DONE
    before = cluster.status(req.name)
    assert before.phase is Phase.RUNNING and before.steps_done is not None
    stopped = cluster.stop(req.name)
    assert stopped.phase is Phase.STOPPED
    assert t.local.faults.fired[-3:] == [1, 1, 1]
    # a retried stop loses no progress: what was reported before it is still there after it
    assert stopped.steps_done is not None and stopped.steps_done >= before.steps_done > 0
