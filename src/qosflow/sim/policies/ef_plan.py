"""ElasticFlow's planner: minimum satisfactory share with backward filling (``ALGORITHM.md`` §5.1).

The free-GPU profile ``F`` is a step function kept as two sorted parallel lists (change times and
free GPUs from each time on). :func:`plan` reserves one job into ``F`` and returns its plan; with
``assign`` it is the trial of the leftover allocator (§5.3): run at ``assign`` GPUs from now until
done or the next change point of ``F``, then re-plan the rest. Every rounding and boundary follows
the artifact (deadline aligned up to the slot grid, the last segment ending at the true deadline,
``real_end = start + ceil(remaining / T)``), including its quirks, so the numbers reproduce.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

Profile = tuple[list[int], list[int]]


@dataclass(frozen=True, slots=True)
class JobCurve:
    """What the planner needs of one job: its levels (ascending, capped) and speeds."""

    levels: tuple[int, ...]
    speed: Mapping[int, float]
    cap: int

    def below(self, free: int) -> int:
        """Largest level <= ``free`` (0 if none)."""
        i = bisect_right(self.levels, free)
        return self.levels[i - 1] if i else 0

    def above(self, units: int) -> int:
        """Next level above ``units`` (``units`` itself at the top; the first level from 0)."""
        for k in self.levels:
            if k > units:
                return k
        return units


@dataclass(frozen=True, slots=True)
class Plan:
    """A job's plan: ``allocations`` as sorted (time, GPUs) change points, merged."""

    ok: bool
    profile: Profile
    allocations: tuple[tuple[int, int], ...]
    end: int
    real_end: int


def align(start: int, t: float, slot: int) -> int:
    """``t`` rounded up to the slot grid that starts at ``start``."""
    n = (t - start) // slot
    if (t - start) % slot > 0:
        n += 1
    return int(start + n * slot)


def value_at(profile: Profile, t: int, default: int) -> int:
    """Free GPUs at time ``t`` (the value of the last change point <= t)."""
    keys, vals = profile
    i = bisect_right(keys, t) - 1
    return vals[i] if i >= 0 else default


def merge(keys: list[int], vals: list[int]) -> Profile:
    """Drop change points that repeat the previous value."""
    out_k: list[int] = []
    out_v: list[int] = []
    last = -1
    for k, v in zip(keys, vals, strict=True):
        if v != last:
            out_k.append(k)
            out_v.append(v)
            last = v
    return out_k, out_v


def set_point(keys: list[int], vals: list[int], t: int, v: int) -> int:
    """Set ``F[t] = v`` (inserting the change point); return its index."""
    i = bisect_left(keys, t)
    if i < len(keys) and keys[i] == t:
        vals[i] = v
    else:
        keys.insert(i, t)
        vals.insert(i, v)
    return i


def gpu_seconds(allocations: tuple[tuple[int, int], ...], end: int) -> float:
    """GPU-seconds of a plan until ``end`` (the artifact's ``get_allocation_time``)."""
    total = 0.0
    for (t, k), (t2, _) in pairwise(allocations):
        total += k * (t2 - t)
    if allocations:
        t, k = allocations[-1]
        total += k * (end - t)
    return total


def _finalise(allocs: dict[int, int]) -> tuple[tuple[int, int], ...]:
    keys = sorted(allocs)
    mk, mv = merge(keys, [allocs[k] for k in keys])
    return tuple(zip(mk, mv, strict=True))


class _Planner:
    """One call of the planner (the artifact's ``ef_sim_allocation``), on copies of ``F``."""

    def __init__(
        self,
        job: JobCurve,
        ddl: float,
        left: float,
        profile: Profile,
        now: int,
        slot: int,
        n: int,
        want_profile: bool = True,
    ) -> None:
        self.job, self.ddl, self.left, self.now, self.slot, self.n = job, ddl, left, now, slot, n
        self.want_profile = want_profile
        self.orig_keys, self.orig_vals = profile
        self.keys, self.vals = list(profile[0]), list(profile[1])
        self.aligned = align(now, ddl, slot)
        self.last_event_gpu = n
        if self.aligned >= now and not self.in_orig(self.aligned):
            i = bisect_left(self.keys, self.aligned)
            if i > 0:
                self.last_event_gpu = self.vals[i - 1]
            set_point(self.keys, self.vals, self.aligned, self.last_event_gpu)
        self.allocs: dict[int, int] = {now: 0}

    def in_orig(self, t: int) -> bool:
        """Whether ``t`` is a change point of the input profile."""
        i = bisect_left(self.orig_keys, t)
        return i < len(self.orig_keys) and self.orig_keys[i] == t

    def first_after(self, t: int) -> int | None:
        """The input profile's first change point after ``t``."""
        i = bisect_right(self.orig_keys, t)
        return self.orig_keys[i] if i < len(self.orig_keys) else None

    def T(self, k: int) -> float:
        return self.job.speed[k]

    def result(self, ok: bool, end: int, real_end: int) -> Plan:
        """The plan of this call.

        Without ``want_profile`` (a trial that is only scored) the allocations are left
        unmerged: the allocation dict is already in time order on every path, and merging equal
        neighbours does not change :func:`gpu_seconds` (sums of integer products).
        """
        if not self.want_profile:
            return Plan(ok, ([], []), tuple(self.allocs.items()), end, real_end)
        return Plan(ok, merge(self.keys, self.vals), _finalise(self.allocs), end, real_end)

    def restore_after(self, end: int) -> None:
        """Give the capacity back from ``end`` on (original free value of the last point < end)."""
        if not self.want_profile:
            return
        last = self.n
        for t, v in zip(self.orig_keys, self.orig_vals, strict=True):
            if t < self.now:
                continue
            if t < end:
                last = v
        if not self.in_orig(end):
            set_point(self.keys, self.vals, end, last)

    def assign(self, quota: int) -> Plan | None:
        """Trial: ``quota`` GPUs from now; ``None`` when the rest needs the general planner."""
        now = self.now
        available = self.vals[bisect_left(self.keys, now)]
        nxt = self.first_after(now)
        fut = nxt if nxt is not None else self.aligned
        self.allocs = {now: quota}
        real_end = math.ceil(now + self.left / self.T(quota))
        end = align(now, real_end, self.slot)
        if fut >= end and self.ddl >= real_end:
            last = self.n
            lo, hi = bisect_left(self.orig_keys, now), bisect_left(self.orig_keys, end)
            for t in self.orig_keys[lo:hi]:
                i = bisect_left(self.keys, t)
                last = self.vals[i]
                self.vals[i] -= quota
            if now != end:
                self.vals[bisect_left(self.keys, now)] = available - quota
            if not self.in_orig(end):
                set_point(self.keys, self.vals, end, last)
            return self.result(True, end, real_end)
        duration = (self.ddl - now) if fut == self.aligned else (fut - now)
        self.left -= duration * self.T(quota)
        self.vals[bisect_left(self.keys, now)] -= quota
        self.allocs[fut] = 0
        return None

    def mss(self, start: int, assigned: int | None = None) -> Plan:
        """Minimum satisfactory share from ``start`` (backward test, forward reservation).

        The backward test of one cap reads, per segment from the deadline down, its duration
        (to the true deadline for the last one) and the GPUs it would get, ``min(cap, largest
        level that fits)``; neither the durations nor the largest fitting levels depend on the
        cap, so they are read once and every cap walks the same list.
        """
        job, keys, vals, aligned, ddl = self.job, self.keys, self.vals, self.aligned, self.ddl
        top = bisect_left(keys, aligned)
        bottom = bisect_left(keys, start)
        filled = dict.fromkeys(keys[:top], 0)
        filled.update(self.allocs)
        self.allocs = filled
        below, speed, left = job.below, job.speed, self.left
        segments: list[tuple[int, float, int]] = []  # (start, duration, largest level that fits)
        for i in range(top - 1, bottom - 1, -1):
            fit = below(vals[i])
            if fit:
                p = keys[i]
                segments.append((p, (ddl - p) if i == top - 1 else (keys[i + 1] - p), fit))
        last_q, last_last = 0, 0
        for quota in job.levels:
            if quota > self.n or quota > job.cap:
                break
            acc = 0.0
            for p, duration, fit in segments:
                acc += duration * speed[quota if fit >= quota else fit]
                if acc >= left:
                    return self.forward(start, p, quota, last_q)
            last_last, last_q = last_q, quota
        return self.fail(start, last_q, last_last, assigned)

    def forward(self, start: int, point: int, quota: int, last_q: int) -> Plan:
        """Reserve forwards: ``last_q`` before ``point``, ``quota`` from it, until done."""
        keys, vals, job, allocs = self.keys, self.vals, self.job, self.allocs
        speed, below, ddl, aligned = job.speed, job.below, self.ddl, self.aligned
        left, last_i, last_a = self.left, -1, 0
        for i in range(bisect_left(keys, start), bisect_right(keys, aligned)):
            t = keys[i]
            if last_i >= 0:
                lt = keys[last_i]
                allocs[lt] = last_a
                vals[last_i] -= last_a
                if last_a != 0:
                    its = ((ddl - lt) if t == aligned else (t - lt)) * speed[last_a]
                    if lt < point or its < left:
                        left -= its
                    else:
                        rtl = math.ceil(left / speed[last_a])
                        end, real_end = lt + align(0, rtl, self.slot), lt + rtl
                        self.restore_after(end)
                        return self.result(real_end <= ddl, end, real_end)
            last_i = i
            cap = quota if t >= point else last_q
            free = vals[i]
            last_a = cap if free >= cap else min(cap, below(free))
        lt = keys[last_i]
        allocs[lt] = last_a
        vals[last_i] -= last_a
        rtl = math.ceil(left / speed[last_a]) if last_a else 10**12
        end, real_end = lt + align(0, rtl, self.slot), lt + rtl
        self.restore_after(end)
        return self.result(real_end <= ddl, end, real_end)

    def fail(self, start: int, last_q: int, last_last: int, assigned: int | None) -> Plan:
        """No level meets the deadline: run on what is left, then at the cap after the profile."""
        keys, vals, job = self.keys, self.vals, self.job
        last_i, last_a = -1, 0
        for i in range(bisect_left(keys, start), bisect_right(keys, self.aligned)):
            t = keys[i]
            if last_i >= 0:
                lt = keys[last_i]
                self.allocs[lt] = last_a
                vals[last_i] -= last_a
                if last_a != 0:
                    duration = (self.ddl - lt) if t == self.aligned else (t - lt)
                    self.left -= duration * self.T(last_a)
            last_i = i
            last_a = min(last_q, job.below(vals[i]))
        return self.after_deadline(start, assigned)

    def _finish_after(self, lt: int, q: int) -> Plan:
        """The job completes at ``q`` GPUs in the segment starting at ``lt`` (after the deadline)."""
        keys, vals = self.keys, self.vals
        real_end = math.ceil(lt + self.left / self.T(q))
        end = align(self.now, real_end, self.slot)
        last = self.last_event_gpu
        for j, t1 in enumerate(list(keys)):
            if t1 < self.aligned:
                continue
            if t1 < end and self.in_orig(t1):
                last = self.orig_vals[self.orig_keys.index(t1)]
            if lt <= t1 < end:
                vals[j] -= q
        if lt != end:
            set_point(keys, vals, lt, last - q)
        if not self.in_orig(end):
            set_point(keys, vals, end, last)
        return self.result(real_end <= self.ddl, end, real_end)

    def after_deadline(self, start: int, assigned: int | None) -> Plan:
        """Plan the rest past the deadline: what is free, then the cap after the last point."""
        keys, vals, job = self.keys, self.vals, self.job
        lt = max(self.aligned, start)
        for t in list(keys):
            if t <= self.aligned:
                continue
            q = min(job.below(value_at((keys, vals), lt, self.n)), job.cap)
            self.allocs[lt] = q
            if q == 0:
                lt = t
                continue
            its = (t - lt) * self.T(q)
            if its >= self.left:
                return self._finish_after(lt, q)
            self.left -= its
            for t1 in self.orig_keys:
                if t1 < lt:
                    self.last_event_gpu = vals[bisect_left(keys, t1)]
            for j, t1 in enumerate(keys):
                if lt <= t1 < t:
                    vals[j] -= q
            lt = t
        q = min(self.n, job.cap) if assigned is None else assigned
        self.allocs[lt] = q
        real_end = math.ceil(lt + self.left / self.T(q))
        end = align(self.now, real_end, self.slot)
        set_point(keys, vals, lt, self.n - q)
        set_point(keys, vals, end, self.n)
        return self.result(False, end, real_end)


def plan(
    job: JobCurve,
    *,
    ddl: float,
    left: float,
    profile: Profile,
    now: int,
    slot: int,
    capacity: int,
    assign: int | None = None,
    want_profile: bool = True,
) -> Plan:
    """Plan one job into ``profile`` (returned in the ``Plan``; the input is not modified).

    Args:
        job: Levels, speeds and cap of the job.
        ddl: Absolute deadline (a large number for best effort).
        left: Remaining iterations.
        profile: Free-GPU profile starting at ``now``.
        now: Current time.
        slot: Scheduling slot.
        capacity: GPUs in the cluster.
        assign: Trial size for the leftover allocator, or ``None`` for the MSS plan.
        want_profile: Build the updated profile (not needed to score a trial).
    """
    planner = _Planner(job, ddl, left, profile, now, slot, capacity, want_profile)
    if assign is None:
        return planner.mss(now)
    done = planner.assign(assign)
    if done is not None:
        return done
    nxt = planner.first_after(now)
    return planner.mss(nxt if nxt is not None else planner.aligned, assigned=assign)
