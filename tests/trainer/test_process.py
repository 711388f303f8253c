"""Real `python -m qosflow_trainer` processes: progress, SIGTERM, resume, torn files, threads."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from qosflow_trainer.progress import parse_progress

pytestmark = pytest.mark.slow


def two_cpus() -> set[int] | None:
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:2]) if len(cpus) >= 2 else None


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def test_run_prints_one_done_line_writes_result_and_final_progress(
    trainer: Any, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    t = trainer(steps=60, extra={"ARGO_PROGRESS_FILE": str(progress)})
    code, lines = t.finish()
    assert code == 0
    assert len(lines) == 1
    done = lines[0]
    assert done["event"] == "done" and done["steps"] == 60 and done["loss"] > 0
    assert json.loads((tmp_path / "ckpt" / "result.json").read_text()) == done
    assert progress.read_text() == "60/60\n"
    assert [p.name for p in (tmp_path / "ckpt").glob("ckpt-*.qfck")] != []


def test_progress_file_is_always_a_valid_nondecreasing_value(trainer: Any, tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    t = trainer(
        steps=400, extra={"ARGO_PROGRESS_FILE": str(progress), "QOSFLOW_CHECKPOINT_EVERY": "0"}
    )
    seen: list[int] = []
    while t.proc.poll() is None:
        time.sleep(0.002)  # poll, but leave the CPU to the trainer
        try:
            text = progress.read_text()
        except FileNotFoundError:
            continue
        value = parse_progress(text)
        assert value is not None, f"invalid progress content {text!r}"
        assert text.endswith("\n") and text.count("\n") == 1
        assert value[1] == 400
        seen.append(value[0])
    code, _ = t.finish()
    assert code == 0
    seen.append(parse_progress(progress.read_text())[0])  # type: ignore[index]
    assert seen == sorted(seen)
    assert len(seen) >= 2 and seen[-1] == 400  # observed while running, then the end
    # no temporary files left behind next to the progress file
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_sigterm_writes_checkpoint_and_exits_75_then_resume_matches_uninterrupted(
    trainer: Any, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    stopped = trainer(
        tmp_path / "a",
        steps=1_000_000,
        extra={"ARGO_PROGRESS_FILE": str(progress), "QOSFLOW_LOG_EVERY": "1"},
    )
    stopped.wait_event(lambda e: e["event"] == "step" and e["step"] >= 5)
    stopped.proc.send_signal(signal.SIGTERM)
    code, lines = stopped.finish()
    assert code == 75, "".join(stopped.stderr_lines)
    assert len(lines) == 1 and lines[0]["event"] == "stopped"
    at = lines[0]["steps"]
    assert at >= 5
    assert Path(lines[0]["checkpoint"]).name == f"ckpt-{at:010d}.qfck"
    assert Path(lines[0]["checkpoint"]).is_file()
    assert not (tmp_path / "a" / "result.json").exists()  # only a finished run writes it
    assert parse_progress(progress.read_text()) == (at, 1_000_000)

    # Batch k depends only on (seed, k), so the checkpoint of step `at` continues into a run of
    # `at + 40` steps exactly like an uninterrupted run of that length — here on two CPUs (two
    # BLAS threads) against one CPU for the reference, so the thread count must not matter.
    total = at + 40
    resumed = trainer(
        tmp_path / "a", steps=total, cpus=two_cpus(), extra={"QOSFLOW_RESUME": "true"}
    )
    assert resumed.wait_event(lambda e: e["event"] == "resume")["step"] == at
    code, lines = resumed.finish()
    assert code == 0
    assert lines[0]["steps"] == total and lines[0]["resumed_from"] == at

    code, ref = trainer(tmp_path / "b", steps=total).finish()
    assert code == 0 and ref[0]["resumed_from"] is None
    assert _rel(lines[0]["loss"], ref[0]["loss"]) <= 1e-6


def test_torn_newest_checkpoint_is_skipped_and_previous_one_used(
    trainer: Any, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    code, first = trainer(ckpt, steps=100).finish()
    assert code == 0
    newest = ckpt / "ckpt-0000000100.qfck"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a torn write
    again = trainer(ckpt, steps=100)
    skipped = again.wait_event(lambda e: e["event"] == "skipped_checkpoint")
    assert skipped["path"] == str(newest) and "torn" in skipped["reason"]
    assert again.wait_event(lambda e: e["event"] == "resume")["step"] == 50
    code, lines = again.finish()
    assert code == 0 and lines[0]["resumed_from"] == 50
    assert _rel(lines[0]["loss"], first[0]["loss"]) <= 1e-6


def test_thread_pool_follows_affinity_changes(trainer: Any) -> None:
    cpus = two_cpus()
    if cpus is None:
        pytest.skip("needs 2 CPUs")
    one = {min(cpus)}
    t = trainer(
        steps=1_000_000,
        cpus=one,
        extra={"QOSFLOW_CPU_CHECK_EVERY": "1", "QOSFLOW_CHECKPOINT_EVERY": "0"},
    )
    first = t.wait_event(lambda e: e["event"] == "threads")
    assert first["threads"] == 1
    os.sched_setaffinity(t.proc.pid, cpus)
    grown = t.wait_event(lambda e: e["event"] == "threads")
    assert grown["threads"] == 2 and grown["workers"] == 2 and grown["step"] > first["step"]
    assert set(grown["blas"].values()) == {1}  # one BLAS thread per worker thread
    # every thread of the trainer (BLAS workers included) may now run on both CPUs
    for task in Path(f"/proc/{t.proc.pid}/task").iterdir():
        assert os.sched_getaffinity(int(task.name)) == cpus
    os.sched_setaffinity(t.proc.pid, {max(cpus)})
    shrunk = t.wait_event(lambda e: e["event"] == "threads")
    assert shrunk["threads"] == 1
    t.proc.send_signal(signal.SIGTERM)
    code, lines = t.finish()
    assert code == 75 and lines[0]["event"] == "stopped"


def test_bad_configuration_exits_2_naming_the_variable(trainer: Any) -> None:
    code, lines = trainer(steps=10, extra={"QOSFLOW_BATCH_SIZE": "lots"}).finish()
    assert code == 2 and lines == []


def test_resume_true_without_checkpoint_exits_2(trainer: Any, tmp_path: Path) -> None:
    t = trainer(tmp_path / "empty", steps=10, extra={"QOSFLOW_RESUME": "true"})
    code, _ = t.finish()
    assert code == 2
    assert "QOSFLOW_RESUME" in "".join(t.stderr_lines)


def test_thread_pool_follows_a_cgroup_quota_change(trainer: Any, tmp_path: Path) -> None:
    cpus = two_cpus()
    if cpus is None:
        pytest.skip("needs 2 CPUs")
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("100000 100000\n")  # a 1-CPU limit, while affinity allows 2
    t = trainer(
        steps=1_000_000,
        cpus=cpus,
        extra={
            "QOSFLOW_CGROUP_CPU_MAX": str(cpu_max),
            "QOSFLOW_CPU_CHECK_EVERY": "1",
            "QOSFLOW_CHECKPOINT_EVERY": "0",
        },
    )
    assert t.wait_event(lambda e: e["event"] == "threads")["threads"] == 1
    tmp = tmp_path / "cpu.max.tmp"
    tmp.write_text("max 100000\n")  # the limit is lifted
    tmp.replace(cpu_max)
    assert t.wait_event(lambda e: e["event"] == "threads")["threads"] == 2
    t.proc.send_signal(signal.SIGTERM)
    code, _ = t.finish()
    assert code == 75
