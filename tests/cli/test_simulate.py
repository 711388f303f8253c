"""``qosflow simulate`` / ``qosflow bound``: files, determinism, errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from qosflow.cli.simulate import add_subcommands
from qosflow.core.errors import SpecError
from qosflow.sim.trace import elasticflow_dir

TRACE = "seed:jobs=25,rate_per_hour=20"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def _simulate(out: Path, *extra: str) -> None:
    argv = ["simulate", "--trace", TRACE, "--cluster", "2x16", "--slot", "60", "--out", str(out)]
    assert _main([*argv, "--policies", "k8s-default,xing19,qosflow", *extra]) == 0


def test_same_seed_gives_byte_identical_results(tmp_path: Path) -> None:
    _simulate(tmp_path / "a", "--no-timing", "--seed", "3")
    _simulate(tmp_path / "b", "--no-timing", "--seed", "3")
    _simulate(tmp_path / "c", "--no-timing", "--seed", "4")
    for name in ("results.csv", "jobs.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "jobs.csv").read_bytes() != (tmp_path / "c" / "jobs.csv").read_bytes()


def test_results_columns_plots_and_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _simulate(tmp_path)
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    for col in (
        "policy",
        "deadline_jobs",
        "met",
        "ratio",
        "upper_bound",
        "fraction_of_bound",
        "guarantee_violations",
        "utilisation",
        "rescales",
        "wall_s",
    ):
        assert col in header
    rows = (tmp_path / "results.csv").read_text().splitlines()[1:]
    assert [r.split(",")[0] for r in rows] == ["k8s-default", "xing19", "qosflow"]
    assert all(r.split(",")[header.index("upper_bound")] for r in rows)  # the bound was computed
    for png in ("satisfaction.png", "lateness_cdf.png", "utilisation.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "qosflow" in out and "upper bound" in out


def test_bound_command_on_a_real_trace(capsys: pytest.CaptureFixture[str]) -> None:
    trace = elasticflow_dir() / "generated" / "100jobs_1500lam.csv"
    assert _main(["bound", "--trace", str(trace), "--cluster", "16x8", "--slot", "3600"]) == 0
    out = capsys.readouterr().out
    assert "feasible in isolation: 100" in out
    assert "upper bound: 100" in out


def test_unknown_policy_and_knob_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown policy"):
        _main(["simulate", "--trace", TRACE, "--policies", "nope", "--out", str(tmp_path)])
    with pytest.raises(SpecError, match="unknown seed workload knob"):
        _main(["bound", "--trace", "seed:bogus=1"])
