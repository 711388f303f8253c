"""What a training pod says about the CPU time it got: the ``usage`` line of its log.

Progress (``N/M``) says how fast a job went; it does not say whether the job could use the units
it was given. On a busy host (or a node whose other pods burst, or a CPU limit that throttles) a
job at 2 CPUs may get barely more than one, and a fit that takes that window at face value learns
that 2 CPUs are no faster than 1. So the training side (``qosflow_trainer``'s helpers, called
from any training loop) writes, every few seconds, one JSON line to its standard error, which the
container runtime keeps as the pod's log::

    {"event": "usage", "t": 1764633600.5, "wall_s": 2.0, "cpu_s": 3.1, "wait_s": 0.8,
     "cpus": 2, "steps": 1234}

* ``t`` — when the interval ended (epoch seconds, the pod's clock);
* ``wall_s`` — the interval's length;
* ``cpu_s`` — CPU time the process's threads ran in it;
* ``wait_s`` — time they were runnable but waited for a CPU: the scheduler's run-queue delay
  (``/proc/self/task/*/schedstat``) plus the cgroup's CPU throttling times the allowed CPUs;
* ``cpus`` — the CPUs the process was allowed (affinity and quota); ``steps`` — steps done.

:attr:`UsageReport.share` = ``cpu_s / (cpu_s + wait_s)``: of the CPU time the job asked for, the
share it got. A job that waits on I/O or a barrier is not runnable then, so it is not penalised;
only CPU it wanted and could not have counts against it. The watch reads these lines from the
pod's log (``GET /api/v1/namespaces/{ns}/pods/{pod}/log``) and gives each progress sample the
share over the interval before it (:func:`share_between`); the speed fit leaves out windows in
which the job got less than :data:`qosflow.core.windows.CLEAN_SHARE` of it.

This module is the contract only (pure: parsing and arithmetic); the reading of ``/proc`` is in
:mod:`qosflow_trainer.usage`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EVENT = "usage"
"""The ``event`` value of a usage line."""


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One reporting interval of a training process (see the module docstring for the fields)."""

    t: float
    wall_s: float
    cpu_s: float
    wait_s: float
    cpus: int
    steps: int

    @property
    def start(self) -> float:
        """When the interval began."""
        return self.t - self.wall_s

    @property
    def share(self) -> float | None:
        """Share of the CPU time asked for that the job got; ``None`` when it asked for none."""
        asked = self.cpu_s + self.wait_s
        return self.cpu_s / asked if asked > 0 else None


def parse_usage(line: str) -> UsageReport | None:
    """The report of one log line, or ``None`` when the line is not a valid usage line.

    Anything else a training program logs (text, other JSON events, a torn line) is ignored.
    """
    text = line.strip()
    if not text.startswith("{") or f'"{EVENT}"' not in text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("event") != EVENT:
        return None
    try:
        report = UsageReport(
            t=float(data["t"]),
            wall_s=float(data["wall_s"]),
            cpu_s=float(data["cpu_s"]),
            wait_s=float(data["wait_s"]),
            cpus=int(data["cpus"]),
            steps=int(data["steps"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    numbers = (report.t, report.wall_s, report.cpu_s, report.wait_s)
    if not all(math.isfinite(v) for v in numbers) or min(numbers[1:]) < 0 or report.wall_s == 0:
        return None
    return report


def usage_in_log(text: str) -> list[UsageReport]:
    """Every usage report in a chunk of log text, in order."""
    return [r for r in map(parse_usage, text.splitlines()) if r is not None]


def merge(known: Sequence[UsageReport], new: Iterable[UsageReport]) -> list[UsageReport]:
    """``known`` plus the reports of ``new`` not seen yet (the same line read twice counts once)."""
    seen = {r.t for r in known}
    out = list(known)
    for report in new:
        if report.t not in seen:
            seen.add(report.t)
            out.append(report)
    out.sort(key=lambda r: r.t)
    return out


def share_between(reports: Sequence[UsageReport], start: float, end: float) -> float | None:
    """The share the job got over ``(start, end]``, from the reports that overlap it.

    Each report counts for the part of its interval inside ``(start, end]``. ``None`` when no
    report covers the interval or the job asked for no CPU in it.
    """
    got = asked = 0.0
    for r in reports:
        overlap = min(end, r.t) - max(start, r.start)
        if overlap <= 0:
            continue
        part = overlap / r.wall_s
        got += r.cpu_s * part
        asked += (r.cpu_s + r.wait_s) * part
    return got / asked if asked > 0 else None
