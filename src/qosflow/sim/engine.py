"""The discrete-event engine: runs one policy over one trace, deterministically.

Time is integer seconds on a virtual clock (never wall time). Pending events sit in a heap keyed
by ``(time, priority, seq)`` — arrivals before completions before policy wake-ups at equal times,
ties broken by insertion order. Decisions follow ElasticFlow's cadence (its ``ALGORITHM.md`` §5.6):
when the next event is within one slot of the last decision and more events are pending, it is
deferred to ``last decision + slot`` and merged with everything due by then, so decisions happen
at most once per slot and arrivals are handled at the slot boundary. Between decisions a job
advances ``speed(units) * noise * (elapsed - overhead)`` iterations; its completion time is exact
(ceil to the second) and its units are released at the next decision. The progress samples a
learned belief fits are dated on the job's own clock, the virtual time less the overhead it has
lost so far: the stall is not read as a slower speed at the job's size (as a watch drops a
restart's stall with the restart), and what it costs shows in the realised finish times the
policy's calibration learns from instead. A decision sees the progress made up to its own time
(as a watch polling then would), and a size change or a pause first closes the interval run at
the old size.

See :mod:`qosflow.sim.policy` for how a policy plugs in.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from qosflow.core.errors import ClusterError
from qosflow.sim.garbage import few_collections
from qosflow.sim.placement import buddy_place
from qosflow.sim.policy import (
    Completion,
    JobView,
    OverheadModel,
    Placed,
    Policy,
    SlotDecision,
    SlotSnapshot,
)
from qosflow.sim.trace import ThroughputTable, TraceJob
from qosflow.sim.truth import Belief, LearnedBelief, Noise, OracleBelief, Truth

ARRIVAL, COMPLETION, WAKE = 0, 1, 2
COMPACT_AT = 4096
"""Stale heap entries tolerated beyond four per live one before the heap is rebuilt."""
SpeedsMode = Literal["oracle", "learned"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Parameters of one run.

    Attributes:
        capacity: Units in the cluster.
        node_size: Units per node (placement and the speed model's node boundary).
        slot: Scheduling slot in seconds (decisions at most once per slot).
        seed: Seed of the run's ``numpy.random.Generator`` (noise).
        speeds: ``oracle`` (policies see the true tables) or ``learned`` (fitted models).
        noise: Noise of the true speeds.
        overhead: Overhead model; ``None`` uses the policy's own.
        switches: Switches the nodes are spread over (ElasticFlow's placement replay reads it).
        completion: ``exact`` — a job completes when its iterations are done (to the second)
            and the next decision releases its units. ``artifact`` — ElasticFlow's simulator:
            the scheduler learns of a completion at the end of the slot it falls in (counted from
            the decision that set the job's size) plus the overhead, credits progress only up to
            the policy's planned finish, ends a job at that notice even if a few iterations
            (lost to overhead) remain, and records as its finish the planned finish of its last
            plan (the artifact's ``real_end_time``, what it counts). ``None`` (the default): the
            policy's own (its ``completion`` attribute; ``exact`` when it has none).
    """

    capacity: int
    node_size: int
    slot: int = 60
    seed: int = 0
    speeds: SpeedsMode = "oracle"
    noise: Noise = field(default_factory=Noise)
    overhead: OverheadModel | None = None
    completion: Completion | None = None
    switches: int = 1


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job.

    Attributes:
        job_id: Trace id.
        deadline: Absolute deadline (``inf`` for best effort).
        best_effort: True when the job has no deadline.
        finish: Completion time (integer seconds), ``None`` if it never finished; with
            ``completion="artifact"`` the artifact's own (its last plan's real end).
        rejected: Refused by the policy.
        admitted: Guaranteed by the policy at some point.
        started: First time it held units, ``None`` if never.
        rescales: Times its size changed while running (starts excluded).
        unit_seconds: Units x seconds it held.
        planned_finish: The policy's last planned finish before completion, if it told one.
    """

    job_id: str
    deadline: float
    best_effort: bool
    finish: int | None
    rejected: bool
    admitted: bool
    started: int | None
    rescales: int
    unit_seconds: float
    planned_finish: float | None

    @property
    def met(self) -> bool:
        """Finished by its deadline (best-effort jobs never count)."""
        return not self.best_effort and self.finish is not None and self.finish <= self.deadline


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one run.

    Attributes:
        policy: Policy name.
        outcomes: One per trace job, in trace order.
        decisions: Number of decisions taken.
        end_time: Time of the last decision.
        usage: ``(time, units in use)`` after every decision.
    """

    policy: str
    outcomes: tuple[JobOutcome, ...]
    decisions: int
    end_time: int
    usage: tuple[tuple[int, int], ...]

    @property
    def deadline_jobs(self) -> int:
        """Jobs with a deadline (the ratio's denominator)."""
        return sum(not o.best_effort for o in self.outcomes)

    @property
    def met(self) -> int:
        """Deadline jobs finished by their deadline."""
        return sum(o.met for o in self.outcomes)

    @property
    def ratio(self) -> float:
        """Deadline satisfaction ratio (a rejected job counts as a miss)."""
        return self.met / self.deadline_jobs if self.deadline_jobs else 1.0

    @property
    def planned_ratio(self) -> float:
        """ElasticFlow's own accounting: admitted jobs whose last plan met the deadline.

        The artifact checks the planned completion of its last re-planning (which omits the
        overhead charged at that decision) instead of the realised one; for policies that tell no
        plan this equals :attr:`ratio`.
        """
        ok = 0
        for o in self.outcomes:
            if o.best_effort or o.rejected or o.finish is None:
                continue
            planned = o.planned_finish if o.planned_finish is not None else o.finish
            ok += planned <= o.deadline
        return ok / self.deadline_jobs if self.deadline_jobs else 1.0


@dataclass(slots=True)
class _Live:
    """Mutable per-job state inside the engine (never shown to policies)."""

    job: TraceJob
    done: float = 0.0
    units: int = 0
    rate: float = 0.0
    overhead: int = 0
    lost: float = 0.0  # overhead seconds lost so far: samples are dated ``now - lost``
    since: int = 0
    version: int = 0
    admitted: bool = False
    started: int | None = None
    rescales: int = 0
    unit_seconds: float = 0.0
    planned: float | None = None
    pending: bool = False
    notice: int = 0
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    max_units: int = -1  # the job's generic cap, looked up on its first view


class _Run:
    """One simulation run (the mutable loop state of :func:`simulate`)."""

    def __init__(
        self, jobs: Sequence[TraceJob], truth: Truth, policy: Policy, cfg: SimConfig
    ) -> None:
        self.jobs, self.truth, self.policy, self.cfg = jobs, truth, policy, cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.belief: Belief = (
            LearnedBelief(truth, node_size=cfg.node_size)
            if cfg.speeds == "learned"
            else OracleBelief(truth)
        )
        self.overhead = cfg.overhead if cfg.overhead is not None else policy.overhead
        completion = cfg.completion or getattr(policy, "completion", "exact")
        if completion not in ("exact", "artifact"):
            raise ClusterError(f"completion must be exact or artifact (got {completion!r})")
        self.artifact = completion == "artifact"
        self.heap: list[tuple[int, int, int, str, int]] = []
        self.seq = 0
        self.live: dict[str, _Live] = {}
        self.outcomes: dict[str, JobOutcome] = {}
        self.arrived: list[str] = []
        self.completed: list[str] = []
        self.usage: list[tuple[int, int]] = []
        self.decisions = 0
        self.valid_count = 0

    def push(self, time: int, priority: int, job_id: str = "", version: int = 0) -> None:
        heapq.heappush(self.heap, (time, priority, self.seq, job_id, version))
        self.seq += 1
        self.valid_count += 1
        if len(self.heap) > 4 * self.valid_count + COMPACT_AT:
            self.compact()

    def compact(self) -> None:
        """Drop the stale completions (every decision re-pushes each running job's end).

        Every entry is unique (its sequence number), so the valid ones pop in the same order.
        """
        self.heap = [item for item in self.heap if self.valid(item)]
        heapq.heapify(self.heap)

    def invalidate(self, lv: _Live) -> None:
        """Forget a job's pending completion event (lazy deletion from the heap)."""
        lv.version += 1
        if lv.pending:
            lv.pending = False
            self.valid_count -= 1

    def pop(self) -> tuple[int, int, int, str, int]:
        item = heapq.heappop(self.heap)
        if self.valid(item):
            self.valid_count -= 1
            if item[1] == COMPLETION:
                self.live[item[3]].pending = False
        return item

    def valid(self, item: tuple[int, int, int, str, int]) -> bool:
        _, priority, _, job_id, version = item
        if priority != COMPLETION:
            return True
        live = self.live.get(job_id)
        return live is not None and live.version == version

    def next_event(self) -> int | None:
        while self.heap and not self.valid(self.heap[0]):
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None

    def next_time(self, now: int) -> int | None:
        first = self.next_event()
        if first is None:
            return None
        if first - now <= self.cfg.slot and self.valid_count > 1:
            return now + self.cfg.slot
        return max(first, now)

    def advance(self, now: int, to: int) -> None:
        """Run every job from ``now`` to ``to``; record completions."""
        artifact = self.artifact
        for job_id, lv in list(self.live.items()):
            if lv.units == 0:
                continue
            run = to - now
            if artifact and lv.planned is not None and to > lv.planned:
                run -= to - math.ceil(lv.planned)
            lv.lost += min(lv.overhead, max(run, 0))
            run = max(0, run - lv.overhead)
            lv.unit_seconds += lv.units * (to - now)
            remaining = lv.job.iterations - lv.done
            if lv.rate * run >= remaining - 1e-9:
                finish = min(to, now + lv.overhead + math.ceil(remaining / lv.rate - 1e-9))
                self.invalidate(lv)
                self.finish(job_id, lv, finish)
            elif artifact and to >= lv.notice:
                lv.done += lv.rate * run
                self.invalidate(lv)
                self.finish(job_id, lv, to)
            else:
                lv.done += lv.rate * run
                lv.overhead = 0

    def finish(self, job_id: str, lv: _Live, at: int | None, rejected: bool = False) -> None:
        recorded = at
        if self.artifact and at is not None and lv.planned is not None:
            recorded = math.ceil(lv.planned)  # the artifact counts its last plan's real end
        self.outcomes[job_id] = JobOutcome(
            job_id=job_id,
            deadline=lv.job.deadline,
            best_effort=lv.job.best_effort,
            finish=recorded,
            rejected=rejected,
            admitted=lv.admitted,
            started=lv.started,
            rescales=lv.rescales,
            unit_seconds=lv.unit_seconds,
            planned_finish=lv.planned,
        )
        del self.live[job_id]
        if at is not None:
            self.completed.append(job_id)
            final = (at - lv.lost, float(lv.job.iterations), lv.units)  # the watch's last poll
            self.belief.finished(lv.job, [*lv.samples, final])  # the finish step records them

    def view(self, lv: _Live) -> JobView:
        j = lv.job
        if lv.max_units < 0:
            lv.max_units = self.truth.max_units(j)
        return JobView(
            job_id=j.job_id,
            submit=j.submit,
            deadline=j.deadline,
            total=j.iterations,
            done=lv.done,
            units=lv.units,
            requested=j.num_gpu,
            speeds=self.belief.speeds(j, lv.samples),
            max_units=lv.max_units,
            model=j.model,
            batch_size=j.batch_size,
            best_effort=j.best_effort,
            admitted=lv.admitted,
            started=lv.started is not None,
        )

    def poll(self, now: int) -> None:
        """As a watch polling now: each running job's progress up to now, at the size it ran."""
        for lv in self.live.values():
            if lv.units:
                lv.samples.append((now - lv.lost, lv.done, lv.units))

    def decide(self, now: int) -> None:
        self.poll(now)  # the decision's beliefs rest on the progress up to now
        snap = SlotSnapshot(
            now=now,
            slot=self.cfg.slot,
            capacity=self.cfg.capacity,
            node_size=self.cfg.node_size,
            decision=self.decisions,
            arrivals=tuple(self.arrived),
            completed=tuple(self.completed),
            jobs=tuple(self.view(lv) for lv in self.live.values()),
            switches=self.cfg.switches,
        )
        self.arrived, self.completed = [], []
        decision = self.policy.decide(snap)
        for job_id in decision.rejected:
            lv = self.live.get(job_id)
            if lv is not None:
                self.invalidate(lv)
                self.finish(job_id, lv, None, rejected=True)
        self.note(decision)
        self.apply(now, decision.allocation)
        if decision.wake_at is not None and decision.wake_at > now:
            first = self.next_event()
            if self.artifact:
                # ElasticFlow compares with end events before it adds this decision's overhead.
                ends = [lv.notice - lv.overhead for lv in self.live.values() if lv.units]
                first = min([*ends, *([first] if first is not None else [])], default=None)
            if first is None or decision.wake_at < first:
                self.push(decision.wake_at, WAKE)
        self.decisions += 1

    def note(self, decision: SlotDecision) -> None:
        """What a decision says of live jobs besides their sizes: promises, plans, profiles."""
        for job_id in decision.admitted:
            if job_id in self.live:
                self.live[job_id].admitted = True
        for job_id, planned in decision.planned_finish.items():
            if job_id in self.live:
                self.live[job_id].planned = planned
        for job_id in decision.profiled:
            if job_id in self.live:
                self.belief.profiled(self.live[job_id].job, self.live[job_id].samples)

    def check(self, allocation: Mapping[str, int]) -> None:
        total = 0
        for job_id, units in allocation.items():
            lv = self.live.get(job_id)
            if lv is None or units < 0 or (units > 0 and self.truth.speed(lv.job, units) <= 0):
                raise ClusterError(f"policy {self.policy.name}: bad allocation {job_id}={units}")
            total += units
        if total > self.cfg.capacity:
            raise ClusterError(f"policy {self.policy.name}: {total} units > capacity")

    def apply(self, now: int, allocation: Mapping[str, int]) -> None:
        self.check(allocation)
        previous = {job_id: lv.units for job_id, lv in self.live.items()}
        sizes = [(job_id, units) for job_id, units in allocation.items() if units > 0]
        spots = buddy_place(sizes, capacity=self.cfg.capacity, node_size=self.cfg.node_size)
        placed = tuple(
            Placed(job_id, units, previous.get(job_id, 0), *spots[job_id])
            for job_id, units in sizes
        )
        charges = self.overhead.charge(placed, decision=self.decisions, capacity=self.cfg.capacity)
        used = 0
        for job_id, lv in self.live.items():
            units = allocation.get(job_id, 0)
            if lv.units and units and units != lv.units:
                lv.rescales += 1
            if units and lv.started is None:
                lv.started = now
            resized = units != lv.units  # the poll closed the old size's interval
            lv.units, lv.overhead, lv.since = units, charges.get(job_id, 0), now
            self.invalidate(lv)
            used += units
            if units == 0:
                if lv.rate > 0.0:  # stopped: close its last interval (a pause is not slow progress)
                    lv.samples.append((now - lv.lost, lv.done, 0))
                lv.rate = 0.0
                continue
            lv.rate = self.truth.speed(lv.job, units) * self.cfg.noise.factor(self.rng)
            if resized:  # a start, resume or resize opens a run at the new size
                lv.samples.append((now - lv.lost, lv.done, units))
            left = lv.job.iterations - lv.done
            run = math.ceil(left / lv.rate - 1e-9)
            if self.artifact:
                run = -(-run // self.cfg.slot) * self.cfg.slot
            due = now + lv.overhead + run
            lv.notice = due
            self.push(due, COMPLETION, job_id, lv.version)
            lv.pending = True
        self.usage.append((now, used))

    def run(self) -> SimResult:
        order = sorted(range(len(self.jobs)), key=lambda i: (self.jobs[i].submit, i))
        for i in order:
            self.push(math.ceil(self.jobs[i].submit), ARRIVAL, self.jobs[i].job_id)
        by_id = {j.job_id: j for j in self.jobs}
        now = math.ceil(self.jobs[order[0]].submit) if order else 0
        idle = 0
        while True:
            while self.heap and self.heap[0][0] <= now:
                _, priority, _, job_id, _ = self.pop()
                if priority == ARRIVAL:
                    self.live[job_id] = _Live(by_id[job_id], since=now)
                    self.arrived.append(job_id)
            if not self.live and not self.heap:
                break
            self.decide(now)
            nxt = self.next_time(now)
            running = any(lv.units for lv in self.live.values())
            if nxt is None:
                if not self.live or (not running and idle > 1):
                    break
                idle = 0 if running else idle + 1
                nxt = now + self.cfg.slot
            self.advance(now, nxt)
            now = nxt
        for job_id, lv in list(self.live.items()):
            self.finish(job_id, lv, None)
        return SimResult(
            policy=self.policy.name,
            outcomes=tuple(self.outcomes[j.job_id] for j in self.jobs),
            decisions=self.decisions,
            end_time=now,
            usage=tuple(self.usage),
        )


def simulate(
    jobs: Sequence[TraceJob], table: ThroughputTable, policy: Policy, config: SimConfig
) -> SimResult:
    """Run ``policy`` over ``jobs`` on a simulated cluster; deterministic for a given config.

    Args:
        jobs: The trace (any order; arrivals are sorted by submit time, then trace order).
        table: True speeds (throughput table of the trace's GPU type).
        policy: The policy (see :mod:`qosflow.sim.policy`).
        config: Cluster size, slot, seed, belief mode, noise and overhead.

    Returns:
        One outcome per job, in trace order, and the usage timeline.
    """
    if config.capacity < 1 or config.node_size < 1 or config.slot < 1:
        raise ClusterError("capacity, node_size and slot must be >= 1")
    reset = getattr(config.overhead or policy.overhead, "reset", None)
    if callable(reset):
        reset()
    with few_collections():  # millions of short-lived objects: see qosflow.sim.garbage
        return _Run(jobs, Truth(table, config.noise), policy, config).run()
