"""How much of its CPU allocation this process really got: the ``usage`` lines of the log.

qosflow judges a size by the step rate a job reached there. That is only fair when the job could
use the CPUs it was given. :class:`UsageMeter` measures, per interval, the CPU time this
process's threads ran and the time they were runnable but waited for a CPU, and writes one JSON
line to standard error (the pod's log); the format is the contract :mod:`qosflow.core.usage`
parses (the trainer writes it without importing the rest of qosflow; a test reads one with it).

Where the numbers come from (Linux):

* ``/proc/self/task/<tid>/schedstat`` — per thread: nanoseconds on a CPU, nanoseconds waiting on
  a run queue (the time another process, or another of our threads, held the CPU we could run
  on). Deltas are taken per thread, so threads that start or end between readings are counted
  for the part of the interval they lived;
* the cgroup's ``cpu.stat`` — ``throttled_usec`` (cgroup v2) or ``throttled_time`` (v1, ns): the
  time a CPU quota stopped the whole group, counted once per allowed CPU.

``report_progress`` calls :meth:`UsageMeter.tick` for you; the reference trainer calls it once a
step. Without ``/proc`` (not Linux) nothing is reported and every window counts as clean.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from qosflow_trainer.cpus import CGROUP_ROOT, PROC_CGROUP, allowed_cpus

INTERVAL_ENV = "QOSFLOW_USAGE_INTERVAL"
"""Seconds between two usage lines (default :data:`DEFAULT_INTERVAL_S`; 0 turns them off)."""
DEFAULT_INTERVAL_S = 2.0


@dataclass(frozen=True, slots=True)
class Usage:
    """One reporting interval: what :meth:`UsageMeter.report` measured and wrote.

    Attributes:
        t: When it ended (epoch seconds).
        wall_s: Its length.
        cpu_s: CPU time the process's threads ran.
        wait_s: Time they were runnable but waited (run queue, quota throttling x CPUs).
        cpus: CPUs the process was allowed.
        steps: Steps done by then.
    """

    t: float
    wall_s: float
    cpu_s: float
    wait_s: float
    cpus: int
    steps: int

    def to_json(self) -> str:
        """The log line, without a newline."""
        return json.dumps(
            {
                "event": "usage",
                "t": round(self.t, 3),
                "wall_s": round(self.wall_s, 3),
                "cpu_s": round(self.cpu_s, 4),
                "wait_s": round(self.wait_s, 4),
                "cpus": self.cpus,
                "steps": self.steps,
            },
            sort_keys=True,
        )


def _thread_times(task_dir: Path) -> dict[int, tuple[int, int]]:
    """Per thread id: (ns on a CPU, ns waiting on a run queue)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text(encoding="ascii").split()
            out[int(task.name)] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue  # the thread ended while we read
    return out


def cgroup_throttled_s(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float:
    """Seconds the process's cgroup was throttled by a CPU quota (v2 or v1), 0 when unknown."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0.0
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        rel = rel.strip().lstrip("/")
        if hierarchy == "0" and controllers == "":
            candidates, key, scale = [root / rel / "cpu.stat"], "throttled_usec", 1e-6
        elif "cpu" in controllers.split(","):
            mount = root / controllers if (root / controllers).is_dir() else root / "cpu"
            candidates, key, scale = [mount / rel / "cpu.stat"], "throttled_time", 1e-9
        else:
            continue
        for path in candidates:
            try:
                for stat in path.read_text(encoding="ascii").splitlines():
                    name, _, value = stat.partition(" ")
                    if name == key:
                        return int(value) * scale
            except (OSError, ValueError):
                continue
    return 0.0


class UsageMeter:
    """Writes a usage line every ``interval`` seconds (see the module docstring).

    Args:
        stream: Where the lines go (standard error: the pod's log).
        interval: Seconds between lines; 0 writes none.
        clock: Epoch seconds (the line's ``t``; injected in tests).
        task_dir: ``/proc/self/task`` (injected in tests).
        throttled: Cumulative throttled seconds (injected in tests).
        cpus: The allowed CPUs now (injected in tests).
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.time,
        task_dir: Path = Path("/proc/self/task"),
        throttled: Callable[[], float] = cgroup_throttled_s,
        cpus: Callable[[], int] = allowed_cpus,
    ) -> None:
        if interval is None:
            try:
                interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
            except ValueError:
                interval = DEFAULT_INTERVAL_S
        self.stream = stream
        self.interval = max(interval, 0.0)
        self._clock = clock
        self._task_dir = task_dir
        self._throttled = throttled
        self._cpus = cpus
        self._threads = _thread_times(task_dir)
        self._throttled_at = throttled()
        self._since = clock()
        self.last: Usage | None = None

    def tick(self, steps: int) -> Usage | None:
        """Write a usage line if ``interval`` passed since the last one; return it."""
        if self.interval <= 0:
            return None
        now = self._clock()
        if now - self._since < self.interval:
            return None
        return self.report(steps, now)

    def report(self, steps: int, now: float | None = None) -> Usage:
        """Measure the interval since the last report and write its line now."""
        now = self._clock() if now is None else now
        threads = _thread_times(self._task_dir)
        cpu_ns = wait_ns = 0
        for tid, (ran, waited) in threads.items():
            before = self._threads.get(tid, (0, 0))
            cpu_ns += max(ran - before[0], 0)
            wait_ns += max(waited - before[1], 0)
        throttled = self._throttled()
        cpus = max(self._cpus(), 1)
        report = Usage(
            t=now,
            wall_s=max(now - self._since, 1e-6),
            cpu_s=cpu_ns / 1e9,
            wait_s=wait_ns / 1e9 + max(throttled - self._throttled_at, 0.0) * cpus,
            cpus=cpus,
            steps=steps,
        )
        self._threads, self._throttled_at, self._since = threads, throttled, now
        self.last = report
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(report.to_json() + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed log must never stop the training
            pass
        return report
