"""ArgoCluster contract suite: the same tests against the local cluster or a real Argo + Kubernetes."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from qosflow.core.cluster import Actuator, ClusterView, Phase, ResizeState
from qosflow.core.errors import ClusterError, NotFoundError, SpecError
from qosflow_argo import manifests
from qosflow_argo.argo_cluster import ArgoCluster

from .conftest import REAL, REAL_ENV, TOKEN, Target


@pytest.mark.realcluster
def test_real_cluster_is_configured() -> None:
    if not REAL:
        pytest.skip(f"set {', '.join(REAL_ENV)} to run the contract suite on a real cluster")
    cluster = ArgoCluster.from_env()
    assert cluster.capacity("cpu").total >= 1


def test_implements_the_cluster_protocols(target: Target) -> None:
    cluster = target.cluster
    assert isinstance(cluster, ClusterView) and isinstance(cluster, Actuator)
    assert TOKEN not in repr(cluster) and TOKEN not in repr(cluster.argo)
    assert TOKEN not in repr(cluster.kube)


def test_ensure_installed_is_idempotent(target: Target) -> None:
    again = target.cluster.ensure_installed()
    assert set(again.values()) == {"unchanged"}
    assert "WorkflowTemplate/qosflow-train" in again and "PriorityClass/qosflow-urgent" in again


def test_submit_runs_to_success_with_progress(target: Target) -> None:
    cluster = target.cluster
    req = target.request("ok", total_steps=20)
    first = cluster.submit(req)
    assert first.name == req.name and first.phase in (Phase.PENDING, Phase.RUNNING)
    running = target.wait(cluster, req.name, lambda s: (s.steps_done or 0) > 0)
    assert running.phase is Phase.RUNNING and running.total_steps == 20
    assert running.pod_name and running.units == 1 and running.started_at is not None
    done = target.wait(cluster, req.name, lambda s: s.phase.finished)
    assert done.phase is Phase.SUCCEEDED
    assert (done.steps_done, done.total_steps) == (20, 20)
    assert done.finished_at is not None and done.finished_at >= (running.started_at or 0)
    # every exchange was checked against swagger.json by the session hook
    assert any(e.startswith("POST /api/v1/workflows/") for e in target.exchanges)


def test_submit_twice_gives_one_workflow(target: Target) -> None:
    cluster = target.cluster
    req = target.request("twice")
    a = cluster.submit(req)
    b = cluster.submit(req)
    assert a.name == b.name == req.name
    assert [s.name for s in cluster.list_jobs(req.job)] == [req.name]


def test_a_reused_job_name_with_another_deadline_is_refused_not_adopted(target: Target) -> None:
    # the same job name on another night: same workflow name, new deadline
    cluster = target.cluster
    yesterday = target.request("nightly")
    cluster.submit(yesterday)
    tonight = replace(yesterday, deadline=yesterday.deadline + 86_400)
    with pytest.raises(ClusterError) as err:
        cluster.submit(tonight)
    assert err.value.status == 409 and not err.value.retryable
    text = str(err.value)
    assert yesterday.name in text
    assert manifests.deadline_text(yesterday.deadline) in text
    assert manifests.deadline_text(tonight.deadline) in text
    assert [s.name for s in cluster.list_jobs(yesterday.job)] == [yesterday.name]
    # other sizes or step counts are a different submit too
    for other in (replace(yesterday, units=2), replace(yesterday, total_steps=21)):
        with pytest.raises(ClusterError, match=yesterday.name) as again:
            cluster.submit(other)
        assert again.value.status == 409 and not again.value.retryable
    # a genuine retry of the same submit is adopted: still exactly one workflow
    assert cluster.submit(yesterday).name == yesterday.name
    assert len(cluster.list_jobs(yesterday.job)) == 1


def test_a_replanned_run_reattaches_and_another_run_is_refused(target: Target) -> None:
    """The plan annotation's run identity decides: the same run re-planned (another size, a
    deadline computed again) re-attaches; another run under the same name is refused."""
    import json

    cluster = target.cluster
    run = {"dag_id": "nightly", "run_id": "scheduled__2026-06-01", "map_index": -1}
    first = replace(target.request("replan"), plan=json.dumps({"run": run, "units": 1}))
    cluster.submit(first)
    replanned = replace(
        first,
        units=2,
        deadline=first.deadline + 120,
        plan=json.dumps({"run": run, "units": 2}),
    )
    assert cluster.submit(replanned).name == first.name  # re-attached, not refused
    assert [(s.name, s.units) for s in cluster.list_jobs(first.job)] == [(first.name, 1)]
    other = replace(first, plan=json.dumps({"run": {**run, "run_id": "scheduled__2026-06-02"}}))
    with pytest.raises(ClusterError, match="another run") as err:
        cluster.submit(other)
    assert err.value.status == 409 and not err.value.retryable
    assert "scheduled__2026-06-02" in str(err.value)
    assert len(cluster.list_jobs(first.job)) == 1


def test_name_taken_by_a_foreign_workflow_is_refused(target: Target) -> None:
    cluster = target.cluster
    req = target.request("owner")
    foreign = manifests.workflow(
        target.request("other"), namespace=cluster.namespace, now=cluster.now()
    )
    foreign["metadata"]["name"] = req.name  # someone else's workflow under our name
    cluster.argo.create_workflow(foreign)
    with pytest.raises(ClusterError, match="not segment 0 of job") as err:
        cluster.submit(req)
    assert err.value.status == 409


def test_list_jobs_filters_by_job_and_status_of_missing_is_not_found(target: Target) -> None:
    cluster = target.cluster
    a, b = target.request("lista"), target.request("listb")
    cluster.submit(a)
    cluster.submit(b)
    names = {s.name for s in cluster.list_jobs()}
    assert {a.name, b.name} <= names
    assert [s.name for s in cluster.list_jobs(a.job)] == [a.name]
    assert cluster.list_jobs(target.job("nobody")) == []
    with pytest.raises(NotFoundError):
        cluster.status(target.job("missing") + "-s0")


def test_stop_ends_the_workflow_stopped_and_is_idempotent(target: Target) -> None:
    cluster = target.cluster
    req = target.request("stop", total_steps=10_000)
    cluster.submit(req)
    before = target.wait(cluster, req.name, lambda s: (s.steps_done or 0) > 0)
    assert before.phase is Phase.RUNNING and before.steps_done is not None
    stopped = cluster.stop(req.name, message="rescale to 2")
    assert stopped.phase is Phase.STOPPED and stopped.phase.finished
    assert "Stop" in stopped.message
    # the stop loses no progress: the final report is at least what was seen before it
    assert stopped.steps_done is not None and stopped.steps_done >= before.steps_done
    assert cluster.stop(req.name).phase is Phase.STOPPED  # already ended: no 500, same answer


def test_stop_of_a_finished_workflow_keeps_its_phase(target: Target) -> None:
    cluster = target.cluster
    req = target.request("stopdone", total_steps=3)
    cluster.submit(req)
    target.wait(cluster, req.name, lambda s: s.phase.finished)
    assert cluster.stop(req.name).phase is Phase.SUCCEEDED


def test_in_place_resize_changes_units(target: Target) -> None:
    cluster = target.cluster
    if not cluster.supports_in_place_resize("cpu"):
        pytest.skip("cluster has no pods/resize (Kubernetes < 1.33)")
    assert not cluster.supports_in_place_resize("gpu")
    req = target.request("resize", total_steps=10_000)
    cluster.submit(req)
    target.wait(cluster, req.name, lambda s: s.phase is Phase.RUNNING and s.pod_name is not None)
    result = cluster.resize(req.name, 2)
    assert result.state in (ResizeState.DONE, ResizeState.IN_PROGRESS)
    after = target.wait(cluster, req.name, lambda s: s.units == 2)
    assert after.resize is ResizeState.DONE and after.pod_name is not None
    main = next(
        c for c in cluster.kube.get_pod(after.pod_name)["spec"]["containers"] if c["name"] == "main"
    )
    # memory follows: 2 units x 256Mi per unit, requests == limits (still Guaranteed)
    assert main["resources"]["requests"] == main["resources"]["limits"]
    assert main["resources"]["limits"]["memory"] == "512Mi"
    assert cluster.resize(req.name, 2).state is ResizeState.DONE  # idempotent
    assert {s.name: s.units for s in cluster.list_jobs(req.job)} == {req.name: 2}
    cluster.stop(req.name)


def test_resize_beyond_the_node_is_infeasible_and_a_busy_node_defers(target: Target) -> None:
    cluster = target.cluster
    if target.local is None:
        pytest.skip("needs a node of known size (the local cluster's 2 CPUs)")
    a, b = target.request("rsa", total_steps=10_000), target.request("rsb", total_steps=10_000)
    cluster.submit(a)
    cluster.submit(b)
    target.wait(cluster, b.name, lambda s: s.phase is Phase.RUNNING and s.pod_name is not None)
    assert cluster.capacity("cpu").free == 0
    deferred = cluster.resize(a.name, 2)
    assert deferred.state is ResizeState.DEFERRED and deferred.units == 1
    # the kubelet's reason: the node is full now (2 CPUs asked, 2 of 2 in use)
    assert deferred.message.startswith("Node didn't have enough resource: cpu"), deferred.message
    assert "requested: 2000" in deferred.message and "capacity: 2000" in deferred.message
    infeasible = cluster.resize(b.name, 3)
    assert infeasible.state is ResizeState.INFEASIBLE and infeasible.units == 1
    # ... versus never: 3 CPUs exceed the node itself
    assert infeasible.message.startswith("Node didn't have enough capacity: cpu"), (
        infeasible.message
    )
    assert "requested: 3000" in infeasible.message and "capacity: 2000" in infeasible.message
    cluster.stop(b.name)
    result = target.wait(cluster, a.name, lambda s: s.units == 2)  # the deferred resize lands
    assert result.resize is ResizeState.DONE


def test_set_priority_patches_the_workflow(target: Target) -> None:
    cluster = target.cluster
    req = target.request("prio", total_steps=10_000)
    cluster.submit(req)
    st = cluster.set_priority(req.name, priority=4242, priority_class="qosflow-high")
    assert (st.priority, st.priority_class) == (4242, "qosflow-high")
    wf = cluster.argo.get_workflow(req.name)  # visible through the Argo Server too
    assert wf["spec"]["priority"] == 4242
    with pytest.raises(SpecError):
        cluster.set_priority(req.name, priority=2**31)
    cluster.stop(req.name)


def test_capacity_counts_running_pods(target: Target) -> None:
    cluster = target.cluster
    before = cluster.capacity("cpu")
    assert before.total >= 1 and 0 <= before.free <= before.total
    assert sum(before.free_per_node.values()) == before.free
    if target.local is None:
        return
    req = target.request("cap", total_steps=10_000)
    cluster.submit(req)
    target.wait(cluster, req.name, lambda s: s.phase is Phase.RUNNING)
    assert cluster.capacity("cpu").free == before.free - 1
    cluster.stop(req.name)
    assert cluster.capacity("cpu").free == before.free


def test_bad_manifest_never_leaves_the_client(target: Target) -> None:
    cluster = target.cluster
    sent = len(target.exchanges)
    with pytest.raises(SpecError):
        cluster.submit(target.request("BAD_name"))
    with pytest.raises(SpecError):
        cluster.submit(target.request("worker", unit="worker"))
    assert len(target.exchanges) == sent


def test_wrong_token_is_a_clear_error_without_the_token(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-" + TOKEN
    caplog.set_level(logging.DEBUG)
    if target.local is None:  # real cluster: Kubernetes credentials come from the kubeconfig
        cluster = target.make(token=wrong)
    else:
        cluster = ArgoCluster(
            target.local.argo_url,
            token=wrong,
            namespace=target.local.namespace,
            kube_url=target.local.kube_url,
            clock=target.clock.now,
            sleep=target.clock.advance,
        )
    with pytest.raises(ClusterError) as err:
        cluster.list_jobs()
    assert err.value.status == 401 and not err.value.retryable
    texts = [str(err.value), repr(cluster)]
    if target.local is not None:
        with pytest.raises(ClusterError) as kerr:
            cluster.capacity("cpu")
        assert kerr.value.status == 401
        texts.append(str(kerr.value))
    for text in [*texts, caplog.text]:
        assert wrong not in text and TOKEN not in text
    cluster.close()


def test_a_failing_trainer_fails_the_workflow_with_a_message(target: Target) -> None:
    cluster = target.cluster
    req = target.request("boom", total_steps=100, command=("false",))
    if target.runner is not None:
        from qosflow.local import Script

        target.runner.by_workflow = {req.name: Script(fail_at_step=5)}
    cluster.submit(req)
    failed = target.wait(cluster, req.name, lambda s: s.phase.finished)
    assert failed.phase is Phase.FAILED and failed.message
    assert failed.finished_at is not None


def test_a_segment_that_does_not_fit_is_queued_until_capacity_frees(target: Target) -> None:
    cluster = target.cluster
    if target.local is None:
        pytest.skip("needs a node of known size (the local cluster's 2 CPUs)")
    big = target.request("big", units=2, total_steps=10_000)
    small = target.request("small", units=1, total_steps=10_000)
    cluster.submit(big)
    target.wait(cluster, big.name, lambda s: s.phase is Phase.RUNNING)
    cluster.submit(small)
    queued = target.wait(cluster, small.name, lambda s: bool(s.message))
    assert queued.phase is Phase.PENDING and queued.started_at is None
    assert "cpu" in queued.message.lower()
    cluster.stop(big.name)
    running = target.wait(cluster, small.name, lambda s: s.phase is Phase.RUNNING)
    assert running.started_at is not None
    cluster.stop(small.name)


def test_the_template_makes_a_valid_guaranteed_pod(target: Target) -> None:
    import kubernetes_validate

    cluster = target.cluster
    req = target.request("podshape", units=1, total_steps=10_000)
    cluster.submit(req)
    st = target.wait(cluster, req.name, lambda s: s.pod_name is not None)
    assert st.pod_name is not None
    pod = cluster.kube.get_pod(st.pod_name)
    # a real API server may be newer than the 1.33 schemas: strict only on the local cluster
    kubernetes_validate.validate(pod, "1.33.0", strict=target.local is not None)
    main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
    assert main["resources"]["requests"] == main["resources"]["limits"]
    assert main["resources"]["requests"]["cpu"] in ("1", 1)
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    assert env["QOSFLOW_TOTAL_STEPS"] == "10000" and env["QOSFLOW_RESUME"] == "auto"
    assert pod["metadata"]["labels"]["workflows.argoproj.io/workflow"] == req.name
    assert pod["spec"].get("priorityClassName") == "qosflow-normal"
    cluster.stop(req.name)
