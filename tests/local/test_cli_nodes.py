"""``qosflow local up --nodes N --gpus G`` (issue 18): the daemon serves that many nodes, says so
in ``cluster.json`` and in what ``up`` prints, and refuses a bad count before starting."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import requests

from qosflow.local.cli import add_subcommands

pytestmark = pytest.mark.slow


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qosflow")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_up_with_two_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "local"
    argv = ["local", "up", "--nodes", "2", "--cpus", "1", "--gpus", "1", "--port", "0"]
    assert _run([*argv, "--state-dir", str(state)]) == 0
    try:
        printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
        assert printed["nodes"] == "2 x 1 CPU, 1 nvidia.com/gpu (qosflow-local-0, qosflow-local-1)"
        info = json.loads((state / "cluster.json").read_text())
        assert (info["nodes"], info["cpus"], info["gpus"]) == (2, 1, 1)
        assert info["node_names"] == ["qosflow-local-0", "qosflow-local-1"]
        nodes = requests.get(
            info["kube_url"] + "/api/v1/nodes",
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=5,
        ).json()["items"]
        assert [n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes] == ["1", "1"]
        assert _run(["local", "up", "--nodes", "3", "--port", "0", "--state-dir", str(state)]) == 0
        captured = capsys.readouterr()
        assert "already running" in captured.out
        assert "note: it runs with nodes: 2 x 1 CPU, 1 nvidia.com/gpu" in captured.err
    finally:
        assert _run(["local", "down", "--state-dir", str(state)]) == 0


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--nodes", "0"], "must be between 1 and 254 (got 0)"),
        (["--gpus", "-1"], "must be >= 0 (got -1)"),
        (["--gpu-resource", "gpu"], "must be an extended resource name"),
    ],
)
def test_bad_settings_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], error: str
) -> None:
    with pytest.raises(SystemExit):
        _run(["local", "up", *flags, "--state-dir", str(tmp_path)])
    assert error in capsys.readouterr().err
    assert not (tmp_path / "cluster.json").exists()
