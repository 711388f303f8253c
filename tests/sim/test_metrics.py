"""Metric definitions: misses, rejections, best-effort exclusion, guarantees, utilisation."""

from __future__ import annotations

import math

import pytest

from qosflow.sim.metrics import JobOutcome, Usage, compute

INF = math.inf
USAGE = Usage(
    capacity=10,
    span=1000.0,
    allocated_unit_s=5000.0,
    busy_unit_s=4750.0,
    decisions=20,
    policy_cpu_s=0.04,
)


def _outcomes() -> list[JobOutcome]:
    return [
        JobOutcome("on-time-guaranteed", 0, 100, 100.0, False, True, rescales=2),
        JobOutcome("on-time-best-effort", 0, 100, 90.0, False, False),
        JobOutcome("late-guaranteed", 0, 100, 160.0, False, True, rescales=1),
        JobOutcome("late", 0, 100, 120.0, False, False),
        JobOutcome("rejected", 0, 100, None, True, False),
        JobOutcome("unfinished", 0, 100, None, False, False),
        JobOutcome("no-deadline-a", 0, INF, 300.0, False, False),
        JobOutcome("no-deadline-b", 100, INF, 200.0, False, False),
    ]


def test_ratio_counts_rejected_and_unfinished_as_misses_and_excludes_best_effort() -> None:
    m = compute("p", _outcomes(), USAGE, upper_bound=4, wall_s=1.5)
    assert m.deadline_jobs == 6
    assert m.met == 2
    assert m.ratio == pytest.approx(2 / 6)
    assert m.fraction_of_bound == pytest.approx(2 / 4)
    assert (m.met_guaranteed, m.met_best_effort) == (1, 1)
    assert m.rejected == 1
    assert m.guarantee_violations == 1


def test_lateness_jct_utilisation_and_overheads() -> None:
    m = compute("p", _outcomes(), USAGE)
    assert m.lateness_p50_s == pytest.approx(40.0)  # late by 60 and 20
    assert m.lateness_p95_s == pytest.approx(58.0)
    assert m.best_effort_jobs == 2
    assert m.best_effort_jct_s == pytest.approx(200.0)  # (300 + 100) / 2
    assert m.utilisation == pytest.approx(0.95)
    assert m.cluster_load == pytest.approx(0.5)
    assert m.rescales == 3
    assert m.cpu_ms_per_decision == pytest.approx(2.0)
    assert m.upper_bound is None and m.fraction_of_bound is None


def test_finishing_exactly_at_the_deadline_counts_and_rows_are_stable_text() -> None:
    m = compute("p", [JobOutcome("a", 0, 50, 50.0, False, False)], USAGE)
    assert m.met == 1 and m.lateness_p95_s == 0.0
    row = m.row()
    assert row["ratio"] == "1.0000" and row["upper_bound"] == ""
    assert compute("p", [], USAGE).ratio == 1.0
