"""The daemon's token and ``local down`` (issue 15, C and A): the token survives restarts of the
same state directory (mode 0600; a given token wins), nothing prints it, and ``down`` never
crashes and always removes ``cluster.json``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from qosflow.local import LocalCluster, ScriptedRunner, VirtualClock
from qosflow.local.cli import INFO_FILE, TOKEN_FILE, down, read_info, stored_token
from qosflow.local.supervisor import process_start_ticks

from .conftest import NS, Api, container_wf


def test_stored_token_survives_restarts_and_a_given_token_wins(tmp_path: Path) -> None:
    first = stored_token(tmp_path)
    path = tmp_path / TOKEN_FILE
    assert len(first) >= 24 and path.read_text().strip() == first
    assert path.stat().st_mode & 0o777 == 0o600
    assert stored_token(tmp_path) == first  # the same state directory keeps its token
    path.chmod(0o644)
    assert stored_token(tmp_path) == first and path.stat().st_mode & 0o777 == 0o600
    assert stored_token(tmp_path, "given-token") == "given-token"
    assert stored_token(tmp_path) == "given-token"  # the token in effect is kept
    path.write_text("\n")
    assert stored_token(tmp_path) not in ("", "given-token")  # an empty file: a new one


def test_no_repr_or_log_of_the_cluster_shows_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "tok-4f9c1d-very-secret"
    with (
        caplog.at_level(logging.DEBUG),
        LocalCluster(
            state_dir=tmp_path, token=token, clock=VirtualClock(), runner=ScriptedRunner()
        ) as cluster,
    ):
        argo = Api(cluster.argo_url, token)
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("w"))
        requests.get(f"{cluster.argo_url}/api/v1/info", headers={"Authorization": "Bearer x"})
        argo("POST", f"/api/v1/workflows/{NS}", data=b"[" * 5000)
        texts = [repr(cluster), str(cluster), repr(cluster._argo), repr(cluster._kube)]
    assert all(token not in text for text in texts)
    assert "LocalCluster(cpus=2" in texts[0]
    assert token not in caplog.text
    assert token not in (tmp_path / "state.json").read_text()


def _args(state: Path, timeout: float = 60.0) -> argparse.Namespace:
    return argparse.Namespace(state_dir=str(state), timeout=timeout)


def test_down_removes_a_stale_or_broken_cluster_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    info = tmp_path / INFO_FILE
    for text in (
        json.dumps({"pid": gone.pid, "token": "t"}),
        "{torn",
        json.dumps({"pid": "x"}),
        json.dumps([1, 2]),
        # a live pid that is not the daemon any more (another start time): never signalled
        json.dumps({"pid": os.getpid(), "start_ticks": -1}),
    ):
        info.write_text(text)
        assert down(_args(tmp_path)) == 0
        assert "not running" in capsys.readouterr().out
        assert not info.exists()


@pytest.mark.slow
def test_down_kills_a_daemon_that_does_not_stop_and_still_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        ticks = process_start_ticks(stubborn.pid)
        (tmp_path / INFO_FILE).write_text(json.dumps({"pid": stubborn.pid, "start_ticks": ticks}))
        assert read_info(tmp_path) is not None
        assert down(_args(tmp_path, timeout=0.3)) == 1
        assert "did not stop within 0 s and was killed" in capsys.readouterr().err
        stubborn.wait(timeout=10)  # already reaped by ``down``'s liveness check
        assert process_start_ticks(stubborn.pid) is None  # killed
        assert not (tmp_path / INFO_FILE).exists()
    finally:
        stubborn.kill()
        stubborn.wait()
