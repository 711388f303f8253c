"""``elasticflow`` — ElasticFlow (ASPLOS'23) as its artifact simulates it (``ALGORITHM.md`` §5).

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
from dataclasses import dataclass, field

from qosflow.sim.policies.ef_plan import (
    JobCurve,
    Plan,
    Profile,
    gpu_seconds,
    merge,
    plan,
    set_point,
)
from qosflow.sim.policy import JobView, Placed, SlotDecision, SlotSnapshot
from qosflow.trace import ThroughputTable

BIG = sys.maxsize


class ElasticFlowOverhead:
    """The artifact's per-decision overhead (``ALGORITHM.md`` §5.6).

    Every running job loses 2 s (7 s on >= 256 GPUs) when its GPU rank set was seen before, else
    ``2 + 2 (log2 k + 1)`` s, plus 27 s (+20 s on >= 256 GPUs) on a restart decision (every
    ``slot``-th decision, when the rank-set cache is also cleared).
    """

    def __init__(self, slot: int) -> None:
        """Overhead for a run with this slot (the artifact reuses the slot as restart period)."""
        self.slot = slot
        self._seen: set[tuple[int, int]] = set()

    def reset(self) -> None:
        """Forget the rank sets seen (start of a run)."""
        self._seen = set()

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """Overhead in seconds per running job."""
        big = capacity >= 256
        base = 7 if big else 2
        restart = decision > 0 and decision % self.slot == 0
        out: dict[str, int] = {}
        for p in sorted(placed, key=lambda q: q.first_rank):
            key = (p.first_rank, p.units)
            if key in self._seen:
                out[p.job_id] = base
                continue
            self._seen.add(key)
            extra = (27 + (20 if big else 0)) if restart else 0
            out[p.job_id] = math.ceil(base + extra + 2 * (math.log2(p.units) + 1))
        if restart:
            self._seen = set()
        return out


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
    """The ElasticFlow policy (see the module docstring).

    Args:
        table: Throughput table of the trace's GPU type (for ElasticFlow's per-model caps).
        slot: Scheduling slot (the overhead model's restart period).
    """

    table: ThroughputTable
    slot: int = 60
    name: str = "elasticflow"
    overhead: ElasticFlowOverhead = field(init=False)
    _jobs: dict[str, _Job] = field(default_factory=dict, init=False)
    _runnable: list[str] = field(default_factory=list, init=False)
    _profile: Profile = field(default_factory=lambda: ([], []), init=False)

    def __post_init__(self) -> None:
        """Build the overhead model."""
        self.overhead = ElasticFlowOverhead(self.slot)

    def _job(self, v: JobView) -> _Job:
        job = self._jobs.get(v.job_id)
        if job is None:
            cap = self.table.elasticflow_cap(v.model, v.batch_size)
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
        self._profile = profile
        return ok

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """One ElasticFlow decision."""
        views = {v.job_id: v for v in snap.jobs}
        for v in snap.jobs:
            self._job(v)
        left = {j: views[j].remaining for j in views}
        runnable = [j for j in self._runnable if j in views]
        arrivals = [j for j in snap.arrivals if j in views]
        rejected: list[str] = []
        admitted: list[str] = []
        if arrivals and self._estimate(runnable + arrivals, left, snap):
            runnable += arrivals
            admitted = [j for j in arrivals if not self._jobs[j].best_effort]
        else:
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
        """The current profile with ``job``'s own reservation given back."""
        assert job.plan is not None
        keys, vals = list(self._profile[0]), list(self._profile[1])
        end = job.plan.end
        if end not in keys:
            prev = [v for k, v in zip(keys, vals, strict=True) if k < end]
            set_point(keys, vals, end, prev[-1] if prev else 0)
        last = 0
        for a, k in job.plan.allocations:
            if a not in keys:
                prev = [v for t, v in zip(keys, vals, strict=True) if t <= a]
                set_point(keys, vals, a, prev[-1] if prev else 0)
            for i, t in enumerate(keys):
                if a <= t < end:
                    vals[i] += k - last
            last = k
        return merge(keys, vals)

    def _score(self, j: str, free: int, left: dict[str, float], snap: SlotSnapshot) -> None:
        job = self._jobs[j]
        if job.nxt - job.units > free or job.nxt == job.units:
            job.score = -BIG
            return
        assert job.plan is not None
        trial = plan(
            job.curve,
            ddl=job.ddl,
            left=left[j],
            profile=self._unreserved(job),
            now=snap.now,
            slot=snap.slot,
            capacity=snap.capacity,
            assign=job.nxt,
        )
        job.trial = trial
        gain = gpu_seconds(trial.allocations, trial.end) - gpu_seconds(
            job.plan.allocations, job.plan.end
        )
        job.score = BIG if job.units == 0 else gain / (job.nxt - job.units)

    def _leftover(self, runnable: list[str], left: dict[str, float], snap: SlotSnapshot) -> None:
        """Give idle GPUs away one level at a time (the artifact's ``allocate_free_gpus``)."""
        free = snap.capacity - sum(self._jobs[j].units for j in runnable)
        if free <= 0:
            return
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
                if job.nxt - job.units > free or job.nxt == job.units or job.trial is None:
                    continue
                self._profile = job.trial.profile
                job.plan = Plan(
                    job.plan.ok if job.plan else True,
                    job.trial.profile,
                    job.trial.allocations,
                    job.trial.end,
                    job.real_end,
                )
                free -= job.nxt - job.units
                job.units, job.started, job.trial = job.nxt, True, None
                job.nxt = job.curve.above(job.units)
                moved = True
                break
            for j in runnable:
                if self._jobs[j].nxt - self._jobs[j].units > 0:
                    self._score(j, free, left, snap)
            runnable.sort(key=lambda j: self._jobs[j].score, reverse=True)
