"""The physical limit: an offline upper bound on how many jobs can meet their deadlines.

Two relaxations of every real schedule (placement, gangs, overheads and fragmentation ignored), both
solved with :func:`scipy.optimize.milp` (HiGHS):

* **Bound A, interval energy.** Job ``j`` needs at least ``E_j`` unit-seconds inside its window
  ``[a_j, D_j]`` (:func:`min_energy`, a two-row LP solved on the lower convex hull, so a job may
  mix configurations). For every pair ``s < e`` the jobs whose windows lie inside ``[s, e]`` cannot
  need more than ``G·(e − s)``. Maximise the number of chosen jobs.
* **Bound B, time-indexed.** Slots of ``Δ`` seconds, windows rounded *outwards*; ``x[j,t,n]`` is the
  fraction of slot ``t`` job ``j`` runs on ``n`` units. LP (``z`` relaxed) or MILP.

A solve cut by its time limit reports the HiGHS *dual* bound (never the incumbent, which is only a
feasible count). :func:`upper_bound` reports the minimum of the valid bounds and the number of jobs
feasible in isolation. Dropping constraints only loosens a relaxation, so the row and variable caps
below never make a bound invalid, only weaker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from qosflow.core.errors import SpecError

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class BoundJob:
    """One deadline job as the bound sees it.

    Attributes:
        name: Job name.
        arrival: Submit time (s).
        deadline: Absolute deadline (s); ``inf`` for best effort (ignored by the bound).
        work: Total iterations.
        throughput: Iterations per second by allowed unit count.
    """

    name: str
    arrival: float
    deadline: float
    work: float
    throughput: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class BoundValue:
    """One bound.

    Attributes:
        method: ``A-LP``, ``A-MILP``, ``B-LP`` or ``B-MILP``.
        value: Upper bound on the number of jobs meeting their deadline (an integer count).
        relaxed: The raw objective (LP value or the solver's dual bound) before rounding down.
        optimal: True when the solver proved optimality (else ``value`` is a dual bound).
        detail: Solver status and model size in words.
    """

    method: str
    value: int
    relaxed: float
    optimal: bool
    detail: str


@dataclass(frozen=True, slots=True)
class UpperBound:
    """The report of :func:`upper_bound`.

    Attributes:
        deadline_jobs: Jobs with a finite deadline.
        feasible_in_isolation: Deadline jobs that could finish alone on the whole cluster.
        bounds: Every bound computed.
        value: The minimum of the valid bounds (the upper bound to report).
    """

    deadline_jobs: int
    feasible_in_isolation: int
    bounds: tuple[BoundValue, ...]
    value: int

    @property
    def sufficient(self) -> bool:
        """True when the bound equals the feasible-in-isolation count (resources suffice)."""
        return self.value >= self.feasible_in_isolation


def min_energy(work: float, window: float, throughput: Mapping[int, float]) -> float:
    """Minimum unit-seconds to do ``work`` within ``window`` seconds, mixing configurations.

    Solves ``min Σ τ_n·n  s.t.  Σ τ_n·X(n) ≥ W, Σ τ_n ≤ L, τ ≥ 0`` in closed form: with the idle
    point ``(0, 0)`` added, the answer is ``L·h(W/L)`` where ``h`` is the lower convex envelope of
    the points ``(X(n), n)``; in one dimension two points always suffice.

    Args:
        work: Iterations to do.
        window: Seconds available.
        throughput: Iterations per second by unit count (non-positive or NaN entries ignored).

    Returns:
        The minimum unit-seconds, or ``inf`` when even the fastest configuration is too slow.
    """
    if work <= 0:
        return 0.0
    if window <= 0:
        return math.inf
    pts = [(0.0, 0.0)] + [
        (float(x), float(n)) for n, x in throughput.items() if x > 0 and math.isfinite(x)
    ]
    rate = work / window
    best = math.inf
    for xp, cp in pts:
        if xp > rate * (1 + 1e-12):
            continue
        for xq, cq in pts:
            if xq < rate * (1 - 1e-12):
                continue
            if xq - xp <= _EPS:
                cost = cq if xq >= rate * (1 - 1e-12) else math.inf
            else:
                frac = (rate - xp) / (xq - xp)
                cost = cp + frac * (cq - cp)
            best = min(best, cost)
    return best * window


def feasible_alone(job: BoundJob) -> bool:
    """Whether the job can finish inside its window on its fastest allowed configuration."""
    return math.isfinite(job.deadline) and math.isfinite(
        min_energy(job.work, job.deadline - job.arrival, job.throughput)
    )


def _validate(jobs: Sequence[BoundJob], capacity: int) -> list[BoundJob]:
    if capacity < 1:
        raise SpecError("capacity", f"must be >= 1 (got {capacity})")
    kept = []
    for job in jobs:
        if job.work < 0 or not math.isfinite(job.arrival):
            raise SpecError(f"jobs.{job.name}", "needs a finite arrival and work >= 0")
        allowed = {n: x for n, x in job.throughput.items() if n <= capacity}
        capped = BoundJob(job.name, job.arrival, job.deadline, job.work, allowed)
        if feasible_alone(capped):
            kept.append(capped)
    return kept


def _solve(
    c: np.ndarray,
    rows: list[LinearConstraint],
    integrality: np.ndarray,
    upper: np.ndarray,
    time_limit: float,
) -> tuple[float, bool, str]:
    """Maximise ``c·v`` and return (upper bound on the optimum, optimal?, status)."""
    res = milp(
        -c,
        constraints=rows,
        integrality=integrality,
        bounds=Bounds(np.zeros_like(upper), upper),
        options={"time_limit": float(time_limit), "presolve": True},
    )
    if res.status == 0 and res.fun is not None:
        dual = getattr(res, "mip_dual_bound", None)
        raw = -float(res.fun)
        if dual is not None and math.isfinite(dual):
            raw = max(raw, -float(dual))
        return raw, True, "optimal"
    dual = getattr(res, "mip_dual_bound", None)
    if dual is not None and math.isfinite(float(dual)):
        return -float(dual), False, f"stopped ({res.message.strip()}); HiGHS dual bound"
    return math.inf, False, f"no bound ({res.message.strip()})"


def _energy_rows(
    jobs: Sequence[BoundJob], capacity: int, max_rows: int
) -> tuple[csr_array, np.ndarray]:
    """Constraint rows of Bound A, deduplicated on each row's tightest window."""
    arr = np.array([j.arrival for j in jobs])
    ddl = np.array([j.deadline for j in jobs])
    energy = np.array([min_energy(j.work, j.deadline - j.arrival, j.throughput) for j in jobs])
    starts, ends = np.unique(arr), np.unique(ddl)
    if len(starts) * len(ends) > max_rows:  # subsample evenly: fewer rows is still a valid bound
        k = max(2, int(math.sqrt(max_rows)))
        starts = np.unique(np.quantile(starts, np.linspace(0, 1, k), method="nearest"))
        ends = np.unique(np.quantile(ends, np.linspace(0, 1, k), method="nearest"))
    seen: set[tuple[float, float]] = set()
    data: list[float] = []
    cols: list[int] = []
    ptr = [0]
    rhs: list[float] = []
    for s in starts:
        inside_s = arr >= s
        for e in ends:
            if e <= s:
                continue
            members = np.flatnonzero(inside_s & (ddl <= e))
            if members.size == 0:
                continue
            key = (float(arr[members].min()), float(ddl[members].max()))
            if key in seen:
                continue
            seen.add(key)
            cols.extend(members.tolist())
            data.extend(energy[members].tolist())
            ptr.append(len(cols))
            rhs.append(capacity * (key[1] - key[0]))
    matrix = csr_array((data, cols, ptr), shape=(len(rhs), len(jobs)))
    return matrix, np.array(rhs)


def bound_a(
    jobs: Sequence[BoundJob],
    capacity: int,
    *,
    integral: bool = True,
    time_limit: float = 60.0,
    max_rows: int = 40_000,
) -> BoundValue:
    """Bound A: the interval-energy knapsack (MILP, or its LP relaxation).

    Args:
        jobs: The trace; jobs infeasible in isolation or without a deadline are dropped.
        capacity: Units in the cluster (G).
        integral: Solve the MILP (True) or the LP relaxation.
        time_limit: HiGHS time limit in seconds (the dual bound is reported when it is hit).
        max_rows: Cap on (start, end) pairs; above it the pairs are subsampled (still valid).

    Returns:
        The bound.
    """
    kept = _validate(jobs, capacity)
    method = "A-MILP" if integral else "A-LP"
    if not kept:
        return BoundValue(method, 0, 0.0, True, "no job is feasible in isolation")
    matrix, rhs = _energy_rows(kept, capacity, max_rows)
    n = len(kept)
    rows = [LinearConstraint(matrix, -np.inf, rhs)] if matrix.shape[0] else []
    raw, optimal, status = _solve(
        np.ones(n), rows, np.full(n, 1 if integral else 0), np.ones(n), time_limit
    )
    detail = f"{status}; {n} jobs, {matrix.shape[0]} interval rows"
    return BoundValue(method, _count(raw, n), raw, optimal, detail)


def _count(raw: float, cap: int) -> int:
    """Round an objective bound down to a count (the objective is an integer count of jobs)."""
    if not math.isfinite(raw):
        return cap
    return min(cap, math.floor(raw + 1e-6))


def _time_model(
    jobs: Sequence[BoundJob], capacity: int, slot: float
) -> tuple[np.ndarray, list[LinearConstraint], int]:
    """Variables ``x[j,t,n]`` (then ``z_j``) and the three constraint families of Bound B."""
    origin = math.floor(min(j.arrival for j in jobs) / slot) * slot
    n_jobs = len(jobs)
    var_slot: list[int] = []
    var_units: list[int] = []
    var_job: list[int] = []
    var_rate: list[float] = []
    for jdx, job in enumerate(jobs):
        first = math.floor((job.arrival - origin) / slot)
        last = math.ceil((job.deadline - origin) / slot)  # exclusive: windows rounded outwards
        levels = [(n, x) for n, x in sorted(job.throughput.items()) if x > 0 and math.isfinite(x)]
        for t in range(first, last):
            for n, x in levels:
                var_slot.append(t)
                var_units.append(n)
                var_job.append(jdx)
                var_rate.append(x)
    n_x = len(var_slot)
    n_vars = n_x + n_jobs
    xs = np.arange(n_x)
    jt = np.array(var_job) * (max(var_slot) + 1) + np.array(var_slot)
    _, share_row = np.unique(jt, return_inverse=True)
    share = csr_array((np.ones(n_x), (share_row, xs)), shape=(int(share_row.max()) + 1, n_vars))
    slots, cap_row = np.unique(np.array(var_slot), return_inverse=True)
    cap = csr_array((np.array(var_units, dtype=float), (cap_row, xs)), shape=(len(slots), n_vars))
    work_rows = np.concatenate([np.array(var_job), np.arange(n_jobs)])
    work_cols = np.concatenate([xs, n_x + np.arange(n_jobs)])
    work_vals = np.concatenate([np.array(var_rate) * slot, -np.array([j.work for j in jobs])])
    work = csr_array((work_vals, (work_rows, work_cols)), shape=(n_jobs, n_vars))
    rows = [
        LinearConstraint(share, -np.inf, 1.0),
        LinearConstraint(cap, -np.inf, float(capacity)),
        LinearConstraint(work, 0.0, np.inf),
    ]
    return np.zeros(n_vars), rows, n_x


def bound_b(
    jobs: Sequence[BoundJob],
    capacity: int,
    *,
    slot: float = 600.0,
    integral: bool = False,
    time_limit: float = 60.0,
    max_vars: int = 400_000,
) -> BoundValue:
    """Bound B: the time-indexed LP (``integral=False``) or MILP over slots of ``slot`` seconds.

    Windows are rounded outwards to whole slots (keeps validity). When the model would exceed
    ``max_vars`` variables the slot is doubled until it fits (coarser slots are still valid).

    Returns:
        The bound; ``detail`` names the slot actually used.
    """
    kept = _validate(jobs, capacity)
    method = "B-MILP" if integral else "B-LP"
    if not kept:
        return BoundValue(method, 0, 0.0, True, "no job is feasible in isolation")
    if slot <= 0:
        raise SpecError("slot", f"must be > 0 (got {slot})")
    while _n_vars(kept, slot) > max_vars:
        slot *= 2
    c, rows, n_x = _time_model(kept, capacity, slot)
    n = len(kept)
    c[n_x:] = 1.0
    integrality = np.zeros(n_x + n)
    if integral:
        integrality[n_x:] = 1
    upper = np.ones(n_x + n)
    raw, optimal, status = _solve(c, rows, integrality, upper, time_limit)
    detail = f"{status}; slot {slot:g} s, {n} jobs, {n_x} x-variables"
    return BoundValue(method, _count(raw, n), raw, optimal, detail)


def _n_vars(jobs: Sequence[BoundJob], slot: float) -> int:
    total = 0
    for job in jobs:
        slots = math.ceil(job.deadline / slot) - math.floor(job.arrival / slot) + 1
        total += slots * sum(1 for x in job.throughput.values() if x > 0)
    return total


def upper_bound(
    jobs: Sequence[BoundJob],
    capacity: int,
    *,
    slot: float | None = 600.0,
    milp_b: bool = False,
    time_limit: float = 60.0,
) -> UpperBound:
    """All bounds of the trace and their minimum.

    Args:
        jobs: The trace (best-effort jobs, with an infinite deadline, are ignored).
        capacity: Units in the cluster.
        slot: Slot of Bound B in seconds; ``None`` skips Bound B (large traces).
        milp_b: Also solve Bound B as a MILP (slow; the dual bound is used on a time limit).
        time_limit: Per-solve HiGHS time limit in seconds.

    Returns:
        The report; ``value`` is the minimum of the valid bounds.
    """
    deadline_jobs = [j for j in jobs if math.isfinite(j.deadline)]
    feasible = len(_validate(deadline_jobs, capacity))
    found = [bound_a(deadline_jobs, capacity, integral=True, time_limit=time_limit)]
    if slot is not None:
        found.append(bound_b(deadline_jobs, capacity, slot=slot, time_limit=time_limit))
        if milp_b:
            found.append(
                bound_b(deadline_jobs, capacity, slot=slot, integral=True, time_limit=time_limit)
            )
    value = min([feasible, *(b.value for b in found)])
    return UpperBound(len(deadline_jobs), feasible, tuple(found), value)
