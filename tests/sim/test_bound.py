"""The offline upper bound: energy LP, validity against brute-forced schedules, dual bounds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from qosflow.core.errors import SpecError
from qosflow.sim.bound import (
    BoundJob,
    bound_a,
    bound_b,
    feasible_alone,
    min_energy,
    upper_bound,
)

CURVE = {1: 1.0, 2: 1.8, 4: 3.0}


def _lp_energy(work: float, window: float, thr: dict[int, float]) -> float:
    ns = sorted(thr)
    x = np.array([thr[n] for n in ns])
    res = linprog(
        np.array(ns, float),
        A_ub=np.vstack([-x, np.ones(len(ns))]),
        b_ub=[-work, window],
        bounds=(0, None),
    )
    return float(res.fun) if res.status == 0 else math.inf


@settings(max_examples=150)
@given(
    work=st.floats(1, 500),
    window=st.floats(1, 500),
    exps=st.lists(st.floats(0.1, 1.2), min_size=4, max_size=4),
)
def test_min_energy_equals_the_two_row_lp(work: float, window: float, exps: list[float]) -> None:
    thr = {n: n**e for n, e in zip((1, 2, 4, 8), exps, strict=True)}
    got, ref = min_energy(work, window, thr), _lp_energy(work, window, thr)
    if math.isinf(ref):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(ref, rel=1e-7, abs=1e-7)


def test_mixing_configurations_beats_the_cheapest_single_one() -> None:
    # rate needed 1.5 it/s: single config needs n=2 for the whole window (cost 2*L*(1.5/1.8)
    # if it may idle) but mixing n=1 and n=2 is cheaper still; never more than the single config.
    work, window = 150.0, 100.0
    single = min(n * work / x for n, x in CURVE.items() if work / x <= window)
    assert min_energy(work, window, CURVE) <= single + 1e-9
    assert min_energy(work, window, {1: 1.0, 2: 1.0, 4: 3.0}) < min(2 * 150.0, 4 * 50.0)
    assert min_energy(1000.0, 100.0, CURVE) == math.inf
    assert min_energy(0.0, 10.0, CURVE) == 0.0


def _best_schedule_count(jobs: list[BoundJob], capacity: int, slot: float, horizon: int) -> int:
    """Brute force: every job runs one constant config over consecutive whole slots (or not)."""
    options: list[list[tuple[int, int, int] | None]] = []
    for job in jobs:
        opts: list[tuple[int, int, int] | None] = [None]
        for n, x in job.throughput.items():
            length = math.ceil(job.work / (x * slot))
            for start in range(horizon):
                end = start + length
                if start * slot >= job.arrival and end * slot <= job.deadline:
                    opts.append((start, end, n))
        options.append(opts)
    best = 0
    for combo in itertools.product(*options):
        use = [0] * horizon
        for item in combo:
            if item is not None:
                for t in range(item[0], item[1]):
                    use[t] += item[2]
        if max(use) <= capacity:
            best = max(best, sum(item is not None for item in combo))
    return best


@settings(max_examples=25)
@given(st.data())
def test_bounds_dominate_every_brute_forced_schedule(data: st.DataObject) -> None:
    slot, horizon, capacity = 10.0, 6, 4
    jobs = []
    for i in range(4):
        arrival = data.draw(st.integers(0, 3)) * slot
        length = data.draw(st.integers(1, horizon - int(arrival / slot)))
        work = data.draw(st.floats(5, 100))
        jobs.append(BoundJob(f"j{i}", arrival, arrival + length * slot, work, CURVE))
    best = _best_schedule_count(jobs, capacity, slot, horizon)
    report = upper_bound(jobs, capacity, slot=slot, milp_b=True, time_limit=10)
    assert all(b.value >= best for b in report.bounds)
    assert report.value >= best
    assert report.value <= report.feasible_in_isolation


def test_a_shared_window_admits_only_what_fits() -> None:
    # three jobs each needing the whole 4-unit cluster for the whole window: exactly one fits
    jobs = [BoundJob(f"j{i}", 0.0, 100.0, 300.0, CURVE) for i in range(3)]
    report = upper_bound(jobs, 4, slot=50.0, milp_b=True)
    assert report.feasible_in_isolation == 3
    assert report.value == 1
    assert not report.sufficient
    # disjoint windows: all three fit, so resources are sufficient
    apart = [BoundJob(f"j{i}", 100.0 * i, 100.0 * i + 100, 300.0, CURVE) for i in range(3)]
    assert upper_bound(apart, 4, slot=50.0).value == 3
    assert upper_bound(apart, 4, slot=50.0).sufficient


def test_infeasible_and_best_effort_jobs_are_left_out() -> None:
    jobs = [
        BoundJob("ok", 0.0, 100.0, 50.0, CURVE),
        BoundJob("too-big", 0.0, 100.0, 10_000.0, CURVE),
        BoundJob("no-deadline", 0.0, math.inf, 50.0, CURVE),
        BoundJob("needs-8", 0.0, 100.0, 350.0, {8: 4.0}),  # 8 units > capacity 4
    ]
    assert not feasible_alone(BoundJob("x", 0.0, math.inf, 1.0, CURVE))
    report = upper_bound(jobs, 4, slot=25.0)
    assert report.deadline_jobs == 3
    assert report.feasible_in_isolation == 1
    assert report.value == 1


def test_time_limit_reports_a_dual_bound_never_below_the_optimum() -> None:
    rng = np.random.default_rng(3)
    jobs = []
    for i in range(40):
        a = float(rng.integers(0, 20)) * 60
        jobs.append(
            BoundJob(
                f"j{i}", a, a + float(rng.integers(2, 12)) * 60, float(rng.uniform(60, 400)), CURVE
            )
        )
    exact = bound_b(jobs, 6, slot=60.0, integral=True, time_limit=60)
    cut = bound_b(jobs, 6, slot=60.0, integral=True, time_limit=1e-3)
    assert cut.value >= exact.value
    if not cut.optimal:
        assert "dual bound" in cut.detail or "no bound" in cut.detail
    lp = bound_a(jobs, 6, integral=False)
    assert lp.value >= bound_a(jobs, 6).value


def test_bad_capacity_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="capacity"):
        upper_bound([BoundJob("a", 0.0, 1.0, 1.0, CURVE)], 0)
