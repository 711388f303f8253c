"""Watch streams of the emulated Argo Server (``/api/v1/workflow-events/{ns}``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from qosflow.local import LocalCluster, ScriptedRunner, VirtualClock

from .conftest import NS, Api, container_wf


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[LocalCluster, VirtualClock]]:
    clock = VirtualClock()
    with LocalCluster(
        state_dir=tmp_path, clock=clock, runner=ScriptedRunner(), watch_keepalive_s=0.2
    ) as cluster:
        yield cluster, clock


def _collect(response: requests.Response, sse: bool, until: int, out: list[dict[str, Any]]) -> None:
    for line in response.iter_lines(decode_unicode=True):
        if not line or line.startswith(":"):
            continue
        out.append(json.loads(line[len("data: ") :] if sse else line))
        if len(out) >= until or "error" in out[-1]:
            return


@pytest.mark.parametrize("sse", [False, True])
def test_watch_sends_added_modified_deleted(
    watched: tuple[LocalCluster, VirtualClock], sse: bool
) -> None:
    cluster, clock = watched
    argo = Api(cluster.argo_url, cluster.token)
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("w-1", steps=3))
    headers = {"Accept": "text/event-stream"} if sse else {}
    response = argo(
        "GET",
        f"/api/v1/workflow-events/{NS}",
        stream=True,
        headers=headers,
        params={
            "listOptions.fieldSelector": "metadata.name=w-1",
            "fields": "result.type,result.object.status.phase",
        },
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"] == ("text/event-stream" if sse else "application/json")
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=_collect, args=(response, sse, 3, events))
    reader.start()
    # the stream compares states, as a real watch does: a change made before its first look is
    # part of its ADDED, and one undone before its next look is never seen, so each step waits
    # for the event before it (on a loaded machine the stream's thread may lag the requests)
    cluster.wait_until(lambda: len(events) >= 1, timeout_s=30)
    clock.advance(1)
    cluster.wait_until(lambda: len(events) >= 2, timeout_s=30)
    argo("DELETE", f"/api/v1/workflows/{NS}/w-1")
    reader.join(timeout=10)
    response.close()
    kinds = [e["result"]["type"] for e in events]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED" and "MODIFIED" in kinds
    assert all(set(e["result"].get("object", {})) <= {"status"} for e in events)


def test_watch_errors_before_the_stream_and_break_hook(
    watched: tuple[LocalCluster, VirtualClock],
) -> None:
    cluster, _ = watched
    argo = Api(cluster.argo_url, cluster.token)
    missing = argo(
        "GET",
        f"/api/v1/workflow-events/{NS}",
        params={"listOptions.fieldSelector": "metadata.name=nope"},
    )
    assert missing.status_code == 404 and missing.json()["code"] == 5
    unauthenticated = requests.get(f"{cluster.argo_url}/api/v1/workflow-events/{NS}", timeout=5)
    assert unauthenticated.status_code == 401
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("w-2"))
    response = argo("GET", f"/api/v1/workflow-events/{NS}", stream=True)
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=_collect, args=(response, False, 10, events))
    reader.start()
    cluster.wait_until(lambda: len(events) >= 1, timeout_s=10)
    cluster.break_watches()
    reader.join(timeout=10)
    assert events[0]["result"]["type"] == "ADDED"
    assert events[-1] == {
        "error": {
            "grpc_code": 8,
            "http_code": 429,
            "message": "EOF",
            "http_status": "Too Many Requests",
            "details": [],
        }
    }
