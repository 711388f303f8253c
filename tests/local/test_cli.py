"""``qosflow local up`` / ``local down``: a real background daemon on free ports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import requests

from qosflow.local.cli import add_subcommands, read_info

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
