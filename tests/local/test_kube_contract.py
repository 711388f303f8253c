"""Contract tests of the emulated Kubernetes API: nodes, pods, in-place resize (validation and the
PodResizePending / PodResizeInProgress conditions), PriorityClass rules, the Workflow CR."""

from __future__ import annotations

from typing import Any

import requests

from qosflow.local import LocalCluster, VirtualClock

from .conftest import NS, Api, container_wf, errors_of, kube_validator, pod_of

SMP = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _resize(kube: Api, pod: str, cpu: str, **extra: Any) -> requests.Response:
    resources = {
        "requests": {"cpu": cpu, "memory": "64Mi"},
        "limits": {"cpu": cpu, "memory": "64Mi"},
    }
    resources["requests"].update(extra.get("requests", {}))
    resources["limits"].update(extra.get("limits", {}))
    body = {"spec": {"containers": [{"name": "main", "resources": resources}]}}
    return kube("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod}/resize", json=body, headers=SMP)


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


def test_unauthorized_is_a_kubernetes_status(cluster: LocalCluster) -> None:
    response = requests.get(f"{cluster.kube_url}/api/v1/nodes", timeout=5)
    assert response.status_code == 401
    assert response.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_node_reports_allocatable_cpus(kube: Api) -> None:
    nodes = kube("GET", "/api/v1/nodes").json()
    assert len(nodes["items"]) == 1
    node = nodes["items"][0]
    assert node["status"]["allocatable"]["cpu"] == "2"
    assert errors_of(kube_validator("Node"), node) == []
    missing = kube("GET", "/api/v1/nodes/other")
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


def test_pod_list_selectors_and_404(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("p-1", cpu="2"))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("p-2", cpu="2"))
    clock.advance(1)
    running = kube(
        "GET", f"/api/v1/namespaces/{NS}/pods", params={"fieldSelector": "status.phase=Running"}
    ).json()
    assert [p["metadata"]["name"] for p in running["items"]] == ["p-1"]
    pending = kube(
        "GET", f"/api/v1/namespaces/{NS}/pods", params={"fieldSelector": "status.phase!=Running"}
    ).json()
    assert [p["metadata"]["name"] for p in pending["items"]] == ["p-2"]
    by_label = kube(
        "GET", "/api/v1/pods", params={"labelSelector": "workflows.argoproj.io/workflow=p-2"}
    ).json()
    assert [p["metadata"]["name"] for p in by_label["items"]] == ["p-2"]
    for pod in running["items"] + pending["items"]:
        assert errors_of(kube_validator("Pod"), pod) == []
    missing = kube("GET", f"/api/v1/namespaces/{NS}/pods/nope")
    assert missing.status_code == 404
    assert missing.json()["message"] == 'pods "nope" not found'
    bad = kube("GET", f"/api/v1/namespaces/{NS}/pods", params={"fieldSelector": "spec.bogus=1"})
    assert bad.status_code == 400


def test_resize_in_place_then_done(
    argo: Api, kube: Api, clock: VirtualClock, cluster: LocalCluster
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("grow", cpu="1"))
    clock.advance(1)
    response = _resize(kube, "grow", "2")
    assert response.status_code == 200
    pod = response.json()
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert pod["metadata"]["generation"] == 2
    clock.advance(1)
    pod = pod_of(kube, "grow")
    assert "PodResizeInProgress" in _conditions(pod)
    assert pod["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "2"
    assert cluster.runner.launched["grow"].cpus == 2.0  # type: ignore[attr-defined]
    assert len(cluster.runner.launched["grow"].cores) >= 1  # type: ignore[attr-defined]
    clock.advance(1)
    pod = pod_of(kube, "grow")
    assert "PodResizeInProgress" not in _conditions(pod) and "PodResizePending" not in _conditions(
        pod
    )
    assert pod["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "2"
    assert pod["status"]["observedGeneration"] == 2
    assert errors_of(kube_validator("Pod"), pod) == []


def test_resize_deferred_then_admitted_and_infeasible(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("a", cpu="1", steps=5))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("b", cpu="1", steps=100))
    clock.advance(1)
    assert _resize(kube, "b", "2").status_code == 200
    clock.advance(1)
    pending = _conditions(pod_of(kube, "b"))["PodResizePending"]
    assert (
        pending["reason"] == "Deferred"
        and "Node didn't have enough resource: cpu" in pending["message"]
    )
    for _ in range(6):
        clock.advance(1)  # "a" finishes, its core frees up, the deferred resize is admitted
    pod = pod_of(kube, "b")
    assert "PodResizePending" not in _conditions(pod)
    assert pod["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "2"
    assert _resize(kube, "b", "3").status_code == 200
    clock.advance(1)
    infeasible = _conditions(pod_of(kube, "b"))["PodResizePending"]
    assert infeasible["reason"] == "Infeasible"
    assert (
        infeasible["message"]
        == "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
    )


def test_resize_validation_422(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("v", cpu="1"))
    clock.advance(1)
    gpu = _resize(kube, "v", "1", requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "1"})
    assert gpu.status_code == 422 and gpu.json()["reason"] == "Invalid"
    assert "only cpu and memory resources are mutable" in gpu.json()["message"]
    over = _resize(kube, "v", "1", requests={"cpu": "3"})
    assert (
        over.status_code == 422
        and "must be less than or equal to cpu limit of 1" in over.json()["message"]
    )
    removed = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/v/resize",
        headers=SMP,
        json={"spec": {"containers": [{"name": "main", "resources": {"limits": None}}]}},
    )
    assert removed.status_code == 422 and "cannot be removed" in removed.json()["message"]
    other = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/v/resize",
        headers=SMP,
        json={"spec": {"containers": [{"name": "main", "image": "other"}]}},
    )
    assert other.status_code == 422
    plain = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/v",
        headers=SMP,
        json={"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}]}},
    )
    assert (
        plain.status_code == 422 and "pod updates may not change fields" in plain.json()["message"]
    )


def test_resize_may_not_change_qos_class(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("g", cpu="1"))  # Guaranteed
    clock.advance(1)
    assert pod_of(kube, "g")["status"]["qosClass"] == "Guaranteed"
    response = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/g/resize",
        headers=SMP,
        json={
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                    }
                ]
            }
        },
    )
    assert response.status_code == 422
    assert (
        'Invalid value: "Burstable": Pod QOS Class may not change as a result of resizing'
        in response.json()["message"]
    )


def test_priority_class_crud_and_immutability(kube: Api) -> None:
    doc = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "qosflow-high"},
        "value": 50000,
        "preemptionPolicy": "Never",
        "description": "high",
    }
    created = kube("POST", PCS, json=doc)
    assert created.status_code == 201
    assert errors_of(kube_validator("PriorityClass", "scheduling.k8s.io/v1"), created.json()) == []
    assert kube("POST", PCS, json=doc).status_code == 409
    changed = kube("PATCH", f"{PCS}/qosflow-high", json={"value": 60000}, headers=MERGE)
    assert changed.status_code == 422
    body = changed.json()
    assert body["reason"] == "Invalid"
    assert (
        body["message"]
        == 'PriorityClass.scheduling.k8s.io "qosflow-high" is invalid: value: Forbidden: may not be changed in an update.'
    )
    assert body["details"]["causes"][0]["field"] == "value"
    policy = kube(
        "PUT", f"{PCS}/qosflow-high", json={**doc, "preemptionPolicy": "PreemptLowerPriority"}
    )
    assert policy.status_code == 422 and "preemptionPolicy: Forbidden" in policy.json()["message"]
    described = kube(
        "PATCH", f"{PCS}/qosflow-high", json={"description": "new words"}, headers=MERGE
    )
    assert described.status_code == 200 and described.json()["description"] == "new words"
    listed = kube("GET", PCS).json()["items"]
    assert {"qosflow-high", "system-cluster-critical", "system-node-critical"} <= {
        c["metadata"]["name"] for c in listed
    }
    assert kube("DELETE", f"{PCS}/qosflow-high").status_code == 200
    assert kube("GET", f"{PCS}/qosflow-high").status_code == 404


def test_priority_class_admission_rules(kube: Api) -> None:
    base = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass"}
    too_high = kube(
        "POST", PCS, json={**base, "metadata": {"name": "huge"}, "value": 2_000_000_000}
    )
    assert too_high.status_code == 403 and too_high.json()["reason"] == "Forbidden"
    system = kube("POST", PCS, json={**base, "metadata": {"name": "system-mine"}, "value": 1})
    assert system.status_code == 422
    assert (
        kube(
            "POST",
            PCS,
            json={**base, "metadata": {"name": "d1"}, "value": 1, "globalDefault": True},
        ).status_code
        == 201
    )
    second = kube(
        "POST", PCS, json={**base, "metadata": {"name": "d2"}, "value": 2, "globalDefault": True}
    )
    assert second.status_code == 403 and "Only one default can exist" in second.json()["message"]
    no_value = kube("POST", PCS, json={**base, "metadata": {"name": "nov"}})
    assert no_value.status_code == 422


def test_workflow_custom_resource_patch(argo: Api, kube: Api) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("cr"))
    path = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/cr"
    assert kube("GET", path).json()["metadata"]["name"] == "cr"
    patched = kube(
        "PATCH", path, json={"spec": {"priority": 7, "podPriorityClassName": "x"}}, headers=MERGE
    )
    assert patched.status_code == 200 and patched.json()["metadata"]["generation"] == 2
    assert argo("GET", f"/api/v1/workflows/{NS}/cr").json()["spec"]["priority"] == 7
    json_patch = kube(
        "PATCH",
        path,
        json=[{"op": "replace", "path": "/spec/priority", "value": 9}],
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert json_patch.status_code == 200 and json_patch.json()["spec"]["priority"] == 9
    strategic = kube("PATCH", path, json={"spec": {"priority": 1}}, headers=SMP)
    assert strategic.status_code == 415 and strategic.json()["reason"] == "UnsupportedMediaType"
    stale = kube(
        "PATCH",
        path,
        json={"metadata": {"resourceVersion": "1"}, "spec": {"priority": 2}},
        headers=MERGE,
    )
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert (
        kube("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/none").status_code == 404
    )


def test_resizing_back_clears_a_deferred_resize(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("c-1", cpu="1", steps=100))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("c-2", cpu="1", steps=100))
    clock.advance(1)
    _resize(kube, "c-2", "2")
    clock.advance(1)
    assert _conditions(pod_of(kube, "c-2"))["PodResizePending"]["reason"] == "Deferred"
    _resize(kube, "c-2", "1")
    clock.advance(1)
    assert "PodResizePending" not in _conditions(pod_of(kube, "c-2"))
