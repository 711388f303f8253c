"""A restart of the server does not kill healthy training (issue 15, D): a container still running
is re-adopted (its progress is still read, its resizes and stops still work, its progress never
drops to 0/M), and one that ended while the server was down gets its real exit code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
from qosflow.local.supervisor import EXIT_FILE

from .conftest import NS, Api, container_wf
from .outputs import out_dir, with_output

WORKFLOWS = f"/api/v1/workflows/{NS}"
RETRY = {"limit": 3, "retryPolicy": "Always", "backoff": {"duration": "1s"}}


def _progress(wf: dict[str, Any] | None) -> tuple[int, int]:
    done, total = ((wf or {}).get("status", {}).get("progress") or "0/1").split("/")
    return int(done), int(total)


def _training(request: dict[str, Any]) -> dict[str, Any]:
    """Like the qosflow-train template: a retry strategy (a lost pod would be retried)."""
    request["workflow"]["spec"]["templates"][0]["retryStrategy"] = RETRY
    return request


def test_restart_readopts_scripted_pods_and_keeps_their_progress(tmp_path: Path) -> None:
    clock, runner = VirtualClock(), ScriptedRunner(default=Script(term_exit_s=2))
    first = LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=runner).start()
    Api(first.argo_url, first.token)("POST", WORKFLOWS, json=_training(container_wf("t", steps=40)))
    for _ in range(6):
        clock.advance(1)
    before = _progress(first.workflow("t"))
    assert before[0] >= 4
    first.crash()
    clock.advance(3)  # the server is down; the pod keeps running
    with LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=runner) as second:
        argo, kube = Api(second.argo_url, second.token), Api(second.kube_url, second.token)
        wf = argo("GET", f"{WORKFLOWS}/t").json()
        assert wf["status"]["phase"] == "Running"
        assert _progress(wf)[0] >= before[0] + 3  # read at once, never 0/40
        retry = wf["status"]["nodes"]["t"]
        assert len(retry["children"]) == 1  # no new attempt
        pod = second.pods("t")[0]
        name = pod["metadata"]["name"]
        resize = {"spec": {"containers": [{"name": "main", "resources": {
            "requests": {"cpu": "2", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "64Mi"}
        }}]}}  # fmt: skip
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        response = kube(
            "PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/resize", json=resize, headers=headers
        )
        assert response.status_code == 200
        clock.advance(1)
        assert runner.launched[name].cpus == 2  # the adopted container was resized
        argo("PUT", f"{WORKFLOWS}/t/stop")
        for _ in range(4):
            clock.advance(1)
        assert runner.launched[name].signals == ["SIGTERM"]
        wf = argo("GET", f"{WORKFLOWS}/t").json()
        assert wf["status"]["phase"] == "Failed"
        assert wf["status"]["message"] == "Stopped with strategy 'Stop'"


SCRIPT = """
import os, pathlib, signal, sys, time
total, code = int(sys.argv[1]), int(sys.argv[2])
starts = pathlib.Path("starts")
starts.write_text((starts.read_text() if starts.exists() else "") + "x")
pathlib.Path("pid").write_text(str(os.getpid()))
term = []
signal.signal(signal.SIGTERM, lambda s, f: term.append(s))
progress = pathlib.Path(os.environ["ARGO_PROGRESS_FILE"])
step = 0
while True:
    if term:
        pathlib.Path("got-sigterm").write_text(str(step))
        sys.exit(0)
    if step < total:
        step += 1
        tmp = progress.with_name("progress.tmp")
        tmp.write_text(f"{step}/{total}\\n")
        os.replace(tmp, progress)
    elif pathlib.Path("go").exists():
        sys.exit(code)
    pathlib.Path("cpus").write_text(",".join(map(str, sorted(os.sched_getaffinity(0)))))
    time.sleep(0.05)
"""


def _cluster(state: Path) -> LocalCluster:
    return LocalCluster(cpus=2, state_dir=state, progress_tick_s=0.05, grace_s=5).start()


def _submit(
    cluster: LocalCluster, name: str, total: int, code: int = 0, retry: bool = True
) -> None:
    command = ["python", "-c", SCRIPT, str(total), str(code)]
    request = with_output(container_wf(name, cpu="1", command=command), name)
    request = _training(request) if retry else request
    assert Api(cluster.argo_url, cluster.token)("POST", WORKFLOWS, json=request).status_code == 200


def _workdir(cluster: LocalCluster, workflow: str) -> Path:
    """The pod's folder on the host (the supervisor's files), not the pod's working folder."""
    return cluster.state_dir / "pods" / NS / cluster.pods(workflow)[0]["metadata"]["name"]


def _phase(cluster: LocalCluster, name: str) -> str:
    return str((cluster.workflow(name) or {}).get("status", {}).get("phase") or "")


def _terminated(cluster: LocalCluster, name: str) -> dict[str, Any]:
    state = cluster.pods(name)[0]["status"]["containerStatuses"][0]["state"]
    terminated: dict[str, Any] = state["terminated"]
    return terminated


@pytest.fixture
def clusters() -> Iterator[list[LocalCluster]]:
    """Clusters a test starts, stopped (their containers too) at the end whatever happens.

    A crashed cluster is stopped too (after the one that re-adopted its containers), so nothing
    outlives a failed test.
    """
    started: list[LocalCluster] = []
    yield started
    for cluster in reversed(started):
        cluster.stop()


@pytest.mark.slow
def test_a_running_pod_is_readopted_after_a_crash(
    tmp_path: Path, clusters: list[LocalCluster]
) -> None:
    clusters.append(first := _cluster(tmp_path / "state"))
    _submit(first, "keep", 40)
    first.wait_until(lambda: _progress(first.workflow("keep"))[0] >= 5, timeout_s=60)
    workdir = out_dir(first, "keep")
    pid = int((workdir / "pid").read_text())
    first.crash()
    last = _progress(first.workflow("keep"))
    clusters.append(second := _cluster(tmp_path / "state"))
    wf = second.workflow("keep") or {}
    assert wf["status"]["phase"] == "Running"
    assert _progress(wf)[0] >= last[0]  # the last known progress, then onwards: never 0/40
    assert len(wf["status"]["nodes"]["keep"]["children"]) == 1  # no retry of a lost pod
    second.wait_until(lambda: _progress(second.workflow("keep"))[0] > last[0], timeout_s=30)
    if len(os.sched_getaffinity(0)) >= 2:
        kube = Api(second.kube_url, second.token)
        resize = {"spec": {"containers": [{"name": "main", "resources": {
            "requests": {"cpu": "2", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "64Mi"}
        }}]}}  # fmt: skip
        pod = second.pods("keep")[0]["metadata"]["name"]
        response = kube(
            "PATCH",
            f"/api/v1/namespaces/{NS}/pods/{pod}/resize",
            json=resize,
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert response.status_code == 200
        second.wait_until(lambda: len((workdir / "cpus").read_text().split(",")) == 2, timeout_s=30)
    (workdir / "go").write_text("")
    second.wait_until(lambda: _phase(second, "keep") in ("Succeeded", "Failed"), timeout_s=60)
    assert _phase(second, "keep") == "Succeeded"
    assert _progress(second.workflow("keep")) == (40, 40)
    assert (workdir / "starts").read_text() == "x"  # the same process all along
    assert int((workdir / "pid").read_text()) == pid
    assert _terminated(second, "keep")["exitCode"] == 0


@pytest.mark.slow
def test_stop_after_a_restart_reaches_the_adopted_container(
    tmp_path: Path, clusters: list[LocalCluster]
) -> None:
    clusters.append(first := _cluster(tmp_path / "state"))
    _submit(first, "halt", 10_000)
    first.wait_until(lambda: _progress(first.workflow("halt"))[0] >= 3, timeout_s=60)
    workdir = out_dir(first, "halt")
    first.crash()
    clusters.append(second := _cluster(tmp_path / "state"))
    assert Api(second.argo_url, second.token)("PUT", f"{WORKFLOWS}/halt/stop").status_code == 200
    second.wait_until(lambda: _phase(second, "halt") == "Failed", timeout_s=30)
    assert (workdir / "got-sigterm").exists()  # SIGTERM went through the supervisor
    assert (second.workflow("halt") or {})["status"]["message"] == "Stopped with strategy 'Stop'"
    assert _terminated(second, "halt")["exitCode"] == 0


@pytest.mark.slow
def test_a_pod_that_ended_while_the_server_was_down_gets_its_exit_code(
    tmp_path: Path, clusters: list[LocalCluster]
) -> None:
    clusters.append(first := _cluster(tmp_path / "state"))
    _submit(first, "ok", 3, code=0, retry=False)
    _submit(first, "bad", 3, code=3, retry=False)
    first.wait_until(
        lambda: all(_progress(first.workflow(n)) == (3, 3) for n in ("ok", "bad")), timeout_s=60
    )
    workdirs = {n: _workdir(first, n) for n in ("ok", "bad")}
    outs = {n: out_dir(first, n) for n in ("ok", "bad")}
    first.crash()
    for out in outs.values():
        (out / "go").write_text("")
    first.wait_until(lambda: all((w / EXIT_FILE).exists() for w in workdirs.values()), timeout_s=30)
    clusters.append(second := _cluster(tmp_path / "state"))
    second.wait_until(
        lambda: {_phase(second, n) for n in workdirs} <= {"Succeeded", "Failed"}, timeout_s=30
    )
    assert _phase(second, "ok") == "Succeeded" and _terminated(second, "ok")["exitCode"] == 0
    assert _progress(second.workflow("ok")) == (3, 3)
    assert _phase(second, "bad") == "Failed" and _terminated(second, "bad")["exitCode"] == 3
    assert (second.workflow("bad") or {})["status"]["message"] == "Error (exit code 3)"
    assert all((o / "starts").read_text() == "x" for o in outs.values())  # none re-run
