"""The ``qosflow`` CLI: plan and replay on the shipped examples; bad input is one ``error:`` line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from in_process import qosflow

from qosflow.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOW = "2026-11-29T22:00:00+00:00"


def unknown_speed_job(tmp_path: Path, *, policy: str = "run_best_effort") -> Path:
    """The example job without its step-time estimate (no history either): nothing known about its speed."""
    spec = (
        (EXAMPLES / "ctr-nightly.yaml")
        .read_text()
        .replace("step_seconds_estimate", "# step_seconds_estimate")
    )
    path = tmp_path / "job.yaml"
    path.write_text(spec.replace("run_best_effort", policy))
    return path


def test_plan_prints_verdict_size_finish_times_and_schedule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "plan",
            str(EXAMPLES / "ctr-nightly.yaml"),
            "--cluster",
            str(EXAMPLES / "cluster.yaml"),
            "--now",
            NOW,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "ctr-nightly: guaranteed" in out
    assert "median finish" in out and "conservative finish" in out
    assert "2026-11-30 06:00:00 UTC" in out  # the deadline
    assert "20000" in out  # the schedule ends at the total steps


def test_plan_without_any_speed_information_probes_instead_of_promising(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = unknown_speed_job(tmp_path)
    assert main(["plan", str(job), "--cluster", "4x8", "--now", NOW]) == 3  # best effort
    out = capsys.readouterr().out
    assert "best_effort" in out and "no speed is known" in out


def test_replay_prints_one_decision_per_report(capsys: pytest.CaptureFixture[str]) -> None:
    progress = EXAMPLES / "ctr-nightly-progress.csv"
    code = main(
        ["replay", str(EXAMPLES / "ctr-nightly.yaml"), str(progress), "--now", NOW, "--every", "10"]
    )
    out = capsys.readouterr().out
    assert code == 0
    reports = len(progress.read_text().splitlines()) - 1
    assert f"{reports} progress reports" in out
    decisions = [
        w for w in ("on_track", "scale_up", "scale_down", "bump", "at_risk", "done") if w in out
    ]
    assert decisions, out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["plan", "missing.yaml", "--cluster", "4x8"], "cannot read job spec file"),
        (
            ["plan", "examples/ctr-nightly.yaml", "--cluster", "4x8", "--now", "yesterday"],
            "--now: must be an ISO-8601",
        ),
        (
            [
                "plan",
                "examples/ctr-nightly.yaml",
                "--cluster",
                "4x8",
                "--now",
                "2026-11-29T22:00:00",
            ],
            "--now: must be timezone-aware",
        ),
        (
            ["plan", "examples/ctr-nightly.yaml", "--cluster", "0x8", "--now", NOW],
            "nodes: must be >= 1",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_exit_code_2(args: list[str], needle: str) -> None:
    proc = qosflow(*args, cwd=ROOT)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_bad_progress_row_names_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "progress.csv"
    bad.write_text("time,steps,units\n10,5,1\n20,lots,1\n")
    proc = qosflow("replay", str(EXAMPLES / "ctr-nightly.yaml"), str(bad), "--now", NOW)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}:3:steps: must be an integer")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("time,steps,units\n10,5,1\nnan,6,1\n", ":3:time: must be a finite number"),
        ("time,steps,units\n10,5,1\n5,6,1\n", ":3:time: must not go back in time"),
        ("time,steps,units\n10,5,0\n", ":2: steps must be >= 0 and units >= 1"),
        ("when,steps\n1,2\n", ":1: header must have columns time, steps, units"),
        ("steps,units,time\n1,1\n", ":2:time: is missing: the row has fewer columns"),
        ("time,steps,units\n1,\x00,1\n", ":2:steps: must be an integer"),
    ],
)
def test_bad_progress_logs_are_refused(
    tmp_path: Path, body: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "progress.csv"
    bad.write_text(body)
    assert main(["replay", str(EXAMPLES / "ctr-nightly.yaml"), str(bad), "--now", NOW]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err


def test_unknown_speed_with_hard_reject_policy_is_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = unknown_speed_job(tmp_path, policy="reject")
    assert main(["plan", str(job), "--cluster", "4x8", "--now", NOW]) == 4  # rejected
    out = capsys.readouterr().out
    assert "rejected" in out and "if_not_guaranteed: reject" in out
    assert "no schedule yet" in out


def test_replay_without_steady_progress_is_measuring_not_at_risk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = unknown_speed_job(tmp_path)
    (tmp_path / "p.csv").write_text("time,steps,units\n5,2,1\n")
    assert main(["replay", str(job), str(tmp_path / "p.csv"), "--now", NOW]) == 0
    out = capsys.readouterr().out
    assert "on_track" in out and "measuring" in out and "at_risk" not in out


def test_a_binary_progress_log_is_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "progress.csv"
    bad.write_bytes(b"time,steps,units\n\x89\xff,1,1\n")
    proc = qosflow("replay", str(EXAMPLES / "ctr-nightly.yaml"), str(bad), "--now", NOW)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == f"error: {bad}: is not a text file: a progress log is CSV in UTF-8\n"


def test_replay_says_times_since_submission_in_human_units() -> None:
    progress = EXAMPLES / "ctr-nightly-progress.csv"
    proc = qosflow(
        "replay", str(EXAMPLES / "ctr-nightly.yaml"), str(progress), "--now", NOW, "--every", "10"
    )
    assert proc.returncode == 0
    assert "since submission" in proc.stdout and "21 min 52 s" in proc.stdout
    assert " h " in proc.stdout and " s left" not in proc.stdout.replace("min", "")


def test_an_unexpected_error_is_one_line_and_exit_code_1(monkeypatch: pytest.MonkeyPatch) -> None:
    from qosflow.core import planning

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(planning, "plan_job", broken)
    proc = qosflow("plan", str(EXAMPLES / "ctr-nightly.yaml"), "--cluster", "4x8", "--now", NOW)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: unexpected ZeroDivisionError: division by zero (a bug")
    monkeypatch.setenv("QOSFLOW_TRACEBACK", "1")
    proc = qosflow("plan", str(EXAMPLES / "ctr-nightly.yaml"), "--cluster", "4x8", "--now", NOW)
    assert proc.returncode == 1 and "Traceback" in proc.stderr  # asked for
