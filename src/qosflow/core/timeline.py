"""The capacity timeline and the backward fill behind admission's guarantees.

The timeline cuts the future into slots: ``slot_s`` long for the first :data:`FINE_SLOTS`, then
doubling every :data:`COARSE_BLOCK`, with extra edges at given marks (the effective deadlines).
The fill engine places jobs in deadline order, each backwards from its effective deadline into the
free units, at its minimal satisfactory share (ElasticFlow): the smallest unit cap at which its
remaining steps, run per slot at the fastest level within the cap and the free units, are done in
time. :func:`least_energy` gives the least unit-seconds a job needs, the bound of the energy test.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from qosflow.core.errors import SpecError
from qosflow.core.plan import FillPlan, FloatArray, IntArray, Placement
from qosflow.core.runs import Block, Runs

__all__ = [
    "COARSE_BLOCK",
    "EPS",
    "FINE_SLOTS",
    "SNAPSHOT_EVERY",
    "Candidate",
    "FillJob",
    "FillPlan",
    "Placement",
    "Speeds",
    "Timeline",
    "backward_fill",
    "check_inputs",
    "edf",
    "fill_job",
    "hull_energy",
    "least_energy",
    "place_in_order",
    "speeds_of",
    "timeline",
    "trusted",
]

FINE_SLOTS = 240
"""Slots of exactly ``slot_s`` at the start of the timeline."""
COARSE_BLOCK = 120
"""After the fine slots, the slot length doubles every this many slots."""
EPS = 1e-9
"""Relative tolerance of every capacity and work comparison of the fill."""
SNAPSHOT_EVERY = 64
""":func:`place_in_order` keeps the free units before every this many placed jobs."""


def check_inputs(capacity: int, now: float, slot_s: float) -> None:
    """Refuse a capacity below 1, a non-finite time or a slot that is not > 0 (``SpecError``)."""
    if capacity < 1:
        raise SpecError("capacity", f"must be >= 1 (got {capacity})")
    if not math.isfinite(now):
        raise SpecError("now", f"must be a finite time (got {now})")
    if not (slot_s > 0.0 and math.isfinite(slot_s)):
        raise SpecError("slot_s", f"must be > 0 (got {slot_s})")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One job as admission sees it.

    Attributes:
        name: Job name (unique among the jobs admitted together).
        deadline: Deadline, epoch seconds (``inf``: no deadline).
        remaining_steps: Steps still to run.
        margin: Safety margin in seconds; the job must finish by ``deadline - margin``.
        levels: Allowed sizes, ascending.
        step_time: Conservative seconds per step at each level (``inf``: not plannable).
        guaranteed: Whether the job already holds a guarantee.
        running_units: Units it runs on now (0: not running).
    """

    name: str
    deadline: float
    remaining_steps: int
    margin: float
    levels: tuple[int, ...]
    step_time: tuple[float, ...]
    guaranteed: bool = False
    running_units: int = 0

    def __post_init__(self) -> None:
        lv, st = self.levels, self.step_time
        if (  # the common case (in C: map, not loops), checked without building the error table
            lv
            and lv[0] >= 1
            and len(st) == len(lv)
            and all(map(operator.lt, lv, lv[1:]))
            and all(map((0.0).__lt__, st))  # nan is not > 0
            and self.remaining_steps >= 0 <= self.running_units
            and 0.0 <= self.margin < math.inf
            and not math.isnan(self.deadline)
        ):
            return
        for bad, name, rule in (
            (not lv or lv[0] < 1 or list(lv) != sorted(set(lv)), "levels", "ascending sizes >= 1"),
            (len(st) != len(lv) or any(not t > 0.0 for t in st), "step_time", "> 0 per level"),
            (self.remaining_steps < 0, "remaining_steps", ">= 0"),
            (not 0.0 <= self.margin < math.inf, "margin", "a finite number >= 0"),
            (math.isnan(self.deadline), "deadline", "a number"),
            (self.running_units < 0, "running_units", ">= 0"),
        ):
            if bad:
                got = getattr(self, name)
                raise SpecError(f"candidate[{self.name}].{name}", f"must be {rule} (got {got})")

    @property
    def due(self) -> float:
        """Effective deadline: ``deadline - margin``."""
        return self.deadline - self.margin


_NEW, _SET = object.__new__, object.__setattr__


def trusted(
    name: str,
    deadline: float,
    remaining_steps: int,
    margin: float,
    levels: tuple[int, ...],
    step_time: tuple[float, ...],
    guaranteed: bool,
    running_units: int,
) -> Candidate:
    """A :class:`Candidate` built without its checks, from parts that passed them before.

    For the hot paths only (admission's view of every promise at every decision, the
    forecast's rivals: a million of each on cluster04, where the checks cost more than the
    construction itself): ``levels`` and ``step_time`` must be those of a candidate that
    passed, and the caller must have tested the scalars it changed. The tests compare it with
    the checked constructor.
    """
    out = _NEW(Candidate)
    _SET(out, "name", name)
    _SET(out, "deadline", deadline)
    _SET(out, "remaining_steps", remaining_steps)
    _SET(out, "margin", margin)
    _SET(out, "levels", levels)
    _SET(out, "step_time", step_time)
    _SET(out, "guaranteed", guaranteed)
    _SET(out, "running_units", running_units)
    return out


@dataclass(frozen=True, slots=True)
class Speeds:
    """A job's speed frontier (levels faster than all smaller ones) and energy hull.

    ``rate_list`` and ``unit_list`` hold ``rates`` and ``units`` as Python numbers: the fill reads
    single entries per job millions of times, and an array read makes a NumPy scalar each time.
    """

    units: IntArray
    rates: FloatArray
    hull: tuple[tuple[float, float], ...]
    pin_rate: float
    rate_list: tuple[float, ...]
    unit_list: tuple[int, ...]


@functools.lru_cache(maxsize=65_536)
def speeds_of(
    levels: tuple[int, ...], step_time: tuple[float, ...], capacity: int, running: int
) -> Speeds:
    """A job's speed frontier within ``capacity`` and its energy hull (cached: jobs repeat)."""
    units, rates, pin_rate = [0], [0.0], 0.0
    for n, t in zip(levels, step_time, strict=True):
        rate = 1.0 / t if math.isfinite(t) else 0.0
        if n <= running:
            pin_rate = max(pin_rate, rate)
        if n <= capacity and rate > rates[-1]:
            units.append(n)
            rates.append(rate)
    hull: list[tuple[float, float]] = []
    for c in zip(rates, map(float, units), strict=True):  # lower hull; rates and units ascend
        while len(hull) >= 2 and (
            (hull[-1][1] - hull[-2][1]) * (c[0] - hull[-2][0])
            >= (c[1] - hull[-2][1]) * (hull[-1][0] - hull[-2][0])
        ):
            hull.pop()
        hull.append(c)
    arrays = np.array(units, dtype=np.int64), np.array(rates, dtype=np.float64)
    return Speeds(*arrays, tuple(hull), pin_rate, tuple(rates), tuple(units))


def hull_energy(hull: Sequence[tuple[float, float]], steps: float, window: float) -> float:
    """Least unit-seconds for ``steps`` within ``window`` on an energy hull (``inf``: too slow)."""
    if steps <= 0.0:
        return 0.0
    if window <= 0.0 or len(hull) < 2:
        return math.inf
    x = steps / window
    if x > hull[-1][0] * (1.0 + EPS):
        return math.inf
    for (x1, y1), (x2, y2) in itertools.pairwise(hull):
        if x <= x2:
            return window * (y1 + (y2 - y1) * (x - x1) / (x2 - x1))
    return window * hull[-1][1]


def least_energy(
    levels: Sequence[int], step_time: Sequence[float], steps: float, window: float
) -> float:
    """Least unit-seconds to run ``steps`` within ``window`` seconds, mixing levels over time.

    The two-row LP ``min sum(t_n * n)`` s.t. ``sum(t_n / step_time_n) >= steps``,
    ``sum(t_n) <= window``, solved on the lower convex hull of ``(0, 0)`` and ``(rate_n, n)``: the
    optimum runs the whole window at the average rate ``steps / window``. ``inf`` when even the
    fastest level is too slow.
    """
    sp = speeds_of(tuple(levels), tuple(step_time), max(levels, default=0), 0)
    return hull_energy(sp.hull, steps, window)


@dataclass(frozen=True, slots=True)
class FillJob:
    """One job inside the fill: its effective deadline, steps left, speeds and pinned units."""

    name: str
    order: int
    due: float
    steps: float
    sp: Speeds
    pin_units: int

    @property
    def top(self) -> int:
        """Fastest level within the capacity (0: none has a known speed)."""
        return self.sp.unit_list[-1]

    @property
    def alone_s(self) -> float:
        """Seconds at the fastest level with the whole cluster."""
        fastest = self.sp.rate_list[-1]  # a float: no array read (asked per job per test)
        return self.steps / fastest if fastest else math.inf

    def quickest(self, window: float) -> int:
        """Smallest level done within ``window`` seconds, else the fastest."""
        fits = (
            n
            for n, r in zip(self.sp.units[1:], self.sp.rates[1:], strict=True)
            if self.steps <= r * window
        )
        return int(next(fits, self.top))


def fill_job(c: Candidate, capacity: int, order: int) -> FillJob:
    """The fill's view of a candidate; ``order`` breaks deadline ties (insertion order)."""
    pin = c.running_units if c.guaranteed else 0
    sp = speeds_of(c.levels, c.step_time, capacity, pin)
    return FillJob(c.name, order, c.due, float(c.remaining_steps), sp, pin)


@functools.lru_cache(maxsize=64)
def _offsets(slot_s: float, blocks: int) -> FloatArray:
    """:func:`timeline`'s edges less ``now``: the fine grid, then ``blocks`` doubling blocks.

    The same few grids serve every plan of a run (the allocator builds tens of thousands), so
    they are built once; read-only, since every caller gets the same array.
    """
    lengths: list[FloatArray] = [np.full(FINE_SLOTS, slot_s)]
    length = slot_s
    for _ in range(blocks):
        length *= 2.0
        lengths.append(np.full(COARSE_BLOCK, length))
    out = np.concatenate(([0.0], np.cumsum(np.concatenate(lengths))))
    out.flags.writeable = False
    return out


def timeline(now: float, horizon: float, slot_s: float, marks: Sequence[float]) -> FloatArray:
    """Slot edges from ``now`` past ``horizon``: a fine grid, then doubling slots, plus ``marks``."""
    span = max(horizon - now, slot_s)
    covered, length, blocks = FINE_SLOTS * slot_s, slot_s, 0
    while covered < span:
        length *= 2.0
        covered += COARSE_BLOCK * length
        blocks += 1
    grid = now + _offsets(slot_s, blocks)
    grid = grid[: int(np.searchsorted(grid, now + span, side="left")) + 1]
    inside = np.array([m for m in marks if now < m <= grid[-1]], dtype=np.float64)
    return np.unique(np.concatenate((grid, inside)))


def _first_rate(rates: Sequence[float], target: float, span: float) -> int:
    """First index with ``rates[i] * span >= target`` (``rates`` ascending, ``span`` > 0).

    A bisection on ``target / span``, then corrected to the products' own rounding.
    """
    i = bisect.bisect_left(rates, target / span)
    while i > 0 and rates[i - 1] * span >= target:
        i -= 1
    while i < len(rates) and rates[i] * span < target:
        i += 1
    return i


class Timeline:
    """Free units per slot, mutated as jobs are placed (a local workspace, never shared)."""

    def __init__(self, edges: FloatArray, capacity: int, slot_s: float, pinned: int) -> None:
        self.edges = edges
        self.edge_list: list[float] = edges.tolist()
        self.lens = np.diff(edges)
        self.npin = bisect.bisect_left(self.edge_list, self.edge_list[0] + slot_s)
        self.free0 = np.full(self.lens.size, capacity, dtype=np.int64)
        self.free0[: self.npin] = max(capacity - pinned, 0)
        self.free = self.free0.copy()

    def reset(self) -> None:
        """Forget every placement."""
        self.free = self.free0.copy()

    def index(self, t: float) -> int:
        """Index of the last edge at or before ``t``."""
        return bisect.bisect_right(self.edge_list, t) - 1

    def apply(self, p: Placement) -> None:
        """Take a placement's units out of the free units."""
        self.free[p.start : p.end] -= p.alloc

    def block(self, job: FillJob) -> Block | Placement | None:
        """Where the backward fill puts ``job`` when the free units allow one level throughout.

        ``(start, end, cap, i, first, target)``: the block ``[start, end)`` at ``cap =
        units[i]``, which depends on the job and the edges only (not on what is free); a
        :class:`Placement` when nothing is left to place; ``None`` when no block can fit.
        """
        end = self.index(job.due)
        first = self.npin if job.pin_units else 0
        need = job.steps
        if job.pin_units:
            need -= job.sp.pin_rate * (self.edge_list[min(end, self.npin)] - self.edge_list[0])
        if need <= EPS * max(job.steps, 1.0):
            return Placement(end, end, 0, job.pin_units)
        if end <= first:
            return None
        target, rates = need * (1.0 - EPS), job.sp.rate_list
        span = self.edge_list[end] - self.edge_list[first]
        lo = _first_rate(rates, target, span)
        if lo >= len(rates):
            return None
        start = max(self.index(self.edge_list[end] - target / rates[lo]), first)
        return start, end, job.sp.unit_list[lo], lo, first, target

    def place(self, job: FillJob) -> Placement | None:
        """Minimal satisfactory share of ``job`` by backward fill; ``None`` when it cannot fit."""
        b = self.block(job)
        if b is None or isinstance(b, Placement):
            return b
        start, end, cap = b[:3]
        if int(self.free[start:end].min()) >= cap:  # the whole block at one level fits
            return Placement(start, end, cap, cap)
        return self._beyond(job, b)

    def _beyond(self, job: FillJob, b: Block) -> Placement | None:
        """:meth:`place` where the block at one level does not fit: levels vary per slot."""
        start, end, _, lo, first, target = b
        hint, hi = 4 * (end - start) + 16, job.sp.rates.size - 1
        best = self._fill(job, lo, first, end, target, hint)
        if best is None and hi > lo:
            best = self._fill(job, hi, first, end, target, end)  # whole window at once
            lo += 1
            while best is not None and lo < hi:  # smallest cap in [lo, hi] that fits
                mid = (lo + hi) // 2
                got = self._fill(job, mid, first, end, target, hint)
                if got is None:
                    lo = mid + 1
                else:
                    best, hi = got, mid
        return best

    def _fill(
        self, job: FillJob, i: int, first: int, end: int, target: float, hint: int
    ) -> Placement | None:
        """Backward fill under cap ``units[i]``: per slot the best level within cap and free."""
        cap, lo = int(job.sp.units[i]), max(first, end - hint)
        units, rates = job.sp.units, job.sp.rates
        while True:  # a window near the deadline first, widened only when needed
            idx = units.searchsorted(np.minimum(self.free[lo:end], cap), "right") - 1
            work = rates[idx] * self.lens[lo:end]
            if work.sum() >= target:  # cheap; the running sum only when the window suffices
                back = int(work[::-1].cumsum().searchsorted(target))
                if back < work.size:
                    start = end - 1 - back
                    return Placement(start, end, units[idx[start - lo :]], cap)
            if lo == first:
                return None
            hint *= 4
            lo = max(first, end - hint)


def edf(jobs: Sequence[FillJob]) -> list[FillJob]:
    """Jobs in earliest-effective-deadline order, ties by insertion."""
    return sorted(jobs, key=lambda j: (j.due, j.order))


def place_in_order(
    tl: Timeline,
    order: Sequence[FillJob],
    *,
    stop: bool,
    snapshots: list[IntArray] | None = None,
) -> tuple[dict[str, Placement], list[str]]:
    """Place ``order`` one by one; ``snapshots`` gets the free units before every 64th job.

    The same as :meth:`Timeline.place` of each job in turn, done by runs: a job's one-level
    block (:meth:`Timeline.block`) does not depend on what is free, so a run of blocks is
    checked against the free units at once (:class:`~qosflow.core.runs.Runs`), and a job is
    placed on its own only where its block does not fit next to those before it. Runs double
    while they fit.
    """
    placed: dict[str, Placement] = {}
    failed: list[str] = []
    runs = Runs(tl.free, [tl.block(job) for job in order])
    n, i, run = len(order), 0, 1
    while i < n:
        j = min(i + run, n)
        f, usage = runs.first_misfit(i, j, stop=stop)
        for k in range(i, f):
            b = runs.blocks[k]
            if b is None:
                failed.append(order[k].name)
            else:
                placed[order[k].name] = b if isinstance(b, Placement) else Placement(*b[:3], b[2])
        if snapshots is not None:
            runs.snapshots(i, f, SNAPSHOT_EVERY, snapshots)
        if usage is not None:
            tl.free -= usage
        if f == j:  # the whole run fit: try a longer one
            i, run = j, run * 2
            continue
        if snapshots is not None and f % SNAPSHOT_EVERY == 0:
            snapshots.append(tl.free.copy())
        job = order[f]
        got = tl.place(job)  # on its own, on the free units the jobs before it left
        if got is None:
            failed.append(job.name)
            if stop:
                break
        else:
            tl.apply(got)
            placed[job.name] = got
        i, run = f + 1, 1
    return placed, failed


def backward_fill(
    jobs: Sequence[Candidate],
    *,
    capacity: int,
    now: float,
    slot_s: float = 60.0,
    first: Collection[str] = (),
) -> FillPlan:
    """Backward-fill every job with a finite deadline and steps left, in deadline order.

    This is the constructive test :func:`qosflow.core.admission.admit` runs; it is public so that a
    guarantee can be checked against its plan. Running guaranteed jobs keep ``running_units`` in
    the first slot. Jobs named in ``first`` are placed before all others (in deadline order among
    themselves): a guarantee that no longer fits behind the others is repaired by placing it
    ahead of them.
    """
    check_inputs(capacity, now, slot_s)
    js = [
        fill_job(c, capacity, i)
        for i, c in enumerate(jobs)
        if c.remaining_steps and c.due < math.inf
    ]
    dues = [j.due for j in js]
    tl = Timeline(
        timeline(now, max([*dues, now]), slot_s, dues),
        capacity,
        slot_s,
        sum(j.pin_units for j in js),
    )
    ahead = edf([j for j in js if j.name in first])
    placed, failed = place_in_order(
        tl, [*ahead, *edf([j for j in js if j.name not in first])], stop=False
    )
    pins = {j.name: j.pin_units for j in js}
    return FillPlan(tl.edges, tl.free, pins, placed, tuple(failed), tl.npin)
