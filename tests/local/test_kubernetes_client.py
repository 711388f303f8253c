"""The official kubernetes client (what ArgoCluster uses) against the emulated Kubernetes API."""

from __future__ import annotations

import pytest
from kubernetes import client

from qosflow.local import LocalCluster, VirtualClock

from .conftest import NS, Api, container_wf


@pytest.fixture
def apis(cluster: LocalCluster) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = cluster.kube_url
    cfg.api_key = {"authorization": cluster.token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def test_client_reads_nodes_pods_and_resizes(
    apis: client.ApiClient, argo: Api, clock: VirtualClock
) -> None:
    core = client.CoreV1Api(apis)
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("kc", cpu="1"))
    clock.advance(1)
    assert core.list_node().items[0].status.allocatable["cpu"] == "2"
    pods = core.list_namespaced_pod(NS, label_selector="workflows.argoproj.io/workflow=kc").items
    assert [p.metadata.name for p in pods] == ["kc"]
    assert pods[0].status.container_statuses[0].allocated_resources["cpu"] == "1"
    body = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "2", "memory": "64Mi"},
                        "limits": {"cpu": "2", "memory": "64Mi"},
                    },
                }
            ]
        }
    }
    resized = core.patch_namespaced_pod_resize("kc", NS, body)
    assert resized.spec.containers[0].resources.requests["cpu"] == "2"
    clock.advance(1)
    conditions = {c.type: c for c in core.read_namespaced_pod("kc", NS).status.conditions}
    assert conditions["PodResizeInProgress"].observed_generation == 2
    with pytest.raises(client.ApiException) as missing:
        core.read_namespaced_pod("nope", NS)
    assert missing.value.status == 404


def test_client_patches_workflow_priority_and_priority_classes(
    apis: client.ApiClient, argo: Api
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("kp"))
    custom = client.CustomObjectsApi(apis)
    patched = custom.patch_namespaced_custom_object(
        "argoproj.io", "v1alpha1", NS, "workflows", "kp", {"spec": {"priority": 3}}
    )
    assert patched["spec"]["priority"] == 3
    scheduling = client.SchedulingV1Api(apis)
    klass = client.V1PriorityClass(
        metadata=client.V1ObjectMeta(name="kc-class"), value=5, preemption_policy="Never"
    )
    assert scheduling.create_priority_class(klass).value == 5
    with pytest.raises(client.ApiException) as immutable:
        scheduling.patch_priority_class("kc-class", {"value": 6})
    assert immutable.value.status == 422
