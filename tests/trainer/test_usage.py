"""The usage meter: CPU time got against time waited, per interval, as one log line (issue 13)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from qosflow.core.usage import parse_usage, share_between
from qosflow_trainer.usage import UsageMeter, cgroup_throttled_s


def fake_tasks(root: Path, threads: dict[int, tuple[int, int]]) -> None:
    for tid, (ran, waited) in threads.items():
        (root / str(tid)).mkdir(parents=True, exist_ok=True)
        (root / str(tid) / "schedstat").write_text(f"{ran} {waited} 7\n")


def test_each_line_is_the_interval_since_the_last_per_thread(tmp_path: Path) -> None:
    now = [100.0]
    throttled = [0.0]
    fake_tasks(tmp_path, {1: (1_000_000_000, 0), 2: (500_000_000, 100_000_000)})
    out = io.StringIO()
    meter = UsageMeter(
        stream=out,
        interval=2.0,
        clock=lambda: now[0],
        task_dir=tmp_path,
        throttled=lambda: throttled[0],
        cpus=lambda: 2,
    )
    now[0] = 101.0
    assert meter.tick(10) is None  # not due yet
    # thread 2 ended, thread 3 started; 0.1 s of quota throttling on 2 CPUs
    (tmp_path / "2" / "schedstat").unlink()
    (tmp_path / "2").rmdir()
    fake_tasks(tmp_path, {1: (2_500_000_000, 300_000_000), 3: (1_000_000_000, 400_000_000)})
    throttled[0] = 0.1
    now[0] = 102.0
    report = meter.tick(40)
    assert report is not None
    assert (report.wall_s, report.cpus, report.steps) == (2.0, 2, 40)
    assert report.cpu_s == pytest.approx(2.5)  # 1.5 s of thread 1, 1.0 s of the new thread 3
    assert report.wait_s == pytest.approx(0.3 + 0.4 + 0.2)
    line = parse_usage(out.getvalue().splitlines()[-1])  # the JSON line, rounded to 0.1 ms
    assert line is not None and (line.t, line.steps) == (102.0, 40)
    assert (line.cpu_s, line.wait_s) == pytest.approx((report.cpu_s, report.wait_s))
    assert share_between([line], 100.0, 101.0) == pytest.approx(2.5 / 3.4, rel=1e-3)
    assert share_between([line], 90.0, 99.0) is None


def test_interval_zero_reports_nothing(tmp_path: Path) -> None:
    out = io.StringIO()
    meter = UsageMeter(stream=out, interval=0.0, task_dir=tmp_path)
    assert meter.tick(1) is None and out.getvalue() == ""


def test_the_real_process_reports_its_own_cpu_time() -> None:
    out = io.StringIO()
    meter = UsageMeter(stream=out, interval=1e-9)
    sum(i * i for i in range(300_000))  # some CPU work
    report = meter.report(1)
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc here")
    assert report.cpu_s > 0 and report.wait_s >= 0 and report.cpus == len(os.sched_getaffinity(0))


def test_cgroup_throttling_is_read_from_v2_and_v1_stat_files(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "pod").mkdir(parents=True)
    (v2 / "pod" / "cpu.stat").write_text("usage_usec 10\nthrottled_usec 250000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pod\n")
    assert cgroup_throttled_s(proc, v2) == pytest.approx(0.25)
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "pod").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "pod" / "cpu.stat").write_text("nr_periods 4\nthrottled_time 500000000\n")
    proc.write_text("4:cpu,cpuacct:/pod\n1:name=systemd:/\n")
    assert cgroup_throttled_s(proc, v1) == pytest.approx(0.5)
    proc.write_text("garbage")
    assert cgroup_throttled_s(proc, v1) == 0.0
