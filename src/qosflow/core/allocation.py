"""Sharing the cluster's units among prepared jobs: the guarantees' plan first, then the rest.

The steps of :func:`qosflow.core.allocator.allocate` after admission, in the order it runs them:

1. :func:`reserve` — every guarantee's backward-fill plan (the proof behind it) and the units it
   needs *now*; a guarantee that slipped is :func:`repair`-ed by running it first, as fast as it
   can; an unguaranteed job that can still make it at its fastest gets that when every
   guarantee still fits around it (:func:`last_chances`);
2. minimal shares, running jobs' own rescale decisions and waiting jobs' first units
   (:class:`Units`);
3. :func:`spread` — spare units one level at a time where they save the most seconds.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from qosflow.core import admission
from qosflow.core.decide import BENEFIT_FACTOR, JobSnapshot
from qosflow.core.predict import Belief, Calibration, finish_on
from qosflow.core.spec import JobSpec


@dataclass(slots=True)
class Prepared:
    """A job readied for one decision (what the allocation steps work on).

    Attributes:
        spec: The job.
        done: Steps done (fractional in simulation).
        belief: What it is believed to run at.
        snap: The core's snapshot of it (a waiting job asks for its smallest level).
        need: Its minimal satisfactory share, the fastest plannable size when only that may
            save it, or ``None``.
        klass: Its PriorityClass rung.
        keep: The size the core's rescale rules keep it at (0 while waiting).
        promise: The belief its guarantee is planned on (never less conservative than at
            admission).
        guaranteed: Whether it holds a guarantee.
        tight: Inside its margin, not hopeless, and only its fastest size may make it.
        at_risk: A guarantee that even its fastest plannable size no longer saves.
        pressed: A guarantee that takes its minimal share ahead of the jobs that are not
            (:func:`pressed`).
    """

    spec: JobSpec
    done: float
    belief: Belief
    snap: JobSnapshot
    need: int | None
    klass: str
    keep: int
    promise: Belief
    guaranteed: bool = False
    tight: bool = False
    at_risk: bool = False
    pressed: bool = False
    _candidate: admission.Candidate | None = None
    name: str = dataclasses.field(init=False)
    """The job's id (its spec's name)."""

    def __post_init__(self) -> None:
        self.name = self.spec.name

    @property
    def remaining(self) -> float:
        """Steps still to run."""
        return max(self.spec.total_steps - self.done, 0.0)

    @property
    def lost(self) -> bool:
        """Even its expected (median) speed no longer makes its deadline at the size it may use."""
        size = self.need or self.belief.levels[0]
        end = finish_on(self.belief.median, self.snap.now, math.ceil(self.remaining), size)
        return end > self.spec.deadline

    def candidate(self) -> admission.Candidate:
        """The job as admission and the backward fill see it (on its promise; made once)."""
        if self._candidate is None or self._candidate.guaranteed != self.guaranteed:
            self._candidate = admission.candidate(
                self.spec,
                self.promise,
                steps_done=self.snap.steps_done,
                now=self.snap.now,
                guaranteed=self.guaranteed,
                running_units=0,
            )
        return self._candidate


PRESSED_SHARE = 0.5
"""A guarantee is pressed once its fastest plannable size needs this share of its time left."""


def pressed(promise: Belief, remaining: float, cap: int, due_in: float) -> bool:
    """Whether a guarantee must now take its share ahead of the jobs without one.

    Until then a guarantee is one deadline job among the others (earliest deadline first) and its
    backward-fill plan claims the units it cannot do without. Once its promise needs its fastest
    plannable size ``cap`` for :data:`PRESSED_SHARE` of the ``due_in`` seconds left before its
    deadline minus margin, it goes first (why not sooner or later: docs/experiments.md).

    Args:
        promise: The belief the guarantee is planned on.
        remaining: Steps still to run.
        cap: Its fastest plannable size.
        due_in: Seconds from now to its deadline minus margin.
    """
    if remaining <= 0:
        return False
    if due_in <= 0:
        return True
    return remaining * promise.conservative.step_time(cap) >= PRESSED_SHARE * due_in


def reason(job: Prepared, units: int) -> str:
    """The allocation of one job, in words."""
    if units == 0:
        return "waits: the guarantees' plan and the jobs ahead of it hold every unit now"
    why = "guaranteed" if job.guaranteed else "not guaranteed"
    why = "best effort" if job.spec.best_effort else why
    share = f"minimal share {job.need}" if job.need is not None else "no size known to make it"
    return f"{why}; {share}; {units} units ({job.klass})"


def ratchet(old: Calibration | None, new: Calibration) -> Calibration:
    """The learnt factor only ever grows (the first one learnt replaces the default).

    The quantile of a sliding window of interval ratios wobbles with the window's mix; every
    guarantee is re-planned on it at every decision, so a dip would hand slack to newcomers that
    the next rise takes back from jobs already promised. Taking the running maximum keeps the
    plans' beliefs stable (and conservative); it is still learnt, never hand-set.
    """
    if old is None or old.n == 0:
        return new
    return Calibration(max(old.factor, new.factor), new.n)


def forward(c: admission.Candidate, now: float, slot_s: float) -> admission.Candidate | None:
    """``c`` due as soon as its fastest level can finish it from now (``None``: no known speed).

    Backward fill then places it at that level from the first slot on: forward, not late.
    """
    if not math.isfinite(c.step_time[-1]):
        return None
    finish = now + c.remaining_steps * c.step_time[-1]
    return dataclasses.replace(c, deadline=max(finish, now + slot_s), margin=0.0)


def repair(
    plan: admission.FillPlan,
    cands: list[admission.Candidate],
    *,
    capacity: int,
    now: float,
    slot_s: float,
) -> admission.FillPlan:
    """Re-plan so that guarantees the fill could not place run now, as fast as they can.

    A guaranteed job that no longer fits behind the others (its margin was eaten by overheads or
    by a belief that turned more pessimistic) must not be starved: that turns a slip of seconds
    into a broken promise. It is placed *ahead* of the other guarantees, due as soon as its
    fastest level can finish it (forward, from now), and the others are re-filled around it.
    The repaired plan is kept only when it places every guarantee.
    """
    failed = set(plan.failed)
    urgent = []
    for c in cands:
        fast = forward(c, now, slot_s) if c.name in failed else None
        # the others may spend their margins on it, never their deadlines
        urgent.append(fast or dataclasses.replace(c, margin=0.0))
    repaired = admission.backward_fill(
        urgent, capacity=capacity, now=now, slot_s=slot_s, first=failed
    )
    return repaired if not repaired.failed else plan


def last_chances(
    plan: admission.FillPlan,
    cands: list[admission.Candidate],
    jobs: Sequence[Prepared],
    *,
    capacity: int,
    now: float,
    slot_s: float,
) -> admission.FillPlan:
    """Reserve the fastest level, from now, for unguaranteed jobs that need it to make it.

    A deadline job told "not guaranteed" (its margin did not fit) may still finish in time if it
    runs at its knee at once. It gets that, earliest deadline first (``jobs`` are in allocation
    order), only when every guarantee's plan, margins included, still fits around it: a last
    chance never costs a promise.
    """
    ahead: list[admission.Candidate] = []
    for job in jobs:
        if not job.tight or job.guaranteed:
            continue
        c = forward(job.candidate(), now, slot_s)
        if c is None or c.deadline > job.spec.deadline:
            continue
        trial = admission.backward_fill(
            [*cands, *ahead, c],
            capacity=capacity,
            now=now,
            slot_s=slot_s,
            first={x.name for x in (*ahead, c)},
        )
        if not trial.failed:
            ahead.append(c)
            plan = trial
    return plan


def reserve(
    jobs: Sequence[Prepared], *, capacity: int, now: float, slot_s: float
) -> tuple[dict[str, int], int | None]:
    """Units the guarantees' backward-fill plan needs now, and when that plan next changes.

    The plan (:func:`qosflow.core.admission.backward_fill`) is the proof behind every guarantee;
    filling late keeps early capacity free for others, so the caller must decide again when a
    planned block starts (the second value, whole seconds; ``None``: never).
    """
    cands = [j.candidate() for j in jobs if j.guaranteed]
    if not cands:
        return {}, None
    plan = admission.backward_fill(cands, capacity=capacity, now=now, slot_s=slot_s)
    if plan.failed:
        plan = repair(plan, cands, capacity=capacity, now=now, slot_s=slot_s)
    else:
        plan = last_chances(plan, cands, jobs, capacity=capacity, now=now, slot_s=slot_s)
    wake: float | None = None
    now_units: dict[str, int] = {}
    for name, (units, first) in plan.changes().items():
        now_units[name] = units
        if first is not None:
            t = float(plan.edges[first])
            wake = t if wake is None else min(wake, t)
    return now_units, None if wake is None else math.ceil(wake)


@dataclass(slots=True)
class Units:
    """The allocation being built: units per job and the units still free."""

    units: dict[str, int]
    free: int

    def raise_to(self, job: Prepared, target: int) -> None:
        """Grow the job to the largest level <= ``target`` that fits (never shrinks)."""
        have = self.units[job.name]
        if target <= have:  # most calls: nothing to grow
            return
        level = fit_level(job.belief.levels, min(target, have + self.free))
        if level > have:
            self.free -= level - have
            self.units[job.name] = level

    def exactly(self, job: Prepared, target: int | None) -> None:
        """Grow the job to exactly ``target`` when it fits whole, else leave it."""
        have = self.units[job.name]
        if target is not None and have < target <= have + self.free:
            self.free -= target - have
            self.units[job.name] = target


def fit_level(levels: tuple[int, ...], limit: int) -> int:
    """Largest level at most ``limit`` (0 when none fits); ``levels`` ascending."""
    i = bisect.bisect_right(levels, limit)
    return levels[i - 1] if i else 0


def level_gain(job: Prepared, have: int) -> tuple[float, int] | None:
    """Seconds saved per extra unit by growing one level from ``have`` (None: not worth it).

    Growing costs a rescale, so it must save more than the core's benefit factor times the
    rescale overhead, and a job inside its dwell time is not moved at all.
    """
    levels = job.belief.levels
    i = bisect.bisect_right(levels, have)  # the next level up (levels ascend)
    if i == len(levels) or levels[i] > job.belief.knee or dwelling(job):
        return None
    up = levels[i]
    med = job.belief.median
    saved = job.remaining * (med.step_time(have) - med.step_time(up))
    if saved <= BENEFIT_FACTOR * job.snap.rescale_overhead_s:
        return None
    return saved / (up - have), up


def dwelling(job: Prepared) -> bool:
    """Whether the job was rescaled less than its dwell time ago."""
    last = job.snap.last_rescale_at
    return last is not None and job.snap.now - last < job.spec.dwell_seconds


def spread(jobs: Sequence[Prepared], alloc: dict[str, int], free: int) -> dict[str, int]:
    """Give spare units one level at a time to the job saving the most seconds per unit."""
    if free <= 0:
        return alloc
    heap: list[tuple[float, int, int]] = []
    for idx, job in enumerate(jobs):
        gain = level_gain(job, alloc[job.name]) if alloc[job.name] else None
        if gain is not None:
            heapq.heappush(heap, (-gain[0], idx, gain[1]))
    while free > 0 and heap:
        _, idx, up = heapq.heappop(heap)
        name = jobs[idx].name
        if up - alloc[name] > free:
            continue
        free -= up - alloc[name]
        alloc[name] = up
        gain = level_gain(jobs[idx], up)
        if gain is not None:
            heapq.heappush(heap, (-gain[0], idx, gain[1]))
    return alloc
