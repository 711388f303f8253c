"""Client construction details: credentials placement, secrets hygiene, request bodies."""

from __future__ import annotations

import json
import logging

import kubernetes_validate
import pytest
import requests

from qosflow.core.errors import ClusterError, NotFoundError, SpecError
from qosflow_argo.argo_cluster import ArgoCluster
from qosflow_argo.argo_server import ArgoServer
from qosflow_argo.kube import api_client_from_url
from qosflow_argo.resize import resize_body, resize_memory
from qosflow_argo.retry import Retrier

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
    body = resize_body("main", 3, memory="1536Mi")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, **body}
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    res = body["spec"]["containers"][0]["resources"]
    # cpu and memory move together; requests == limits: Guaranteed stays Guaranteed
    assert res["requests"] == res["limits"] == {"cpu": "3", "memory": "1536Mi"}
    cpu_only = resize_body("main", 3)["spec"]["containers"][0]["resources"]
    assert cpu_only["requests"] == cpu_only["limits"] == {"cpu": "3"}


def _segment(units: str, memory: str | None) -> dict[str, object]:
    params = [{"name": "units", "value": units}]
    if memory is not None:
        params.append({"name": "memory", "value": memory})
    return {"metadata": {"name": "w"}, "spec": {"arguments": {"parameters": params}}}


def _pod(cpu: str, memory: str | None) -> dict[str, object]:
    limits = {"cpu": cpu} | ({"memory": memory} if memory else {})
    resources = {"requests": dict(limits), "limits": limits}
    return {"spec": {"containers": [{"name": "main", "resources": resources}]}}


@pytest.mark.parametrize(
    ("submitted", "pod", "units", "shrink", "expected"),
    [
        (("1", "256Mi"), ("1", "256Mi"), 2, True, "512Mi"),  # 1 -> 2 CPUs: memory doubles
        (("3", "1536Mi"), ("3", "1536Mi"), 5, True, "2560Mi"),  # per unit 512Mi, keeps suffix
        (("3", "1Gi"), ("3", "1Gi"), 2, True, "715827883"),  # 1Gi/3 is no whole Gi: bytes, ceil
        (("2", "1Gi"), ("4", "2Gi"), 1, True, "512Mi"),  # from the submit ratio, not the pod's
        (("2", "1Gi"), ("2", "1Gi"), 1, False, None),  # Kubernetes 1.33: limits never shrink
        (("2", "1Gi"), ("2", "1Gi"), 4, False, "2Gi"),  # ... but may grow
        (("2", None), ("2", "1Gi"), 4, True, "2Gi"),  # no memory argument: the pod's ratio
        (("2", None), ("2", None), 4, True, None),  # no memory anywhere: cpu only
        (("2", "lots"), ("2", "1Gi"), 4, True, "2Gi"),  # unparseable argument: the pod's ratio
    ],
)
def test_resize_memory_follows_units_times_memory_per_unit(
    submitted: tuple[str, str | None],
    pod: tuple[str, str | None],
    units: int,
    shrink: bool,
    expected: str | None,
) -> None:
    got = resize_memory(_segment(*submitted), _pod(*pod), units, may_shrink=shrink)
    assert got == expected


class Canned(requests.adapters.BaseAdapter):
    """A transport that answers every request with one canned response."""

    def __init__(self, status: int, body: dict[str, object], exc: Exception | None = None) -> None:
        super().__init__()
        self.status, self.body, self.exc = status, body, exc
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:
        self.sent.append(request)
        if self.exc is not None:
            raise self.exc
        resp = requests.Response()
        resp.status_code = self.status
        resp._content = json.dumps(self.body).encode()
        resp.request = request
        return resp

    def close(self) -> None:
        pass


def server(adapter: Canned) -> ArgoServer:
    session = requests.Session()
    session.mount("https://", adapter)
    return ArgoServer(
        "https://argo.example:2746/argo/",
        token=SECRET,
        namespace="ml",
        session=session,
        retrier=Retrier(sleep=lambda s: None),
    )


def test_server_errors_echoing_the_token_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    adapter = Canned(400, {"code": 3, "message": f"bad header Bearer {SECRET}"})
    with pytest.raises(ClusterError) as err:
        server(adapter).get_workflow("x")
    assert SECRET not in str(err.value) and "Bearer ***" in str(err.value)
    assert err.value.status == 400 and not err.value.retryable
    assert SECRET not in caplog.text
    sent = adapter.sent[0]
    assert sent.url == "https://argo.example:2746/argo/api/v1/workflows/ml/x"  # base-href kept
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"


def test_not_found_and_tls_failures_are_not_retried() -> None:
    adapter = Canned(404, {"code": 5, "message": 'workflows.argoproj.io "x" not found'})
    with pytest.raises(NotFoundError, match="not found"):
        server(adapter).get_workflow("x")
    assert len(adapter.sent) == 1
    tls = Canned(0, {}, requests.exceptions.SSLError("certificate verify failed"))
    with pytest.raises(ClusterError, match="TLS verification failed") as err:
        server(tls).get_workflow("x")
    assert len(tls.sent) == 1 and not err.value.retryable
