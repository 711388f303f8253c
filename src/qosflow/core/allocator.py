"""The cluster allocator: every active deadline job's size, priority and guarantee, in one call.

One pure function, :func:`allocate`, over a snapshot of the cluster (:class:`ClusterInput`: the
capacity, the time and every active job with its spec, progress, size, belief and the little the
allocator remembers of it, :class:`JobState`). It returns each job's target size, PriorityClass,
guarantee and the reason in words, and the state to remember (:class:`Allocation`). Both shells
call it: the simulator's ``qosflow`` policy, and the Airflow watch of every job (the snapshot
comes from the job board in the shared store; each watch acts on its own job only). No
allocation rule is written anywhere else.

The rules, in order:

1. **Admission** (:func:`qosflow.core.admission.admit`): a job the allocator has not seen yet,
   earliest deadline first, is tested against the guarantees and every deadline job without a
   promise due before it that the guarantees leave room for, as if it held one (it would yield
   to them until pressed, rule 3), with conservative speeds, margins, the energy test and
   backward filling on the slotted capacity timeline, and against the forecast of the deadline
   jobs still to come (:mod:`qosflow.core.forecast`). It is guaranteed, or told at once that it
   is not (the counter-offer is in its reason) and then still runs best effort on what the
   guarantees do not need, unless its spec says ``reject``. A job told "not guaranteed" is
   asked again when a job finished (capacity freed), else once per dwell period.
2. **Guarantees first**: the guarantees are re-planned with backward filling every time and get
   the units the plan needs *now*; a guarantee that slipped is repaired (run first, as fast as it
   can); an unguaranteed job that makes it only at its fastest gets that when every guarantee
   still fits (:mod:`qosflow.core.allocation`).
3. **Minimal shares** (:func:`qosflow.core.decide.minimal_share`): pressed guarantees and
   promises at risk first, then every other deadline job that can still make it, guaranteed or
   not, earliest deadline first. A guarantee is *pressed*
   (:func:`~qosflow.core.allocation.pressed`) once even its fastest plannable size needs half
   of its time left, and stays pressed; until then rule 2's plan protects it. A promise at risk
   (even its fastest plannable size no longer saves it by the conservative bound) is never
   starved (with learned speeds it can fall at risk early). A pressed guarantee that only its
   fastest size can save takes the largest size left when its whole share does not fit, and so
   does a promise at risk, unless even its median speed no longer saves it: that one takes only
   what the other guarantees' minimal shares leave.
4. **Rescale rules** (:func:`qosflow.core.decide.decide`): a running job keeps the size its own
   decision keeps (scale down only with hysteresis, dwell and a real benefit).
5. **Leftover**: waiting jobs start, then spare units go one level at a time to the job saving
   the most seconds per unit, beyond the rescale cost, unless it is inside its dwell time.
6. **Profile ladder** (:mod:`qosflow.core.profile`): a job climbs past one node for its key.

A guarantee is planned with at least the conformal factor it was admitted under
(``JobState.floor``). Priority classes (:func:`~qosflow.core.priority.classify`) break ties.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from qosflow.core import admission, forecast, priority
from qosflow.core.allocation import Prepared, Units, pressed, reason, reserve, spread
from qosflow.core.decide import JobSnapshot, decided_units, margin_for, minimal_share
from qosflow.core.predict import Belief, finish_on
from qosflow.core.profile import profile
from qosflow.core.spec import JobSpec

RANK = {klass.name: i for i, klass in enumerate(priority.LADDER)}
"""PriorityClass name → its place on the ladder (0: the most urgent)."""


@dataclass(frozen=True, slots=True)
class JobState:
    """What the allocator remembers of a job between decisions (the board keeps it).

    Attributes:
        seen: Admission has looked at the job.
        guaranteed: The job holds a guarantee.
        klass: Its PriorityClass rung at the last decision (the ladder's hysteresis).
        floor: The conformal factor its guarantee was admitted under (0: none).
        asked_at: When admission last asked again whether it can be guaranteed.
        rescaled_at: When its size last changed while it ran.
        target: The size the allocator last gave it (``None``: none yet). Between a target and
            the job's own step acting on it, the job still holds its old size: the allocator
            keeps the target then instead of deciding again from the old size.
        pressed: Its guarantee has been pressed (:func:`pressed`): it takes its minimal share
            ahead of the jobs that are not, from then on.
        profiling: It is its key's profiler (:mod:`qosflow.core.profile`).
    """

    seen: bool = False
    guaranteed: bool = False
    klass: str | None = None
    floor: float = 0.0
    asked_at: float | None = None
    rescaled_at: float | None = None
    target: int | None = None
    pressed: bool = False
    profiling: bool = False


@dataclass(frozen=True, slots=True)
class JobInput:
    """One active job in the snapshot.

    Attributes:
        spec: The job (its ``name`` is its id).
        done: Steps done (may be fractional in simulation).
        units: Units it holds now (0: waiting or paused).
        belief: Its speed belief.
        state: What the allocator remembers of it.
        rescale_overhead_s: What a rescale costs it.
        belief_factor: The conformal factor ``belief`` was built with (``None``: not inflated).
        belief_at: The belief with another conformal factor (for the promise); ``None`` when the
            belief cannot be rebuilt (then the promise is the belief itself).
    """

    spec: JobSpec
    done: float
    units: int
    belief: Belief
    state: JobState = field(default_factory=JobState)
    rescale_overhead_s: float = 30.0
    belief_factor: float | None = None
    belief_at: Callable[[float], Belief] | None = None


@dataclass(frozen=True, slots=True)
class ClusterInput:
    """The cluster at one decision.

    Attributes:
        now: Current time.
        capacity: Units of the jobs' kind in the whole cluster.
        slot_s: Length of the capacity timeline's fine slots.
        jobs: Every active job, in arrival order.
        freed: A job ended since the last decision (waiting jobs are asked again).
        plan_factor: The conformal factor guarantees are planned with now, for every job
            (``None``: each job's own ``belief_factor``, else none).
        max_utilisation: Share of the capacity admission's energy test counts on.
        arrivals: The deadline jobs the allocator saw arrive lately, as their first asks saw
            them (:func:`qosflow.core.forecast.remember` of what earlier allocations reported).
    """

    now: float
    capacity: int
    slot_s: float
    jobs: tuple[JobInput, ...]
    freed: bool = False
    plan_factor: float | None = None
    max_utilisation: float = 1.0
    arrivals: tuple[forecast.Arrival, ...] = ()


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """One job's answer.

    Attributes:
        units: Its target size (0: wait, or pause a running job).
        klass: Its PriorityClass.
        guaranteed: Whether it holds a guarantee.
        reason: Why, in words.
        state: What to remember of it.
    """

    units: int
    klass: str
    guaranteed: bool
    reason: str
    state: JobState


@dataclass(frozen=True, slots=True)
class Allocation:
    """The answer for the whole cluster.

    Attributes:
        jobs: Per job id (rejected jobs are absent).
        admitted: Jobs guaranteed at this decision.
        rejected: Jobs refused at this decision (their spec says ``reject``).
        verdicts: Admission's verdict (kind, size, reason, counter-offer), for the jobs admission
            told something now (a job asked again is told only when it is guaranteed).
        wake_at: When the guarantees' plan next changes (decide again then), or ``None``.
        arrived: The deadline jobs first asked now, for the shell to keep for later forecasts.
    """

    jobs: Mapping[str, JobAllocation]
    admitted: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    verdicts: Mapping[str, admission.Verdict] = field(default_factory=dict)
    wake_at: int | None = None
    arrived: tuple[forecast.Arrival, ...] = ()


def promise_of(job: JobInput, plan_factor: float | None, floor: float) -> Belief:
    """The belief a guarantee is planned on: never less conservative than at its admission.

    A guarantee was proved under the factor of its admission; under a smaller one (the first
    learnt factor may be below the default 1.15) its slack would go to newcomers.
    """
    if (plan_factor is None and floor <= 0.0) or job.belief_at is None:
        return job.belief
    current = plan_factor if plan_factor is not None else job.belief_factor
    factor = max(floor, current if current is not None else 1.0)
    if job.belief_factor is not None and factor == job.belief_factor:
        return job.belief
    return job.belief_at(factor)


def prepare(job: JobInput, cluster: ClusterInput, state: JobState) -> Prepared:
    """The job readied for this decision (minimal share, class, the size it keeps)."""
    spec, belief = job.spec, job.belief
    queued = job.units == 0
    snap = JobSnapshot(
        spec=spec,
        now=float(cluster.now),
        steps_done=int(job.done),
        units=spec.resources.levels[0] if queued else job.units,
        queued=queued,
        last_rescale_at=state.rescaled_at,
        rescale_overhead_s=job.rescale_overhead_s,
    )
    remaining = max(spec.total_steps - job.done, 0.0)
    share = minimal_share(belief, snap) if not spec.best_effort else None
    need = share
    cap = belief.fastest_plannable(snap.units)
    fastest = finish_on(  # predict's conservative finish at ``cap`` (no rescale charged)
        belief.conservative, snap.now, max(spec.total_steps - snap.steps_done, 0), cap
    )
    hopeless = not spec.best_effort and fastest > spec.deadline
    tight = not hopeless and not spec.best_effort and (need is None or need >= cap)
    at_risk = hopeless and state.guaranteed  # never starve a broken promise
    if (tight or at_risk) and (need is None or need > cap):
        need = cap  # inside the margin but still possible, or a promise at risk: all it may use
    finish = (
        fastest
        if need is None
        else snap.now + (remaining * belief.conservative.step_time(need) if remaining else 0.0)
    )
    lax = priority.laxity(
        now=snap.now,
        deadline=spec.deadline,
        submitted_at=spec.submitted_at,
        conservative_finish=finish,
    )
    klass = priority.classify(
        lax, guaranteed=state.guaranteed, hopeless=hopeless, previous=state.klass
    ).name
    pending = state.target is not None and state.target > 0 and state.target != job.units
    if queued:
        keep = 0
    elif pending:  # told to resize, not acted on yet: the target stands
        keep = state.target or 0
    else:
        keep = decided_units(snap, belief, free_units=0, share=False if spec.best_effort else share)
    promise = promise_of(job, cluster.plan_factor, state.floor)
    due_in = spec.deadline - margin_for(spec, snap.now) - snap.now
    urgent = (  # a promise at risk is not marked pressed (it may recover); rule 3 serves it first
        state.guaranteed
        and not at_risk
        and (state.pressed or pressed(promise, remaining, cap, due_in))
    )
    return Prepared(
        spec,
        job.done,
        belief,
        snap,
        need,
        klass,
        keep,
        promise,
        state.guaranteed,
        tight,
        at_risk,
        urgent,
    )


@dataclass(slots=True)
class _Decision:
    """The allocation under construction (one call of :func:`allocate`)."""

    cluster: ClusterInput
    inputs: dict[str, JobInput]
    states: dict[str, JobState]
    jobs: dict[str, Prepared]
    admitted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    verdicts: dict[str, admission.Verdict] = field(default_factory=dict)
    arrived: list[forecast.Arrival] = field(default_factory=list)

    def _asking(self) -> list[Prepared]:
        """Jobs not seen yet, and waiting ones due to be asked again, earliest deadline first."""
        now = float(self.cluster.now)
        asking = []
        for name, job in self.jobs.items():
            st = self.states[name]
            if job.spec.best_effort or st.guaranteed:
                continue
            asked = st.asked_at if st.asked_at is not None else -math.inf
            due = self.cluster.freed or now - asked >= job.spec.dwell_seconds
            if not st.seen:
                self.states[name] = replace(st, asked_at=now)  # told now: asked again later
                asking.append(job)
                if math.isfinite(job.spec.deadline):  # kept for the forecast of later asks
                    self.arrived.append(forecast.Arrival(job.spec.submitted_at, job.candidate()))
            elif job.klass != "qosflow-late" and due:
                self.states[name] = replace(st, asked_at=now)
                asking.append(job)
        return sorted(asking, key=lambda j: (j.spec.deadline, j.spec.submitted_at, j.name))

    def admit(self) -> None:
        """Rule 1: jobs not seen yet, and waiting ones due to be asked again, earliest first."""
        asking = self._asking()
        promised = sorted((j.name, j.candidate()) for j in self.jobs.values() if j.guaranteed)
        rivals = None  # built for the first ask that needs them
        for job in asking:
            if self._still_too_slow(job):
                continue
            if rivals is None:
                rivals = self._rivals(promised)
            self._ask(job, promised, self._ahead_of(job, rivals))
        for name, st in self.states.items():
            if not st.seen:
                self.states[name] = replace(st, seen=True)

    def _still_too_slow(self, job: Prepared) -> bool:
        """A job asked again that even alone cannot make it (told already: no plan needed)."""
        c, now = self.cluster, float(self.cluster.now)
        if self.states[job.name].seen and admission.misses_alone(
            job.candidate(), capacity=c.capacity, now=now
        ):
            if job.spec.if_not_guaranteed == "reject":  # as _ask would
                self.rejected.append(job.name)
            return True
        return False

    def _rivals(
        self, promised: list[tuple[str, admission.Candidate]]
    ) -> list[tuple[float, str, admission.Candidate]]:
        """The deadline jobs without a promise that rule 3 may serve ahead of a guarantee.

        Every one that can still make it and that the guarantees' plan leaves room for, filled
        after the guarantees, earliest deadline first (as admission's test sees a guarantee): a
        guarantee yields to earlier deadlines until it is pressed, so a promise must fit next to
        them too, or pressing it later takes their units. One that does not fit next to the
        guarantees is squeezed out by them anyway and is not counted. ``(deadline, name,
        candidate)``, by deadline.
        """
        pool = [
            j
            for j in self.jobs.values()
            if not j.guaranteed and not j.spec.best_effort and j.need is not None
        ]
        if not pool:
            return []
        rivals = [replace(j.candidate(), guaranteed=True) for j in pool]
        plan = admission.backward_fill(
            [c for _, c in promised] + rivals,
            capacity=self.cluster.capacity,
            now=float(self.cluster.now),
            slot_s=float(self.cluster.slot_s),
            first={name for name, _ in promised},
        )
        left_out = set(plan.failed)
        return sorted(
            (j.spec.deadline, j.name, c)
            for j, c in zip(pool, rivals, strict=True)
            if j.name not in left_out
        )

    def _ahead_of(
        self, job: Prepared, rivals: list[tuple[float, str, admission.Candidate]]
    ) -> list[admission.Candidate]:
        """The rivals due before ``job``: not itself, nor one guaranteed or refused since."""
        told = {*self.admitted, *self.rejected}
        return [
            c
            for deadline, name, c in rivals
            if deadline < job.spec.deadline and name != job.name and name not in told
        ]

    def _ask(
        self,
        job: Prepared,
        promised: list[tuple[str, admission.Candidate]],
        ahead: list[admission.Candidate],
    ) -> None:
        first = not self.states[job.name].seen
        cl = self.cluster  # the promises, the deadline jobs due first, the forecast (module doc)
        coming = forecast.rivals(cl.arrivals, deadline=job.spec.deadline, now=float(cl.now))
        verdict = admission.admit(
            job.candidate(),
            [c for _, c in promised] + ahead + coming,
            capacity=self.cluster.capacity,
            now=float(self.cluster.now),
            if_not_guaranteed=job.spec.if_not_guaranteed,
            slot_s=float(self.cluster.slot_s),
            max_utilisation=self.cluster.max_utilisation,
            counter_offer=first,  # a job asked again was told already: only the kind counts
            explain=first,
        )
        if verdict.kind == "rejected" and job.spec.if_not_guaranteed != "reject":
            verdict = replace(verdict, kind="best_effort", units=job.belief.levels[0])  # runs
        if first or verdict.kind == "guaranteed":
            self.verdicts[job.name] = verdict
        if verdict.kind == "guaranteed":
            factor = self.cluster.plan_factor
            if factor is None:  # no cluster-wide factor: the one its own belief was built with
                factor = self.inputs[job.name].belief_factor
            st = replace(  # the class just computed is the hysteresis' previous one
                self.states[job.name],
                guaranteed=True,
                floor=factor if factor is not None else 1.0,
                klass=job.klass,
            )
            self.states[job.name] = st
            self.admitted.append(job.name)
            self.jobs[job.name] = prepare(self.inputs[job.name], self.cluster, st)
            bisect.insort(promised, (job.name, self.jobs[job.name].candidate()))
        elif job.spec.if_not_guaranteed == "reject":
            self.rejected.append(job.name)  # only on request: otherwise it runs best effort


def _order(job: Prepared) -> tuple[int, float, int, float, str]:
    """Guarantees and deadline jobs with a share first, then the rest, then best effort; EDF."""
    group = 1 if job.spec.best_effort else (2 if job.need is None else 0)
    return (group, job.spec.deadline, RANK.get(job.klass, 99), job.spec.submitted_at, job.name)


def _share(jobs: Sequence[Prepared], cluster: ClusterInput) -> tuple[dict[str, int], int | None]:
    """Rules 2-5 on jobs in allocation order: units per job and when to decide again."""
    a = Units({j.name: 0 for j in jobs}, cluster.capacity)
    reserved, wake = reserve(
        jobs, capacity=cluster.capacity, now=float(cluster.now), slot_s=float(cluster.slot_s)
    )
    for job in jobs:  # 2. what the guarantees' plan needs now
        a.raise_to(job, reserved.get(job.name, 0))
    for first in (True, False):  # 3. minimal shares: pressed or at-risk promises, the rest, EDF
        for job in jobs:
            if (job.pressed or (job.guaranteed and job.at_risk)) != first:
                continue
            if first and job.at_risk and job.lost:  # not at the cost of promises on track
                owed = sum(
                    max((g.need or 0) - a.units[g.name], 0)
                    for g in jobs
                    if g.guaranteed and not g.at_risk and g.name != job.name
                )
                a.raise_to(job, min(job.need or 0, a.units[job.name] + a.free - owed))
            elif job.at_risk or (job.guaranteed and job.tight):  # takes what is left
                a.raise_to(job, job.need or 0)
            else:
                a.exactly(job, job.need)
    for job in jobs:  # 4. running jobs keep what the core's rescale rules chose
        a.raise_to(job, job.keep)
    for job in jobs:  # 5a. waiting jobs start on what is left
        a.raise_to(job, job.belief.levels[0])
    return spread(jobs, a.units, a.free), wake  # 5b. spare units where they save the most


def allocate(cluster: ClusterInput) -> Allocation:
    """Admit, order and size every active job (see the module docstring).

    Returns:
        Every job's target size, class, guarantee, reason and state to remember; the jobs
        admitted and rejected now; admission's reasons; when to decide again.
    """
    inputs = {j.spec.name: j for j in cluster.jobs}
    states = {name: j.state for name, j in inputs.items()}
    jobs = {name: prepare(j, cluster, states[name]) for name, j in inputs.items()}
    d = _Decision(cluster, inputs, states, jobs)
    d.admit()
    for name in d.rejected:
        jobs.pop(name)
    ordered = sorted(jobs.values(), key=_order)
    units, wake = _share(ordered, cluster)
    units, profilers, measuring = profile(ordered, units, cluster.capacity, d.states)  # rule 6
    if measuring:  # a rung is measured interval by interval: decide again after the next one
        nxt = math.ceil(cluster.now + cluster.slot_s)
        wake = nxt if wake is None else min(wake, nxt)
    out: dict[str, JobAllocation] = {}
    for job in ordered:
        st = d.states[job.name]
        klass = job.klass
        n = units[job.name]
        held = inputs[job.name].units
        if held not in (0, n) and n != st.target:  # a new rescale of a running job
            st = replace(st, rescaled_at=float(cluster.now))
        climbs = job.name in profilers
        if st.klass != klass or st.target != n or st.profiling != climbs:
            st = replace(st, klass=klass, target=n, profiling=climbs)
        if job.pressed and not st.pressed:  # pressed once, pressed for good
            st = replace(st, pressed=True)
        out[job.name] = JobAllocation(n, klass, st.guaranteed, reason(job, n), st)
    wake_at = wake if wake is not None and wake > cluster.now else None
    arrived = tuple(d.arrived)
    return Allocation(out, tuple(d.admitted), tuple(d.rejected), d.verdicts, wake_at, arrived)
