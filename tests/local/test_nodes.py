"""Several nodes (issue 18): each pod bound to one node where it fits, the scheduler's messages
with the real counts, GPUs per node, resize and preemption against the pod's node, the nodes'
allocatable and what qosflow's client computes from them (``free_capacity``), and each node's
own block of host cores. Scripted pods on a virtual clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
from qosflow_argo.capacity import free_capacity

from .conftest import NS, Api, container_wf, errors_of, kube_validator, pod_of

NODE = kube_validator("Node")
NODE_LIST = kube_validator("NodeList")
POD = kube_validator("Pod")
FULL = (
    "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: "
    "2 No preemption victims found for incoming pod."
)


@pytest.fixture
def two(tmp_path: Path, clock: VirtualClock) -> Iterator[LocalCluster]:
    """Two nodes of 1 CPU and 1 GPU each; scripted pods that run 100 s."""
    runner = ScriptedRunner(default=Script(total_steps=100))
    with LocalCluster(
        nodes=2, cpus=1, gpus=1, state_dir=tmp_path / "s", clock=clock, runner=runner
    ) as cluster:
        yield cluster


def _submit(cluster: LocalCluster, name: str, **resources: str) -> None:
    request = container_wf(name, cpu=resources.pop("cpu", "1"))
    container = request["workflow"]["spec"]["templates"][0]["container"]
    for key, value in resources.items():
        resource = key.replace("_", "/").replace("nvidia/", "nvidia.com/")
        container["resources"]["requests"][resource] = value
        container["resources"]["limits"][resource] = value
    Api(cluster.argo_url, cluster.token)("POST", f"/api/v1/workflows/{NS}", json=request)


def _pod(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return pod_of(Api(cluster.kube_url, cluster.token), name)


def _unschedulable(pod: dict[str, Any]) -> str:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    return str(cond["message"])


def test_node_list_and_names(two: LocalCluster) -> None:
    kube = Api(two.kube_url, two.token)
    listed = kube("GET", "/api/v1/nodes").json()
    assert errors_of(NODE_LIST, listed) == []
    names = [n["metadata"]["name"] for n in listed["items"]]
    assert names == ["qosflow-local-0", "qosflow-local-1"]
    for node in listed["items"]:
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert node["status"]["allocatable"]["cpu"] == "1"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    one = kube("GET", "/api/v1/nodes/qosflow-local-1").json()
    first = int(listed["items"][0]["spec"]["podCIDR"].split(".")[1])
    assert errors_of(NODE, one) == []
    assert one["spec"]["podCIDR"] == f"127.{1 + first % 254}.0.0/16"  # the next network
    assert kube("GET", "/api/v1/nodes/qosflow-local").status_code == 404


def test_one_node_keeps_its_name(cluster: LocalCluster, kube: Api) -> None:
    listed = kube("GET", "/api/v1/nodes").json()["items"]
    assert [n["metadata"]["name"] for n in listed] == ["qosflow-local"]
    assert "nvidia.com/gpu" not in listed[0]["status"]["allocatable"]


def test_pods_spread_then_wait_with_the_real_message(
    two: LocalCluster, clock: VirtualClock
) -> None:
    for name in ("a", "b", "c"):
        _submit(two, name)
    clock.advance(1)
    a, b, c = (_pod(two, n) for n in ("a", "b", "c"))
    assert {a["spec"]["nodeName"], b["spec"]["nodeName"]} == {"qosflow-local-0", "qosflow-local-1"}
    assert a["status"]["phase"] == b["status"]["phase"] == "Running"
    assert c["status"]["phase"] == "Pending" and "nodeName" not in c["spec"]
    assert _unschedulable(c) == FULL
    node = two.workflow("c")["status"]["nodes"]["c"]  # type: ignore[index]
    assert node["message"] == f"Unschedulable: {FULL}"
    assert [errors_of(POD, p) for p in (a, b, c)] == [[], [], []]
    for _ in range(101):  # a and b end: c starts on the node that freed first
        clock.advance(1)
    assert _pod(two, "c")["status"]["phase"] in ("Running", "Succeeded")


def test_a_pod_is_never_split_across_nodes(two: LocalCluster, clock: VirtualClock) -> None:
    _submit(two, "big", cpu="2")
    clock.advance(1)
    big = _pod(two, "big")
    assert big["status"]["phase"] == "Pending"
    assert _unschedulable(big) == FULL


def test_gpus_per_node(two: LocalCluster, clock: VirtualClock) -> None:
    for name in ("g1", "g2", "g3"):
        _submit(two, name, cpu="0", nvidia_gpu="1")
    _submit(two, "g-two", cpu="0", nvidia_gpu="2")
    clock.advance(1)
    placed = {_pod(two, n)["spec"].get("nodeName") for n in ("g1", "g2")}
    assert placed == {"qosflow-local-0", "qosflow-local-1"}
    gpu_full = (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod."
    )
    assert _unschedulable(_pod(two, "g3")) == gpu_full
    assert _unschedulable(_pod(two, "g-two")) == gpu_full


def test_gpus_under_another_name_and_none(tmp_path: Path, clock: VirtualClock) -> None:
    with LocalCluster(
        cpus=2,
        gpus=2,
        gpu_resource="amd.com/gpu",
        state_dir=tmp_path,
        clock=clock,
        runner=ScriptedRunner(),
    ) as cluster:
        allocatable = Api(cluster.kube_url, cluster.token)("GET", "/api/v1/nodes").json()
        assert allocatable["items"][0]["status"]["allocatable"]["amd.com/gpu"] == "2"
        _submit(cluster, "nv", cpu="0", nvidia_gpu="1")
        clock.advance(1)
        assert _unschedulable(_pod(cluster, "nv")).startswith(
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        )


def test_node_selection_counts_each_reason(two: LocalCluster, clock: VirtualClock) -> None:
    request = container_wf("pinned", cpu="1")
    request["workflow"]["spec"]["templates"][0]["nodeSelector"] = {
        "kubernetes.io/hostname": "qosflow-local-1"
    }
    Api(two.argo_url, two.token)("POST", f"/api/v1/workflows/{NS}", json=request)
    clock.advance(1)
    assert _pod(two, "pinned")["spec"]["nodeName"] == "qosflow-local-1"
    request["workflow"]["metadata"]["name"] = "pinned-too"
    Api(two.argo_url, two.token)("POST", f"/api/v1/workflows/{NS}", json=request)
    clock.advance(1)
    assert _unschedulable(_pod(two, "pinned-too")) == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found "
        "for incoming pod, 1 Preemption is not helpful for scheduling."
    )
    request["workflow"]["metadata"]["name"] = "nowhere"
    request["workflow"]["spec"]["templates"][0]["nodeSelector"] = {"gpu": "h100"}
    Api(two.argo_url, two.token)("POST", f"/api/v1/workflows/{NS}", json=request)
    clock.advance(1)
    assert _unschedulable(_pod(two, "nowhere")) == (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    )


def test_free_capacity_per_node_as_the_client_reads_it(
    two: LocalCluster, clock: VirtualClock
) -> None:
    _submit(two, "cpu-pod", cpu="1")
    _submit(two, "gpu-pod", cpu="0", nvidia_gpu="1")
    clock.advance(1)
    kube = Api(two.kube_url, two.token)
    nodes = kube("GET", "/api/v1/nodes").json()["items"]
    pods = kube("GET", "/api/v1/pods").json()["items"]
    cpu = free_capacity("cpu", nodes, pods)
    gpu = free_capacity("gpu", nodes, pods)
    where_cpu = _pod(two, "cpu-pod")["spec"]["nodeName"]
    where_gpu = _pod(two, "gpu-pod")["spec"]["nodeName"]
    assert (cpu.total, cpu.free) == (2, 1) and cpu.free_per_node[where_cpu] == 0
    assert (gpu.total, gpu.free) == (2, 1) and gpu.free_per_node[where_gpu] == 0
    for _ in range(101):
        clock.advance(1)
    pods = kube("GET", "/api/v1/pods").json()["items"]
    assert free_capacity("cpu", nodes, pods).free == 2  # finished pods hold nothing


def _resize(cluster: LocalCluster, name: str, cpu: str) -> dict[str, Any]:
    pod = _pod(cluster, name)
    path = f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/resize"
    resources = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    patch = {"spec": {"containers": [{"name": "main", "resources": resources}]}}
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    answer = Api(cluster.kube_url, cluster.token)("PATCH", path, json=patch, headers=headers)
    assert answer.status_code == 200, answer.text
    return pod


def _resize_condition(cluster: LocalCluster, name: str) -> dict[str, Any]:
    conditions = _pod(cluster, name)["status"]["conditions"]
    return next(c for c in conditions if c["type"] == "PodResizePending")


def test_resize_is_against_the_pods_node(tmp_path: Path, clock: VirtualClock) -> None:
    runner = ScriptedRunner(default=Script(total_steps=100))
    with LocalCluster(nodes=2, cpus=2, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        for name in ("a", "b", "c"):  # a and b spread, c joins a on the first node
            _submit(cluster, name)
        clock.advance(1)
        assert _pod(cluster, "c")["spec"]["nodeName"] == _pod(cluster, "a")["spec"]["nodeName"]
        _resize(cluster, "c", "2")
        _resize(cluster, "b", "3")
        clock.advance(1)
        deferred, infeasible = _resize_condition(cluster, "c"), _resize_condition(cluster, "b")
    assert deferred["reason"] == "Deferred"
    assert deferred["message"].endswith("requested: 2000, used: 1000, capacity: 2000")
    assert infeasible["reason"] == "Infeasible"
    assert infeasible["message"].endswith("requested: 3000, capacity: 2000")


def test_each_node_its_own_host_cores(tmp_path: Path, clock: VirtualClock) -> None:
    host = sorted(os.sched_getaffinity(0))
    runner = ScriptedRunner(default=Script(total_steps=100))
    with LocalCluster(nodes=2, cpus=1, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        _submit(cluster, "p0")
        _submit(cluster, "p1")
        clock.advance(1)
        cores = {
            _pod(cluster, n)["spec"]["nodeName"]: runner.launched[
                _pod(cluster, n)["metadata"]["name"]
            ].cores
            for n in ("p0", "p1")
        }
    assert cores["qosflow-local-0"] == (host[0],)
    assert cores["qosflow-local-1"] == (host[1 % len(host)],)


def test_preemption_evicts_on_one_node_only(tmp_path: Path, clock: VirtualClock) -> None:
    runner = ScriptedRunner(default=Script(total_steps=1000, term_exit_s=2))
    with LocalCluster(
        nodes=2, cpus=1, state_dir=tmp_path, clock=clock, runner=runner, preemption=True
    ) as cluster:
        kube = Api(cluster.kube_url, cluster.token)
        for name, value in (("low", 10), ("high", 1000)):
            body = {"metadata": {"name": name}, "value": value}
            kube("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", json=body)
        argo = Api(cluster.argo_url, cluster.token)
        for name in ("l0", "l1"):
            argo("POST", f"/api/v1/workflows/{NS}", json=container_wf(name, priority_class="low"))
        clock.advance(1)
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("boss", priority_class="high"))
        clock.advance(1)
        boss = _pod(cluster, "boss")
        victims = [
            n
            for n in ("l0", "l1")
            if any(
                c["type"] == "DisruptionTarget" for c in _pod(cluster, n)["status"]["conditions"]
            )
        ]
        assert len(victims) == 1
        assert boss["status"]["nominatedNodeName"] == _pod(cluster, victims[0])["spec"]["nodeName"]
        for _ in range(4):
            clock.advance(1)
        assert _pod(cluster, "boss")["spec"]["nodeName"] == boss["status"]["nominatedNodeName"]
