"""Client construction details: credentials placement, secrets hygiene, request bodies."""

from __future__ import annotations

import kubernetes_validate
import pytest

from qosflow.errors import SpecError
from qosflow_argo.argo_cluster import ArgoCluster, resize_body
from qosflow_argo.kube import api_client_from_url

SECRET = "s3cr3t-token-value"


def test_kubernetes_client_sends_a_bearer_header_for_client_36_and_37() -> None:
    api = api_client_from_url("https://k8s.example:6443", token=SECRET, verify=False)
    auth = api.configuration.auth_settings()["BearerToken"]
    assert (auth["in"], auth["key"], auth["value"]) == (
        "header",
        "authorization",
        f"Bearer {SECRET}",
    )
    assert api.configuration.retries == 0  # our Retrier owns the budget
    api.close()


def test_no_secret_in_reprs() -> None:
    cluster = ArgoCluster(
        "https://argo.example:2746", token=SECRET, kube_url="https://k8s.example:6443"
    )
    assert SECRET not in repr(cluster) + repr(cluster.argo) + repr(cluster.kube)
    cluster.close()


def test_from_env_needs_the_argo_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QOSFLOW_ARGO_URL", raising=False)
    with pytest.raises(SpecError, match="QOSFLOW_ARGO_URL"):
        ArgoCluster.from_env()


def test_resize_body_is_a_valid_partial_pod_that_keeps_qos() -> None:
    body = resize_body("main", 3)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, **body}
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    res = body["spec"]["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "3"}  # Guaranteed stays Guaranteed
