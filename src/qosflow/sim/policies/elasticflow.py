"""``elasticflow`` — ElasticFlow (ASPLOS'23) as its artifact simulates it (``ALGORITHM.md`` §5).

Two names, one algorithm. :class:`ElasticFlow` (``elasticflow``) also keeps the artifact's
timekeeping (``completion = "artifact"``, see :class:`qosflow.sim.engine.SimConfig`): a planned
finish that leaves out the overhead charged at the same decision, progress credited only up to it,
a job ended only at its slot-aligned end event, and the artifact's count (a job meets its deadline
when its last planned finish does). Jobs left a few iterations short then hold GPUs past their
deadlines and, while infeasible, make every arriving job fail admission: the artifact's numbers,
job by job. :class:`ElasticFlowExact` (``elasticflow-exact``) runs the same decisions on the exact
engine (completion when the iterations are done; met when that is by the deadline).

At every decision: every admitted unfinished job is re-planned from scratch in deadline order with
the minimum satisfactory share (:mod:`.ef_plan`). When jobs arrived, the newcomers are planned
together with them; if any job of the whole set is infeasible, every deadline newcomer of the
event is declined (best-effort ones queue) and the previous jobs are re-planned alone. A waiting
job starts when its plan gives it GPUs now. Leftover GPUs then go, one level at a time, to the job
with the highest score ``(G(trial) - G(current)) / added GPUs`` (``G`` = planned GPU-seconds; idle
jobs score +inf), sorted descending as the artifact does. GPU counts are the table's powers of two
up to ElasticFlow's per-model cap; placement is buddy placement; the overhead model is the
artifact's (:class:`ElasticFlowOverhead`). Ties are broken exactly like the artifact's stable sorts.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from qosflow.sim.policies.ef_overhead import ElasticFlowOverhead as ElasticFlowOverhead
from qosflow.sim.policies.ef_plan import (
    JobCurve,
    Plan,
    Profile,
    align,
    gpu_seconds,
    plan,
)
from qosflow.sim.policy import Completion, JobView, SlotDecision, SlotSnapshot
from qosflow.sim.trace import ThroughputTable

BIG = sys.maxsize


@dataclass(slots=True)
class _Job:
    curve: JobCurve
    ddl: int
    best_effort: bool
    started: bool = False
    units: int = 0
    plan: Plan | None = None
    real_end: int = 0
    nxt: int = 0
    score: float = 0.0
    trial: Plan | None = None
    gs_of: Plan | None = None
    gs: float = 0.0

    def plan_gpu_seconds(self) -> float:
        """GPU-seconds of the current plan (cached while the plan object is unchanged)."""
        assert self.plan is not None
        if self.gs_of is not self.plan:
            self.gs_of, self.gs = self.plan, gpu_seconds(self.plan.allocations, self.plan.end)
        return self.gs


def _first_alloc(p: Plan, now: int) -> tuple[int, int]:
    """(units at now, time of the first non-zero allocation)."""
    at_now = 0
    for t, k in p.allocations:
        if t <= now:
            at_now = k
    first = next((t for t, k in p.allocations if k > 0), now)
    return at_now, first


@dataclass
class ElasticFlow:
    """The ElasticFlow policy with the artifact's timekeeping (see the module docstring).

    Args:
        table: Throughput table of the trace's GPU type (for ElasticFlow's per-model caps).
        slot: Scheduling slot (the overhead model's restart period).
    """

    table: ThroughputTable
    slot: int = 60
    name: str = "elasticflow"
    completion: Completion = "artifact"
    overhead: ElasticFlowOverhead = field(init=False)
    _jobs: dict[str, _Job] = field(default_factory=dict, init=False)
    _runnable: list[str] = field(default_factory=list, init=False)
    _profile: Profile = field(default_factory=lambda: ([], []), init=False)
    _memo: dict[str, tuple[int, bool, list[int], list[int], float]] = field(
        default_factory=dict, init=False
    )
    _infeasible: list[str] = field(default_factory=list, init=False)
    refusals: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("failed_events", "refused", "collateral_events", "collateral_refused"), 0
        ),
        init=False,
    )

    def __post_init__(self) -> None:
        """Build the overhead model."""
        self.overhead = ElasticFlowOverhead(self.slot)

    def _job(self, v: JobView) -> _Job:
        job = self._jobs.get(v.job_id)
        if job is None:
            # the planner reads the speed at the cap itself: never above the largest size the
            # job's speeds know (an A100 curve may stop at 8, a fit may lack a size)
            cap = self.table.elasticflow_cap(v.model, v.batch_size)
            cap = min(cap, max(v.speeds, default=cap))
            levels = tuple(k for k in sorted(v.speeds) if k <= cap)
            ddl = BIG if v.best_effort or not math.isfinite(v.deadline) else int(v.deadline)
            job = _Job(JobCurve(levels, v.speeds, cap), ddl, v.best_effort)
            self._jobs[v.job_id] = job
        return job

    def _estimate(self, ids: list[str], left: dict[str, float], snap: SlotSnapshot) -> bool:
        """Re-plan ``ids`` from scratch in deadline order (stable); True if all are feasible."""
        profile: Profile = ([snap.now], [snap.capacity])
        ok = True
        for job_id in sorted(ids, key=lambda j: self._jobs[j].ddl):
            job = self._jobs[job_id]
            p = plan(
                job.curve,
                ddl=job.ddl,
                left=left[job_id],
                profile=profile,
                now=snap.now,
                slot=snap.slot,
                capacity=snap.capacity,
            )
            job.plan, job.real_end, profile = p, p.real_end, p.profile
            ok = ok and p.ok
            if not p.ok:
                self._infeasible.append(job_id)
        self._profile = profile
        return ok

    def _count_refusal(self, arrivals: list[str]) -> None:
        """Count a failed admission event; collateral when no newcomer itself was infeasible.

        These are the figures of ``ALGORITHM.md`` §4.2 (refusals at admission, failed events,
        and refusals caused only by already-admitted jobs that fell behind).
        """
        refused = sum(not self._jobs[j].best_effort for j in arrivals)
        self.refusals["failed_events"] += 1
        self.refusals["refused"] += refused
        if not set(arrivals) & set(self._infeasible):
            self.refusals["collateral_events"] += 1
            self.refusals["collateral_refused"] += refused

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """One ElasticFlow decision."""
        views = {v.job_id: v for v in snap.jobs}
        self.overhead.node_size, self.overhead.switches = snap.node_size, snap.switches
        # the artifact releases every placed job before it re-places: those that ended, then the
        # others in deadline order (its estimate_all_jobs); the overhead model replays the nodes
        ended = set(snap.completed)
        self.overhead.release_order = tuple(
            [j for j in self._runnable if j in ended]
            + sorted(
                (j for j in self._runnable if j not in ended and j in self._jobs),
                key=lambda j: self._jobs[j].ddl,
            )
        )
        for v in snap.jobs:
            self._job(v)
        left = {j: views[j].remaining for j in views}
        runnable = [j for j in self._runnable if j in views]
        arrivals = [j for j in snap.arrivals if j in views]
        rejected: list[str] = []
        admitted: list[str] = []
        self._infeasible = []
        if arrivals and self._estimate(runnable + arrivals, left, snap):
            runnable += arrivals
            admitted = [j for j in arrivals if not self._jobs[j].best_effort]
        else:
            if arrivals:
                self._count_refusal(arrivals)
            for j in arrivals:
                (runnable if self._jobs[j].best_effort else rejected).append(j)
            self._estimate(runnable, left, snap)
        runnable.sort(key=lambda j: self._jobs[j].ddl)
        for j in runnable:
            job = self._jobs[j]
            assert job.plan is not None
            units, first = _first_alloc(job.plan, snap.now)
            if job.started or first <= snap.now:
                job.units, job.started = units, True
            else:
                job.units = 0
        self._leftover(runnable, left, snap)
        runnable.sort(key=lambda j: -self._jobs[j].units)
        self._runnable = runnable
        wake = min((self._next_change(j, snap.now) for j in runnable), default=BIG)
        for j in rejected + [j for j in self._jobs if j not in views]:
            self._jobs.pop(j, None)
        return SlotDecision(
            allocation={j: self._jobs[j].units for j in runnable if self._jobs[j].units > 0},
            rejected=tuple(rejected),
            admitted=tuple(admitted),
            wake_at=wake if wake < BIG else None,
            planned_finish={j: float(self._jobs[j].real_end) for j in runnable},
        )

    def _next_change(self, job_id: str, now: int) -> int:
        """First change point of a job's plan after ``now`` (the artifact's scale event)."""
        p = self._jobs[job_id].plan
        return next((t for t, _ in p.allocations if t > now), BIG) if p else BIG

    def _unreserved(self, job: _Job) -> Profile:
        """The current profile with ``job``'s own reservation given back (merged).

        The profile is kept merged, so only the span of the reservation is rebuilt; the prefix
        and the tail are sliced (the artifact rebuilds it all; the result is the same).
        """
        assert job.plan is not None
        keys, vals = self._profile
        allocs, end = job.plan.allocations, job.plan.end
        if not allocs or allocs[0][0] >= end:
            return list(keys), list(vals)
        lo = bisect_left(keys, allocs[0][0])
        hi = bisect_right(keys, end)
        own_t = [a for a, _ in allocs if a < end]
        own_v = [k for a, k in allocs if a < end]
        own_t.append(end)
        own_v.append(0)
        out_k, out_v = keys[:lo], vals[:lo]
        last = out_v[-1] if out_v else -1
        i, j, n_own, free, own = lo, 0, len(own_t), (vals[lo - 1] if lo else 0), 0
        while i < hi or j < n_own:  # two sorted change-point lists, merged
            if j == n_own or (i < hi and keys[i] < own_t[j]):
                t, free = keys[i], vals[i]
                i += 1
            else:
                t, own = own_t[j], own_v[j]
                if i < hi and keys[i] == t:
                    free = vals[i]
                    i += 1
                j += 1
            if free + own != last:
                last = free + own
                out_k.append(t)
                out_v.append(last)
        skip = 1 if hi < len(keys) and vals[hi] == last else 0
        return out_k + keys[hi + skip :], out_v + vals[hi + skip :]

    def _first_change(self, job: _Job, now: int) -> int | None:
        """First change point after ``now`` of the profile with ``job``'s reservation given back.

        Equal to the first key after ``now`` of :meth:`_unreserved` (which merges equal values),
        without building it: one walk over the profile's change points and the reservation's
        (its allocations, then zero from its end on), both sorted, from ``now`` on.
        """
        assert job.plan is not None
        keys, vals = self._profile
        allocs, end = job.plan.allocations, job.plan.end
        n_keys, n_allocs = len(keys), len(allocs)
        ki = bisect_right(keys, now)
        free = vals[ki - 1] if ki else 0
        ai, own = 0, 0
        while ai < n_allocs and allocs[ai][0] <= now:
            own = allocs[ai][1]
            ai += 1
        ended = now >= end
        prev = free + (0 if ended else own)
        while True:
            t = keys[ki] if ki < n_keys else BIG
            if ai < n_allocs and allocs[ai][0] < t:
                t = allocs[ai][0]
            if not ended and end < t:
                t = end
            if t >= BIG:
                return None
            if ki < n_keys and keys[ki] == t:  # keys are distinct
                free = vals[ki]
                ki += 1
            while ai < n_allocs and allocs[ai][0] == t:
                own = allocs[ai][1]
                ai += 1
            if t == end:
                ended = True
            if free + (0 if ended else own) != prev:
                return t

    def _trial(
        self, j: str, left: dict[str, float], snap: SlotSnapshot, *, want_profile: bool = True
    ) -> Plan:
        job = self._jobs[j]
        return plan(
            job.curve,
            ddl=job.ddl,
            left=left[j],
            profile=self._unreserved(job),
            now=snap.now,
            slot=snap.slot,
            capacity=snap.capacity,
            assign=job.nxt,
            want_profile=want_profile,
        )

    def _score(self, j: str, free: int, left: dict[str, float], snap: SlotSnapshot) -> None:
        """The artifact's marginal score; the trial plan itself is built lazily when picked."""
        job = self._jobs[j]
        job.trial = None
        if job.nxt - job.units > free or job.nxt == job.units:
            job.score = -BIG
            return
        if job.units == 0:
            job.score = BIG
            return
        assert job.plan is not None
        now, q = snap.now, job.nxt
        real_end = math.ceil(now + left[j] / job.curve.speed[q])
        end = align(now, real_end, snap.slot)
        fut = self._first_change(job, now)
        if fut is None:
            fut = align(now, job.ddl, snap.slot)
        if fut >= end and job.ddl >= real_end:  # the trial runs q GPUs from now until done
            trial_gs = float(q * (end - now))
        else:
            trial_gs = self._trial_gs(j, fut, left, snap)
        gain = trial_gs - job.plan_gpu_seconds()
        job.score = gain / (q - job.units)

    def _trial_gs(self, j: str, fut: int, left: dict[str, float], snap: SlotSnapshot) -> float:
        """GPU-seconds of ``j``'s trial plan when it crosses a change point (memoised).

        Past ``fut`` (the first change point of the profile without ``j``'s reservation) the
        trial is an MSS plan that reads the free profile only on ``[fut, aligned deadline]`` when
        it meets the deadline (``ok``), and on ``[fut, inf)`` otherwise; ``j``'s own reservation
        is unchanged until ``j`` is picked (which drops its memo). So within one leftover round
        the last result is reused while ``fut`` and the profile on that window are unchanged:
        same inputs, same plan, and the scores are those of a full recomputation.
        """
        keys, vals = self._profile
        lo = bisect_right(keys, fut) - 1
        by_deadline = bisect_right(keys, align(snap.now, self._jobs[j].ddl, snap.slot))
        memo = self._memo.get(j)
        if memo is not None and memo[0] == fut:
            hi = by_deadline if memo[1] else len(keys)
            if memo[2] == keys[lo + 1 : hi] and memo[3] == vals[lo:hi]:
                return memo[4]
        scored = self._trial(j, left, snap, want_profile=False)
        gs = gpu_seconds(scored.allocations, scored.end)
        hi = by_deadline if scored.ok else len(keys)
        self._memo[j] = (fut, scored.ok, keys[lo + 1 : hi], vals[lo:hi], gs)
        return gs

    def _leftover(self, runnable: list[str], left: dict[str, float], snap: SlotSnapshot) -> None:
        """Give idle GPUs away one level at a time (the artifact's ``allocate_free_gpus``)."""
        free = snap.capacity - sum(self._jobs[j].units for j in runnable)
        if free <= 0:
            return
        self._memo = {}
        for j in runnable:
            self._jobs[j].nxt = self._jobs[j].curve.above(self._jobs[j].units)
        for j in runnable:
            self._score(j, free, left, snap)
        runnable.sort(key=lambda j: self._jobs[j].score, reverse=True)
        moved = True
        while free > 0 and moved:
            moved = False
            for j in runnable:
                job = self._jobs[j]
                if job.nxt - job.units > free or job.nxt == job.units:
                    continue
                if job.trial is None:
                    job.trial = self._trial(j, left, snap)
                self._profile = job.trial.profile
                job.plan = Plan(
                    job.plan.ok if job.plan else True,
                    job.trial.profile,
                    job.trial.allocations,
                    job.trial.end,
                    job.trial.real_end,
                )
                job.real_end = (
                    job.trial.real_end
                )  # the scaled-up plan's finish (the artifact's too)
                free -= job.nxt - job.units
                self._memo.pop(j, None)
                job.units, job.started, job.trial = job.nxt, True, None
                job.nxt = job.curve.above(job.units)
                moved = True
                break
            for j in runnable:
                if self._jobs[j].nxt - self._jobs[j].units > 0:
                    self._score(j, free, left, snap)
            runnable.sort(key=lambda j: self._jobs[j].score, reverse=True)


@dataclass
class ElasticFlowExact(ElasticFlow):
    """ElasticFlow's decisions on the exact engine: its artifact's timekeeping quirks left out.

    A job completes when its iterations are done and meets its deadline when that is by the
    deadline; it is never ended short. Decisions are those of :class:`ElasticFlow`, made on the
    progress the exact engine reports.
    """

    name: str = "elasticflow-exact"
    completion: Completion = "exact"
