"""``qosflow local up`` / ``local down``: a real background daemon on free ports."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from qosflow.local.cli import add_subcommands, read_info

from .conftest import NS, container_wf
from .outputs import out_dir, with_output
from .test_readoption import SCRIPT

pytestmark = pytest.mark.slow


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qosflow")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_up_serves_and_down_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "local"
    assert _run(["local", "up", "--cpus", "1", "--port", "0", "--state-dir", str(state)]) == 0
    try:
        printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
        info = json.loads((state / "cluster.json").read_text())
        assert printed["argo_url"] == info["argo_url"] and printed["token"] == info["token"]
        assert (state / "cluster.json").stat().st_mode & 0o077 == 0
        version = requests.get(
            info["argo_url"] + "/api/v1/version",
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=5,
        )
        assert version.json()["version"] == "v4.1.2"
        nodes = requests.get(
            info["kube_url"] + "/api/v1/nodes",
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=5,
        )
        assert nodes.json()["items"][0]["status"]["allocatable"]["cpu"] == "1"
        assert _run(["local", "up", "--port", "0", "--state-dir", str(state)]) == 0
        assert "already running" in capsys.readouterr().out
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0
    assert read_info(state) is None
    assert (state / "state.json").exists()
    assert _run(["local", "down", "--state-dir", str(state)]) == 0
    assert "not running" in capsys.readouterr().out


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A state directory whose daemon is stopped at the end, whatever the test did."""
    path = tmp_path / "local"
    yield path
    _run(["local", "down", "--state-dir", str(path)])


def _up(state: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert _run(["local", "up", "--cpus", "2", "--port", "0", "--state-dir", str(state)]) == 0
    lines = capsys.readouterr().out.splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def _get(info: dict[str, str], path: str, token: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return requests.get(info["argo_url"] + path, headers=headers, timeout=10)


def test_the_token_survives_a_restart_and_is_never_logged(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _up(state, capsys)
    try:
        assert _get(first, "/api/v1/version", "wrong").status_code == 401
        assert _get(first, "/api/v1/version", first["token"]).status_code == 200
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0
    second = _up(state, capsys)
    try:
        assert second["token"] == first["token"]  # existing clients are not locked out
        assert _get(second, "/api/v1/version", first["token"]).status_code == 200
        assert (state / "token").stat().st_mode & 0o777 == 0o600
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0
    assert first["token"] not in (state / "server.log").read_text()
    assert not (state / "cluster.json").exists()


def test_up_with_a_poisoned_state_starts_and_down_cleans_up(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state.mkdir()
    wf = container_wf("poison")["workflow"]
    wf["spec"]["templates"][0]["container"]["resources"] = {"requests": {"cpu": "abc"}}
    wf.update(apiVersion="argoproj.io/v1alpha1", kind="Workflow")
    wf["metadata"].update(namespace=NS, uid="u1", resourceVersion="3")
    escape = json.loads(json.dumps(wf))
    escape["metadata"].update(name="state.json", namespace="..", uid="u2")
    doc = {
        "version": 1,
        "resourceVersion": 3,
        "seq": 2,
        "objects": [{"order": 1, "object": wf}, {"order": 2, "object": escape}],
        "runtime": {},
    }
    (state / "state.json").write_text(json.dumps(doc))
    info = _up(state, capsys)
    try:
        deadline = time.monotonic() + 30
        while (phase := _phase(info, "poison")) != "Error" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert phase == "Error"
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0
    assert not (state / "cluster.json").exists()
    assert "metadata.namespace" in (state / "quarantine.json").read_text()


def _phase(info: dict[str, str], name: str) -> str:
    wf: dict[str, Any] = _get(info, f"/api/v1/workflows/{NS}/{name}", info["token"]).json()
    return str(wf.get("status", {}).get("phase") or "")


def _done(info: dict[str, str], name: str) -> int:
    wf: dict[str, Any] = _get(info, f"/api/v1/workflows/{NS}/{name}", info["token"]).json()
    return int((wf.get("status", {}).get("progress") or "0/1").split("/")[0])


def _wait(predicate: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_a_killed_daemon_comes_back_with_its_pods_and_token(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _up(state, capsys)
    try:
        request = container_wf("long", command=["python", "-c", SCRIPT, "100000", "0"])
        request = with_output(request, "long")  # the pod writes pid, starts... there
        headers = {"Authorization": f"Bearer {first['token']}"}
        url = f"{first['argo_url']}/api/v1/workflows/{NS}"
        assert requests.post(url, json=request, headers=headers, timeout=10).status_code == 200
        _wait(lambda: _done(first, "long") >= 3)
        os.kill(int(first["pid"]), signal.SIGKILL)  # a crash: nothing is shut down
        _wait(lambda: read_info(state) is None)
        second = _up(state, capsys)
        assert second["token"] == first["token"]
        assert _phase(second, "long") == "Running"
        assert _done(second, "long") >= 3  # the last known progress at once, never 0/M
        pid = int((out_dir(state, "long") / "pid").read_text())
        assert os.path.exists(f"/proc/{pid}")  # the same container, still running
        assert (out_dir(state, "long") / "starts").read_text() == "x"
        url = f"{second['argo_url']}/api/v1/workflows/{NS}"
        stop = requests.put(f"{url}/long/stop", headers=headers, timeout=10)
        assert stop.status_code == 200
        _wait(lambda: _phase(second, "long") == "Failed", timeout_s=30)
        assert (out_dir(state, "long") / "got-sigterm").exists()
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0


def test_up_with_preemption_and_an_older_kubernetes(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["local", "up", "--port", "0", "--state-dir", str(state)]
    assert _run([*argv, "--preemption", "--kubernetes-version", "1.32"]) == 0
    try:
        printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
        assert printed["preemption"] == "on" and printed["kubernetes"] == "1.32"
        headers = {"Authorization": f"Bearer {printed['token']}"}
        version = requests.get(printed["kube_url"] + "/version", headers=headers, timeout=10)
        assert version.json()["minor"] == "32"
        resize = requests.patch(
            f"{printed['kube_url']}/api/v1/namespaces/{NS}/pods/any/resize",
            json={},
            headers={**headers, "Content-Type": "application/strategic-merge-patch+json"},
            timeout=10,
        )
        assert resize.status_code == 404 and resize.json()["kind"] == "Status"
        assert _run(argv) == 0  # already running: its settings are shown, and that they differ
        captured = capsys.readouterr()
        assert "preemption: on" in captured.out and "kubernetes: 1.32" in captured.out
        assert "it runs with preemption: on, kubernetes: 1.32" in captured.err
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0
    with pytest.raises(SystemExit):
        _run([*argv, "--kubernetes-version", "2.1"])
    assert "--kubernetes-version: must look like 1.35" in capsys.readouterr().err


def test_up_prints_the_default_settings(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = _up(state, capsys)
    assert info["preemption"] == "off" and info["kubernetes"] == "1.35"
    assert json.loads((state / "cluster.json").read_text())["kubernetes_version"] == "1.35"
