"""Workflow life cycle on a virtual clock with scripted pods: phases, nodes, progress, steps,
retries, stop / terminate with SIGTERM then SIGKILL, and pods admitted in priority order."""

from __future__ import annotations

from typing import Any

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock

from .conftest import NS, Api, argo_validator, container_wf, errors_of, kube_validator, pod_of

WORKFLOW = argo_validator("Workflow")
POD = kube_validator("Pod")


def _wf(argo: Api, name: str) -> dict[str, Any]:
    return argo("GET", f"/api/v1/workflows/{NS}/{name}").json()


def test_phases_nodes_and_progress(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("life", steps=10))
    assert "phase" not in _wf(argo, "life")["status"]
    clock.advance(1)
    wf = _wf(argo, "life")
    assert wf["status"]["phase"] == "Running"
    node = wf["status"]["nodes"]["life"]
    assert (node["type"], node["phase"], node["progress"]) == ("Pod", "Running", "0/10")
    pod = pod_of(kube, "life")
    assert (
        pod["metadata"]["name"] == "life"
    )  # a container entrypoint's pod is named after the workflow
    assert pod["metadata"]["labels"]["qosflow.dev/job"] == "life"
    assert pod["metadata"]["annotations"]["workflows.argoproj.io/node-id"] == "life"
    assert errors_of(POD, pod) == []
    clock.advance(4)
    wf = _wf(argo, "life")
    assert (
        wf["status"]["nodes"]["life"]["progress"] == "4/10" and wf["status"]["progress"] == "4/10"
    )
    assert {"type": "PodRunning", "status": "True"} in wf["status"]["conditions"]
    clock.advance(6)
    wf = _wf(argo, "life")
    assert wf["status"]["phase"] == "Succeeded"
    assert wf["status"]["nodes"]["life"]["phase"] == "Succeeded"
    assert wf["status"]["finishedAt"] is not None
    finished = pod_of(kube, "life")
    assert finished["status"]["phase"] == "Succeeded"
    assert finished["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert errors_of(POD, finished) == []
    assert errors_of(WORKFLOW, wf) == []


def test_failed_pod_fails_workflow_with_exit_code(tmp_path: Any, clock: VirtualClock) -> None:
    runner = ScriptedRunner(default=Script(fail_at_step=3))
    with LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("boom"))
        for _ in range(5):
            clock.advance(1)
        wf = _wf(argo, "boom")
        assert wf["status"]["phase"] == "Failed"
        assert wf["status"]["message"] == "Error (exit code 1)"
        assert wf["status"]["nodes"]["boom"]["phase"] == "Failed"


def test_steps_run_group_by_group_with_argo_names(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    main = container_wf("x", steps=2)["workflow"]["spec"]["templates"][0]
    spec = {
        "entrypoint": "pipeline",
        "templates": [
            {
                "name": "pipeline",
                "steps": [
                    [{"name": "prep", "template": "work"}],
                    [{"name": "train", "template": "work"}],
                ],
            },
            {**main, "name": "work"},
        ],
    }
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json={"workflow": {"metadata": {"name": "steps"}, "spec": spec}},
    )
    clock.advance(1)
    pods = kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"]
    assert len(pods) == 1 and pods[0]["metadata"]["name"].startswith("steps-work-")
    for _ in range(6):
        clock.advance(1)
    wf = _wf(argo, "steps")
    assert wf["status"]["phase"] == "Succeeded"
    types = sorted(n["type"] for n in wf["status"]["nodes"].values())
    assert types == ["Pod", "Pod", "StepGroup", "StepGroup", "Steps"]
    names = {n["name"] for n in wf["status"]["nodes"].values()}
    assert {"steps", "steps[0]", "steps[0].prep", "steps[1].train"} <= names
    assert wf["status"]["progress"] == "4/4"
    assert errors_of(WORKFLOW, wf) == []


def test_retry_strategy_creates_attempts_after_backoff(tmp_path: Any, clock: VirtualClock) -> None:
    runner = ScriptedRunner(default=Script(fail_at_step=2))
    with LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        request = container_wf("retry")
        request["workflow"]["spec"]["templates"][0]["retryStrategy"] = {
            "limit": 1,
            "retryPolicy": "Always",
            "backoff": {"duration": "10s", "factor": 2},
        }
        argo("POST", f"/api/v1/workflows/{NS}", json=request)
        for _ in range(4):
            clock.advance(1)
        wf = _wf(argo, "retry")
        retry = wf["status"]["nodes"]["retry"]
        assert (
            retry["type"] == "Retry" and retry["phase"] == "Running" and len(retry["children"]) == 1
        )
        assert retry["message"] == "Backoff for 10 seconds"
        clock.advance(10)
        wf = _wf(argo, "retry")
        assert len(wf["status"]["nodes"]["retry"]["children"]) == 2
        assert {n["name"] for n in wf["status"]["nodes"].values()} == {
            "retry",
            "retry(0)",
            "retry(1)",
        }
        for _ in range(4):
            clock.advance(1)
        wf = _wf(argo, "retry")
        assert wf["status"]["phase"] == "Failed"
        assert len(cluster.pods("retry")) == 2
        assert errors_of(WORKFLOW, wf) == []


def test_stop_sends_sigterm_and_fails_with_upstream_messages(
    argo: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("stop-me", steps=100))
    clock.advance(1)
    clock.advance(5)
    response = argo("PUT", f"/api/v1/workflows/{NS}/stop-me/stop", json={"message": "rescale"})
    assert response.status_code == 200 and response.json()["spec"]["shutdown"] == "Stop"
    clock.advance(1)  # the controller sees spec.shutdown: SIGTERM
    assert runner.launched["stop-me"].signals == ["SIGTERM"]
    assert _wf(argo, "stop-me")["status"]["phase"] == "Running"
    clock.advance(1)  # the kubelet sees the exit
    wf = _wf(argo, "stop-me")
    assert wf["status"]["phase"] == "Failed"
    assert wf["status"]["message"] == "Stopped with strategy 'Stop'"
    assert wf["status"]["nodes"]["stop-me"]["message"] == "workflow shutdown with strategy:  Stop"
    assert wf["status"]["nodes"]["stop-me"]["progress"] == "6/100"


def test_sigkill_after_grace_period_when_sigterm_is_ignored(
    tmp_path: Any, clock: VirtualClock
) -> None:
    runner = ScriptedRunner(default=Script(term_exit_s=None))
    with LocalCluster(
        cpus=2, state_dir=tmp_path, clock=clock, runner=runner, grace_s=30
    ) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("stubborn", steps=1000))
        clock.advance(1)
        argo("PUT", f"/api/v1/workflows/{NS}/stubborn/terminate")
        clock.advance(1)
        assert runner.launched["stubborn"].signals == ["SIGTERM"]
        clock.advance(20)
        assert _wf(argo, "stubborn")["status"]["phase"] == "Running"
        clock.advance(10)
        assert runner.launched["stubborn"].signals == ["SIGTERM", "SIGKILL"]
        wf = _wf(argo, "stubborn")
        assert wf["status"]["phase"] == "Failed"
        assert wf["status"]["message"] == "Stopped with strategy 'Terminate'"


def test_terminate_of_unstarted_workflow_creates_no_pod(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("early"))
    argo("PUT", f"/api/v1/workflows/{NS}/early/terminate")
    clock.advance(1)
    wf = _wf(argo, "early")
    assert wf["status"]["phase"] == "Failed"
    assert all(
        p["status"]["phase"] == "Failed"
        for p in kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"]
    )


def test_pending_pods_are_admitted_in_priority_order(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    for name, value in (("low", 10), ("high", 1000)):
        kube(
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            json={
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("big", cpu="2", steps=3))
    clock.advance(1)
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json=container_wf("first-low", cpu="2", priority_class="low"),
    )
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json=container_wf("then-argo-prio", cpu="2", priority_class="low", priority=5),
    )
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json=container_wf("last-high", cpu="2", priority_class="high"),
    )
    clock.advance(1)
    waiting = pod_of(kube, "last-high")
    assert waiting["status"]["phase"] == "Pending"
    scheduled = next(c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["reason"] == "Unschedulable" and "Insufficient cpu" in scheduled["message"]
    assert waiting["spec"]["priority"] == 1000
    node = _wf(argo, "last-high")["status"]["nodes"]["last-high"]
    assert node["phase"] == "Pending" and node["message"].startswith(
        "Unschedulable: 0/1 nodes are available"
    )
    order = []
    for _ in range(80):
        clock.advance(1)
        for name in ("first-low", "then-argo-prio", "last-high"):
            if name not in order and pod_of(kube, name)["status"]["phase"] != "Pending":
                order.append(name)
    assert order == ["last-high", "then-argo-prio", "first-low"]


def test_patching_argo_priority_reorders_the_queue(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("hog", cpu="2", steps=3))
    clock.advance(1)
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("older", cpu="2"))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("newer", cpu="2"))
    clock.advance(1)
    response = kube(
        "PATCH",
        f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/newer",
        data='{"spec":{"priority":20}}',
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200 and response.json()["spec"]["priority"] == 20
    for _ in range(4):
        clock.advance(1)
    assert pod_of(kube, "newer")["status"]["phase"] == "Running"
    assert pod_of(kube, "older")["status"]["phase"] == "Pending"


def test_unknown_priority_class_is_a_node_error(argo: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("noclass", priority_class="nope"))
    clock.advance(1)
    wf = _wf(argo, "noclass")
    assert wf["status"]["nodes"]["noclass"]["phase"] == "Error"
    assert wf["status"]["phase"] == "Failed"
    assert (
        wf["status"]["message"]
        == 'pods "noclass" is forbidden: no PriorityClass with name nope was found'
    )


def test_active_deadline_fails_the_workflow(argo: Api, clock: VirtualClock) -> None:
    request = container_wf("late", steps=1000)
    request["workflow"]["spec"]["activeDeadlineSeconds"] = 10
    argo("POST", f"/api/v1/workflows/{NS}", json=request)
    for _ in range(13):
        clock.advance(1)
    wf = _wf(argo, "late")
    assert (
        wf["status"]["phase"] == "Failed"
        and wf["status"]["message"] == "Step exceeded its deadline"
    )


def test_idle_ticks_do_not_bump_resource_versions(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("hold", cpu="2", steps=1000))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("wait", cpu="2"))
    clock.advance(1)
    clock.advance(1)
    waiting = (
        _wf(argo, "wait")["metadata"]["resourceVersion"],
        pod_of(kube, "wait")["metadata"]["resourceVersion"],
    )
    running = _wf(argo, "hold")["metadata"]["resourceVersion"]
    clock.advance(1)
    assert (
        _wf(argo, "wait")["metadata"]["resourceVersion"],
        pod_of(kube, "wait")["metadata"]["resourceVersion"],
    ) == waiting
    assert _wf(argo, "hold")["metadata"]["resourceVersion"] != running  # its progress moved


def test_preemption_evicts_lower_priority_pods_when_enabled(tmp_path: Any) -> None:
    clock = VirtualClock()
    runner = ScriptedRunner(default=Script(term_exit_s=1))
    with LocalCluster(
        cpus=2, state_dir=tmp_path, clock=clock, runner=runner, preemption=True
    ) as cluster:
        argo, kube = Api(cluster.argo_url, cluster.token), Api(cluster.kube_url, cluster.token)
        pcs = "/apis/scheduling.k8s.io/v1/priorityclasses"
        kube("POST", pcs, json={"metadata": {"name": "urgent"}, "value": 100000})
        kube(
            "POST",
            pcs,
            json={"metadata": {"name": "polite"}, "value": 50000, "preemptionPolicy": "Never"},
        )
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("victim", cpu="2", steps=1000))
        clock.advance(1)
        argo(
            "POST",
            f"/api/v1/workflows/{NS}",
            json=container_wf("waits", cpu="2", priority_class="polite"),
        )
        clock.advance(1)
        assert runner.launched["victim"].signals == []  # preemptionPolicy Never evicts nobody
        argo(
            "POST",
            f"/api/v1/workflows/{NS}",
            json=container_wf("boss", cpu="2", priority_class="urgent"),
        )
        clock.advance(1)
        assert runner.launched["victim"].signals == ["SIGTERM"]
        assert pod_of(kube, "boss")["status"]["nominatedNodeName"] == "qosflow-local"
        disruption = next(
            c
            for c in pod_of(kube, "victim")["status"]["conditions"]
            if c["type"] == "DisruptionTarget"
        )
        assert disruption["reason"] == "PreemptionByScheduler"
        for _ in range(3):
            clock.advance(1)
        assert pod_of(kube, "boss")["status"]["phase"] == "Running"
        assert pod_of(kube, "waits")["status"]["phase"] == "Pending"
        victim = _wf(argo, "victim")
        assert victim["status"]["phase"] == "Failed"
        assert victim["status"]["nodes"]["victim"]["message"] == "pod deleted"


def test_without_preemption_a_higher_priority_pod_waits(
    argo: Api, kube: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    kube(
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        json={"metadata": {"name": "urgent"}, "value": 100000},
    )
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("runs", cpu="2", steps=1000))
    clock.advance(1)
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json=container_wf("boss", cpu="2", priority_class="urgent"),
    )
    clock.advance(1)
    clock.advance(1)
    assert runner.launched["runs"].signals == []
    assert pod_of(kube, "boss")["status"]["phase"] == "Pending"
