"""The HTTP layer answers every malformed request (issue 15, E): bad framing is a 400, a body that
does not arrive in time a 408, an oversized body a 413 (all before the body is read where they
can be), the token is checked before any body is read, numeric query parameters are checked, and
deep or non-JSON bodies are 400 — never a dropped connection, a hang or a 500."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from qosflow.local import LocalCluster, ScriptedRunner, VirtualClock

from .conftest import NS, Api, container_wf

LIMIT = 64 * 1024
WORKFLOWS = f"/api/v1/workflows/{NS}"
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster with a short read timeout and a small body limit."""
    with LocalCluster(
        state_dir=tmp_path / "state",
        clock=VirtualClock(),
        runner=ScriptedRunner(),
        read_timeout_s=0.3,
        max_body_bytes=LIMIT,
    ) as cluster:
        yield cluster


def _connect(base: str, timeout: float = 5.0) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, Any]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    data = response.read()
    return response.status, json.loads(data) if data else None


def _auth(cluster: LocalCluster) -> dict[str, str]:
    return {"Authorization": f"Bearer {cluster.token}"}


@pytest.mark.parametrize("listener", ["argo", "kube"])
@pytest.mark.parametrize("length", ["abc", "-1", "1e3", " ", "12, 13"])
def test_bad_content_length_is_400(tight: LocalCluster, listener: str, length: str) -> None:
    base = tight.argo_url if listener == "argo" else tight.kube_url
    path = WORKFLOWS if listener == "argo" else PODS
    with _connect(base) as sock:
        sock.sendall(_head("POST", path, {**_auth(tight), "Content-Length": length}))
        status, body = _answer(sock)
    assert status == 400
    if listener == "argo":
        assert body["code"] == 3 and "bad Content-Length" in body["message"]
    else:
        assert body["kind"] == "Status" and body["reason"] == "BadRequest"


def test_short_body_is_408_after_the_read_timeout(tight: LocalCluster) -> None:
    # a server without a read timeout (or one of 5 s or more) leaves the client's 5 s socket
    # timeout to end the test with an error; the message names the timeout the reader applied
    with _connect(tight.argo_url) as sock:
        sock.sendall(_head("POST", WORKFLOWS, {**_auth(tight), "Content-Length": "100"}) + b"{")
        status, body = _answer(sock)
        assert status == 408 and "did not arrive within 0.3 s" in body["message"]
        assert sock.recv(1) == b""  # and the connection is closed cleanly


def test_a_trickled_body_cannot_outlast_the_timeout(tight: LocalCluster) -> None:
    sock = _connect(tight.argo_url)
    sock.sendall(_head("POST", WORKFLOWS, {**_auth(tight), "Content-Length": "1000"}))
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.05):
            try:
                sock.send(b" ")
            except OSError:
                return

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        # a timeout restarted by every byte would let the body arrive whole after 50 s: a 400
        # (not JSON), long after the client's 5 s socket timeout has ended the test
        status, _ = _answer(sock)
        assert status == 408
    finally:
        stop.set()
        feeder.join()
        sock.close()


def test_token_is_checked_before_any_body_is_read(cluster: LocalCluster) -> None:
    with _connect(cluster.argo_url, timeout=2) as sock:  # the server would wait 5 s for a body
        sock.sendall(_head("POST", WORKFLOWS, {"Content-Length": "100"}))
        status, body = _answer(sock)
    assert status == 401 and body["code"] == 16
    with _connect(cluster.kube_url, timeout=2) as sock:
        sock.sendall(_head("PATCH", f"{PODS}/x", {"Content-Length": "5000000"}))
        assert _answer(sock)[0] == 401


def test_401_with_a_small_body_keeps_the_connection(cluster: LocalCluster) -> None:
    body = json.dumps(container_wf("kept")).encode()
    with _connect(cluster.argo_url) as sock:
        sock.sendall(_head("POST", WORKFLOWS, {"Content-Length": str(len(body))}) + body)
        assert _answer(sock)[0] == 401
        sock.sendall(_head("GET", "/api/v1/version", _auth(cluster)))
        assert _answer(sock)[0] == 200


def test_expect_100_continue_is_sent_only_after_the_token(cluster: LocalCluster) -> None:
    body = json.dumps(container_wf("expect")).encode()
    headers = {"Content-Length": str(len(body)), "Expect": "100-continue"}
    with _connect(cluster.argo_url) as sock:
        sock.sendall(_head("POST", WORKFLOWS, headers))
        assert _answer(sock)[0] == 401  # a final answer, no "100 Continue" first
    with _connect(cluster.argo_url) as sock:
        sock.sendall(_head("POST", WORKFLOWS, {**headers, **_auth(cluster)}))
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += sock.recv(1)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert _answer(sock)[0] == 200


def test_a_declared_body_over_the_limit_is_413_before_it_is_read(tight: LocalCluster) -> None:
    for base, path in ((tight.argo_url, WORKFLOWS), (tight.kube_url, PODS)):
        with _connect(base) as sock:
            headers = {**_auth(tight), "Content-Length": str(LIMIT + 1)}
            sock.sendall(_head("POST", path, headers))
            status, body = _answer(sock)
        assert status == 413 and f"limit is {LIMIT}" in body["message"]
        assert (
            body["code"] == 8
            if base == tight.argo_url
            else body["reason"] == "RequestEntityTooLarge"
        )


def test_a_sent_body_over_the_limit_is_413_not_a_reset(tight: LocalCluster) -> None:
    argo = Api(tight.argo_url, tight.token)
    response = argo("POST", WORKFLOWS, data=b"x" * (4 * LIMIT))
    assert response.status_code == 413

    def chunks() -> Iterator[bytes]:
        for _ in range(2 * LIMIT // 1024):
            yield b" " * 1024

    assert argo("POST", WORKFLOWS, data=chunks()).status_code == 413
    assert argo("GET", "/api/v1/version").status_code == 200


def test_a_chunked_body_is_accepted(argo: Api) -> None:
    text = json.dumps(container_wf("chunky")).encode()

    def chunks() -> Iterator[bytes]:
        yield from (text[i : i + 7] for i in range(0, len(text), 7))

    response = argo("POST", WORKFLOWS, data=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["metadata"]["name"] == "chunky"


def test_malformed_chunked_encoding_is_400(tight: LocalCluster) -> None:
    with _connect(tight.argo_url) as sock:
        head = _head("POST", WORKFLOWS, {**_auth(tight), "Transfer-Encoding": "chunked"})
        sock.sendall(head + b"zz\r\n")
        assert _answer(sock)[0] == 400
    with _connect(tight.argo_url) as sock:
        head = _head("POST", WORKFLOWS, {**_auth(tight), "Transfer-Encoding": "gzip"})
        assert (sock.sendall(head), _answer(sock)[0])[1] == 501


@pytest.mark.parametrize(
    ("listener", "path", "param"),
    [
        ("argo", f"{WORKFLOWS}?listOptions.limit=abc", "listOptions.limit"),
        ("argo", f"{WORKFLOWS}?listOptions.limit=-1", "listOptions.limit"),
        ("argo", f"{WORKFLOWS}?listOptions.limit=99999999999999999999", "listOptions.limit"),
        ("argo", f"{WORKFLOWS}?listOptions.continue=abc", "listOptions.continue"),
        ("kube", f"{PODS}?limit=abc", "limit"),
        ("kube", f"{PODS}?continue=x", "continue"),
        ("kube", f"{PODS}?timeoutSeconds=soon", "timeoutSeconds"),
        ("kube", f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows?limit=1.5", "limit"),
    ],
)
def test_numeric_query_parameters_are_400_naming_them(
    cluster: LocalCluster, listener: str, path: str, param: str
) -> None:
    base = cluster.argo_url if listener == "argo" else cluster.kube_url
    response = Api(base, cluster.token)("GET", path)
    assert response.status_code == 400
    assert response.json()["message"].startswith(f"{param}: Invalid value")


def test_pod_log_numeric_parameters_are_400(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", WORKFLOWS, json=container_wf("logs"))
    clock.advance(1)
    for query in ("tailLines=x", "tailLines=-3", "limitBytes=1e3", "sinceSeconds=soon"):
        response = kube("GET", f"{PODS}/logs/log?{query}")
        assert response.status_code == 400 and query.split("=")[0] in response.json()["message"]


def test_kube_lists_page_with_limit_and_continue(argo: Api, kube: Api, clock: VirtualClock) -> None:
    for name in ("p1", "p2", "p3"):
        argo("POST", WORKFLOWS, json=container_wf(name, cpu="0"))
    clock.advance(1)
    first = kube("GET", f"{PODS}?limit=2").json()
    assert len(first["items"]) == 2 and first["metadata"]["continue"]
    rest = kube("GET", f"{PODS}?limit=2&continue={first['metadata']['continue']}").json()
    assert [p["metadata"]["name"] for p in rest["items"]] == ["p3"]
    assert "continue" not in rest["metadata"]


def _valid_with(extra: str) -> bytes:
    """A workflow the controller could run, with ``extra`` as the value of an unknown field."""
    text = json.dumps(container_wf("odd")).replace('"entrypoint"', '"x": EXTRA, "entrypoint"')
    return text.replace("EXTRA", extra).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,
        b'{"a":' * 2_000 + b"1" + b"}" * 2_000,
        _valid_with("[" * 150 + "]" * 150),  # deeper than 100: refused, not stored
        _valid_with("NaN"),  # Go's decoder refuses it (and state.json would not be JSON)
        _valid_with("-Infinity"),
        b"\xff\xfe{not utf-8",
    ],
)
def test_deep_or_non_json_bodies_are_400(argo: Api, data: bytes) -> None:
    response = argo("POST", WORKFLOWS, data=data, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == 3
    assert argo("GET", f"{WORKFLOWS}/odd").status_code == 404
    assert argo("POST", WORKFLOWS, data=_valid_with("[[1]]")).status_code == 200  # shallow: fine


def test_apply_patch_yaml_is_converted_like_kubernetes(
    cluster: LocalCluster, argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", WORKFLOWS, json=container_wf("yml"))
    clock.advance(1)
    apply = {"Content-Type": "application/apply-patch+yaml"}
    dated = kube(
        "PATCH", f"{PODS}/yml", data=b"metadata: {labels: {day: 2026-01-01}}", headers=apply
    )
    assert dated.status_code == 200 and dated.json()["metadata"]["labels"]["day"] == "2026-01-01"
    cluster.store.save(force=True)  # the state stays JSON
    bomb = b"a: &a [x,x,x,x,x,x,x,x,x,x]\n" + b"".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n".encode()
        for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )
    assert kube("PATCH", f"{PODS}/yml", data=bomb, headers=apply).status_code == 400
    deep = b"metadata: " + b"[" * 5000 + b"]" * 5000
    assert kube("PATCH", f"{PODS}/yml", data=deep, headers=apply).status_code == 400


ARGO_MALFORMED: list[tuple[str, str, Any]] = [
    ("POST", WORKFLOWS, []),
    ("POST", WORKFLOWS, "x"),
    ("POST", WORKFLOWS, {"workflow": []}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": []}}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": {"name": "a"}}, "createOptions": "all"}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": {"name": "a"}}, "createOptions": {"dryRun": 1}}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": {"name": 5}, "spec": {}}}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": {"name": "a"}, "spec": {"templates": [7]}}}),
    ("POST", WORKFLOWS, {"workflow": {"metadata": {"name": "a"}, "spec": {"priority": 2**40}}}),
    ("POST", f"{WORKFLOWS}/submit", {"resourceKind": "WorkflowTemplate", "submitOptions": "x"}),
    ("POST", f"{WORKFLOWS}/submit", {"resourceKind": 5}),
    ("POST", f"{WORKFLOWS}/lint", {"workflow": {"spec": "x"}}),
    ("POST", f"/api/v1/workflow-templates/{NS}", {"template": {"metadata": "x"}}),
    ("POST", f"/api/v1/workflow-templates/{NS}", {"template": []}),
]
KUBE_MALFORMED: list[tuple[str, str, str, Any]] = [
    ("PATCH", f"{PODS}/m", "application/json-patch+json", [1, 2]),
    (
        "PATCH",
        f"{PODS}/m",
        "application/json-patch+json",
        [{"op": "replace", "path": "", "value": []}],
    ),
    (
        "PATCH",
        f"{PODS}/m",
        "application/json-patch+json",
        [{"op": "add", "path": "/metadata/name/x"}],
    ),
    ("PATCH", f"{PODS}/m", "application/merge-patch+json", {"metadata": {"labels": {"a": 1}}}),
    ("PATCH", f"{PODS}/m", "application/merge-patch+json", {"metadata": "x"}),
    ("PATCH", f"{PODS}/m/resize", "application/strategic-merge-patch+json", [1]),
    (
        "PATCH",
        f"{PODS}/m/resize",
        "application/json-patch+json",
        [{"op": "replace", "path": "/spec/containers", "value": [1]}],
    ),
    (
        "PATCH",
        f"{PODS}/m/resize",
        "application/json-patch+json",
        [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "abc"}],
    ),
    (
        "PATCH",
        f"{PODS}/m/resize",
        "application/json-patch+json",
        [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "-1"}],
    ),
    (
        "PATCH",
        f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/m",
        "application/merge-patch+json",
        {"spec": {"priority": "high"}},
    ),
    (
        "PATCH",
        f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/m",
        "application/merge-patch+json",
        {"status": {"nodes": []}},
    ),
    (
        "PATCH",
        f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/m",
        "application/json-patch+json",
        [{"op": "replace", "path": "", "value": 3}],
    ),
    (
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        "application/json",
        {"metadata": "x", "value": 1},
    ),
    (
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        "application/json",
        {"metadata": {"name": "Bad_Name"}, "value": 1},
    ),
    (
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        "application/json",
        {"metadata": {"name": "big"}, "value": 2**40},
    ),
    (
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        "application/json",
        {"metadata": {"name": "g"}, "value": 1, "globalDefault": "yes"},
    ),
]


def test_malformed_requests_never_answer_500(
    cluster: LocalCluster, argo: Api, kube: Api, clock: VirtualClock
) -> None:
    argo("POST", WORKFLOWS, json=container_wf("m"))
    clock.advance(1)
    for method, path, body in ARGO_MALFORMED:
        response = argo(method, path, json=body)
        assert 400 <= response.status_code < 500, (path, body, response.text)
        assert set(response.json()) == {"code", "message"}
    for method, path, ctype, body in KUBE_MALFORMED:
        response = kube(method, path, json=body, headers={"Content-Type": ctype})
        assert 400 <= response.status_code < 500, (path, body, response.text)
        assert response.json()["kind"] == "Status"
    clock.advance(1)
    assert argo("GET", f"{WORKFLOWS}/m").json()["status"]["phase"] == "Running"
    assert requests.get(cluster.argo_url + "/api/v1/version", timeout=5).status_code == 401
