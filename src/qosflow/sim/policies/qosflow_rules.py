"""The rules of the ``qosflow`` policy that work on prepared jobs: repair, allocation, spreading.

Kept beside :mod:`qosflow.sim.policies.qosflow_policy`, which prepares the jobs of a decision and
calls these in order (see its docstring for the whole policy).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

from qosflow.core import admission
from qosflow.core.decide import BENEFIT_FACTOR, JobSnapshot
from qosflow.core.predict import Belief, Calibration
from qosflow.core.spec import JobSpec
from qosflow.sim.policy import JobView


@dataclass(slots=True)
class PolicyJob:
    """A job prepared for this decision."""

    view: JobView
    spec: JobSpec
    belief: Belief
    snap: JobSnapshot
    need: int | None
    klass: str
    keep: int
    promise: Belief
    tight: bool = False
    at_risk: bool = False


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


@dataclass(slots=True)
class Alloc:
    """The allocation being built: units per job and the units still free."""

    units: dict[str, int]
    free: int

    def raise_to(self, job: PolicyJob, target: int) -> None:
        """Grow the job to the largest level <= ``target`` that fits (never shrinks)."""
        have = self.units[job.view.job_id]
        level = fit_level(job.belief.levels, min(target, have + self.free))
        if level > have:
            self.free -= level - have
            self.units[job.view.job_id] = level

    def exactly(self, job: PolicyJob, target: int | None) -> None:
        """Grow the job to exactly ``target`` when it fits whole, else leave it."""
        have = self.units[job.view.job_id]
        if target is not None and have < target <= have + self.free:
            self.free -= target - have
            self.units[job.view.job_id] = target


def fit_level(levels: tuple[int, ...], limit: int) -> int:
    """Largest level at most ``limit`` (0 when none fits)."""
    best = 0
    for n in levels:
        if n <= limit:
            best = n
    return best


def level_gain(job: PolicyJob, have: int) -> tuple[float, int] | None:
    """Seconds saved per extra unit by growing one level from ``have`` (None: not worth it).

    Growing costs a rescale, so it must save more than the core's benefit factor times the
    rescale overhead, and a job inside its dwell time is not moved at all.
    """
    up = next((n for n in job.belief.levels if n > have), None)
    if up is None or up > job.belief.knee or dwelling(job):
        return None
    med = job.belief.median
    saved = job.view.remaining * (med.step_time(have) - med.step_time(up))
    if saved <= BENEFIT_FACTOR * job.snap.rescale_overhead_s:
        return None
    return saved / (up - have), up


def dwelling(job: PolicyJob) -> bool:
    """Whether the job was rescaled less than its dwell time ago."""
    last = job.snap.last_rescale_at
    return last is not None and job.snap.now - last < job.spec.dwell_seconds


def spread(jobs: list[PolicyJob], alloc: dict[str, int], free: int) -> dict[str, int]:
    """Give spare units one level at a time to the job saving the most seconds per unit."""
    heap: list[tuple[float, int, int]] = []
    for idx, job in enumerate(jobs):
        gain = level_gain(job, alloc[job.view.job_id]) if alloc[job.view.job_id] else None
        if gain is not None:
            heapq.heappush(heap, (-gain[0], idx, gain[1]))
    while free > 0 and heap:
        _, idx, up = heapq.heappop(heap)
        job_id = jobs[idx].view.job_id
        if up - alloc[job_id] > free:
            continue
        free -= up - alloc[job_id]
        alloc[job_id] = up
        gain = level_gain(jobs[idx], up)
        if gain is not None:
            heapq.heappush(heap, (-gain[0], idx, gain[1]))
    return alloc
