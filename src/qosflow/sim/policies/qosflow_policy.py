"""The ``qosflow`` policy: the core's admission, minimal share, laxity priority and rescale rules.

Every rule comes from the core; this module only turns a :class:`~qosflow.sim.policy.SlotSnapshot`
into the core's inputs and the core's answers into a :class:`~qosflow.sim.policy.SlotDecision`:

1. **Admission** (:func:`qosflow.core.admission.admit`): each arriving deadline job, earliest deadline
   first, is tested against the jobs already guaranteed (conservative speeds, margins, energy test,
   backward filling on the slotted capacity timeline). It is guaranteed, or told at once that it is
   not (the counter-offer is in its reason) and then still runs *best-effort* on capacity the
   guarantees do not need, unless its spec asks for a hard rejection. Loose deadlines are therefore
   never refused.
2. **Guarantees first**: every decision re-plans the guaranteed jobs with
   :func:`qosflow.core.admission.backward_fill` (the proof behind the guarantees) and gives each the
   units the plan needs *now*; the policy asks to be woken when a planned block starts.
3. **Minimal shares** (:func:`qosflow.core.decide.minimal_share`, with the core's margin): guaranteed
   jobs, then every other deadline job that can still make it, earliest deadline first. A job past
   its margin but not hopeless, and a guaranteed job even the fastest size it may be planned at no
   longer saves (a promise at risk: it runs as fast as it may rather than starve), get that size:
   the knee, unless the probe rule stops short of it. A promise at risk that does not fit whole
   takes the largest level the other guarantees leave, ahead of every unguaranteed job (its
   conservative finish is late, but its real speed may still make it).
4. **Rescale rules** (:func:`qosflow.core.decide.decide`): a running job keeps the size the core's rules
   choose (scale down only with hysteresis, dwell and a real benefit).
5. **Leftover**: waiting jobs start, then spare units go one level at a time to the job saving the
   most seconds per unit, only when the saving beats the core's benefit factor times the rescale
   overhead and the job is not inside its dwell time.

Priority classes (:func:`qosflow.core.priority.laxity`, :func:`qosflow.core.priority.classify`) order jobs of
equal deadline and are kept per job with the ladder's hysteresis. Oracle speeds plan on the true
tables, inflated by a conformal factor learnt online from realised progress once enough intervals
are logged (it covers restart overheads the tables leave out); learned speeds plan on the core's
:func:`qosflow.core.predict.belief_from_fit` of the job's progress (bootstrap quantile times the same
learnt factor, the probe and slow-down rules), exactly as the Airflow watch does
(:mod:`qosflow.sim.adapter`; ``tests/sim/test_parity.py``).

Keeping promises: a guarantee is planned with at least the factor it was admitted under
(``_promise``), and the learnt factor only grows once learnt (``ratchet``); a guarantee that
slips is repaired by running it now, ahead of the others (``repair``); an unguaranteed job that
can make it only at its knee gets it when every guarantee still fits around it
(``_last_chances``); a job not guaranteed on arrival is asked again when a job finished or once
per dwell period.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from qosflow.core import admission, priority
from qosflow.core.decide import decide, minimal_share
from qosflow.core.predict import Belief, Calibration, calibrate, predict
from qosflow.core.spec import JobSpec
from qosflow.sim.adapter import belief_of, job_snapshot, job_spec
from qosflow.sim.policies.qosflow_rules import (
    Alloc,
    PolicyJob,
    forward,
    ratchet,
    repair,
    spread,
)
from qosflow.sim.policy import (
    JobView,
    NoOverhead,
    OverheadModel,
    SlotDecision,
    SlotSnapshot,
)

CALIBRATION_WINDOW = 2000
"""Most recent (predicted, realised) interval pairs the conformal factor is learnt from."""
CALIBRATION_MIN_PAIRS = 50
"""Pairs needed before the learnt factor replaces the core's default (1.15)."""
_RANK = {klass.name: i for i, klass in enumerate(priority.LADDER)}


@dataclass
class QosflowPolicy:
    """The qosflow policy (see the module docstring).

    Attributes:
        name: Policy name in results.
        overhead: The engine's overhead model for this policy.
        margin_s: Absolute safety margin (the core adds 5 % of the time left).
        dwell_s: Minimum time between two rescales of a job.
        rescale_overhead_s: Rescale cost the core's predictions assume.
        calibration: ``None`` for oracle speeds; else the conformal inflation of learned speeds
            (re-learnt online from realised progress).
        max_utilisation: Share of the capacity admission's energy test may count on.
        recalibrate: Also learn the conformal factor online with oracle speeds (it then covers
            what the tables leave out: restart overheads and the decision cadence).
    """

    name: str = "qosflow"
    overhead: OverheadModel = field(default_factory=NoOverhead)
    margin_s: float = 60.0
    dwell_s: float = 600.0
    rescale_overhead_s: float = 30.0
    calibration: Calibration | None = None
    max_utilisation: float = 1.0
    recalibrate: bool = True
    _guaranteed: set[str] = field(default_factory=set)
    _classes: dict[str, str] = field(default_factory=dict)
    _rescaled_at: dict[str, float] = field(default_factory=dict)
    _wake: int | None = None
    _ran: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    _pairs: list[tuple[float, float]] = field(default_factory=list)
    _oracle_factor: Calibration | None = None
    _floor: dict[str, float] = field(default_factory=dict)
    _asked: dict[str, int] = field(default_factory=dict)

    def _prepare(self, view: JobView, snap: SlotSnapshot) -> PolicyJob:
        spec = job_spec(
            view,
            node_size=snap.node_size,
            margin_s=max(self.margin_s, snap.slot + self.rescale_overhead_s),
            dwell_s=self.dwell_s,
        )
        belief = belief_of(view, spec.resources.levels, self.calibration)
        js = job_snapshot(
            view,
            spec,
            now=snap.now,
            last_rescale_at=self._rescaled_at.get(view.job_id),
            rescale_overhead_s=self.rescale_overhead_s,
        )
        queued = js.queued
        need = minimal_share(belief, js) if not view.best_effort else None
        cap = belief.best_plannable(js.units)
        fastest = predict(
            belief,
            now=js.now,
            steps_done=js.steps_done,
            total_steps=spec.total_steps,
            units=cap,
            current_units=js.units,
        )
        hopeless = not view.best_effort and fastest.conservative_finish > view.deadline
        tight = not hopeless and not view.best_effort and (need is None or need >= cap)
        at_risk = hopeless and view.job_id in self._guaranteed  # never starve a broken promise
        if need is None and (tight or at_risk):
            need = cap  # inside the margin but still possible, or a promise at risk: all it may use
        finish = (
            fastest.conservative_finish
            if need is None
            else js.now + max(view.remaining, 0.0) * belief.conservative.step_time(need)
        )
        lax = priority.laxity(
            now=js.now, deadline=view.deadline, submitted_at=view.submit, conservative_finish=finish
        )
        klass = priority.classify(
            lax,
            guaranteed=view.job_id in self._guaranteed,
            hopeless=hopeless,
            previous=self._classes.get(view.job_id),
        ).name
        self._classes[view.job_id] = klass
        keep = 0
        if not queued:
            keep = decide(js, belief, free_units=0).units
        promise = self._promise(view, spec, belief)
        return PolicyJob(view, spec, belief, js, need, klass, keep, promise, tight, at_risk)

    def _promise(self, view: JobView, spec: JobSpec, belief: Belief) -> Belief:
        """The belief guarantees are planned on: never less conservative than at admission.

        A guarantee was proved under the factor of its admission; re-planning it under a smaller
        one (the first learnt factor may be below the core's default 1.15) would hand its slack
        to newcomers, and the plan would no longer fit when the factor rises again. So a
        guaranteed job is planned with the larger of today's factor and its admission factor.
        """
        current = self._oracle_factor or self.calibration
        floor = self._floor.get(view.job_id, 0.0)
        if current is None and floor <= 0.0:
            return belief
        factor = max(floor, current.factor if current is not None else 1.0)
        if self.calibration is not None and factor == self.calibration.factor:
            return belief  # learned speeds: ``belief`` was built with this very factor
        return belief_of(view, spec.resources.levels, Calibration(factor, 0))

    def _admit(
        self, jobs: Mapping[str, PolicyJob], snap: SlotSnapshot
    ) -> tuple[list[str], list[str], dict[str, str]]:
        admitted: list[str] = []
        rejected: list[str] = []
        reasons: dict[str, str] = {}
        new = set(snap.arrivals)
        freed = bool(snap.completed)
        waiting = [  # told "not guaranteed" earlier but still able to make it: ask again when
            j  # a job finished (capacity freed), else once per dwell period (its margin shrinks)
            for j in jobs.values()
            if j.view.job_id not in new
            and j.view.job_id not in self._guaranteed
            and j.klass != "qosflow-late"
            and (freed or snap.now - self._asked.get(j.view.job_id, -math.inf) >= self.dwell_s)
        ]
        for job in waiting:
            self._asked[job.view.job_id] = snap.now
        arrivals = sorted(
            [*(jobs[a] for a in snap.arrivals if a in jobs), *waiting],
            key=lambda j: (j.view.deadline, j.view.submit, j.view.job_id),
        )
        promised = [(g, self._candidate(jobs[g])) for g in sorted(self._guaranteed) if g in jobs]
        for job in arrivals:
            if job.view.best_effort:
                continue
            verdict = admission.admit(
                self._candidate(job),
                [c for _, c in promised],
                capacity=snap.capacity,
                now=float(snap.now),
                if_not_guaranteed=job.spec.if_not_guaranteed,
                slot_s=float(snap.slot),
                max_utilisation=self.max_utilisation,
                counter_offer=job.view.job_id in new,  # a job asked again was told already
            )
            if job.view.job_id in new or verdict.kind == "guaranteed":
                reasons[job.view.job_id] = verdict.reason
            if verdict.kind == "guaranteed":
                self._guaranteed.add(job.view.job_id)
                current = self._oracle_factor or self.calibration
                self._floor[job.view.job_id] = current.factor if current is not None else 1.0
                admitted.append(job.view.job_id)
                bisect.insort(promised, (job.view.job_id, self._candidate(job)))
            elif job.spec.if_not_guaranteed == "reject":
                rejected.append(job.view.job_id)  # only on request: otherwise it runs best-effort
        return admitted, rejected, reasons

    def _candidate(self, job: PolicyJob) -> admission.Candidate:
        return admission.candidate(
            job.spec,
            job.promise,
            steps_done=job.snap.steps_done,
            now=job.snap.now,
            guaranteed=job.view.job_id in self._guaranteed,
            running_units=0,
        )

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Admit arrivals, then size and order every active job (see the module docstring)."""
        live = {v.job_id for v in snap.jobs}
        self._guaranteed &= live
        self._recalibrate(snap)
        jobs = {v.job_id: self._prepare(v, snap) for v in snap.jobs}
        admitted, rejected, reasons = self._admit(jobs, snap)
        for job_id in admitted:
            jobs[job_id] = self._prepare(jobs[job_id].view, snap)
        for job_id in rejected:
            jobs.pop(job_id)
        alloc = self._allocate(list(jobs.values()), snap)
        for job_id, units in alloc.items():
            if jobs[job_id].view.units not in (0, units):
                self._rescaled_at[job_id] = float(snap.now)
        inflation = max(self.calibration.factor, 1.0) if self.calibration is not None else 1.0
        self._ran = {
            k: (
                float(snap.now),
                jobs[k].view.done,
                jobs[k].belief.conservative.step_time(u) / inflation,
            )
            for k, u in alloc.items()
            if u > 0
        }
        for gone in set(self._classes) - live:
            self._classes.pop(gone, None)
            self._floor.pop(gone, None)
            self._asked.pop(gone, None)
            self._rescaled_at.pop(gone, None)
        return SlotDecision(
            allocation={k: v for k, v in alloc.items() if v > 0},
            rejected=tuple(rejected),
            wake_at=self._wake if self._wake is not None and self._wake > snap.now else None,
            admitted=tuple(admitted),
            reasons=reasons,
        )

    def _recalibrate(self, snap: SlotSnapshot) -> None:
        """Conformal factor from (predicted, realised) seconds of past intervals.

        Every job that ran a whole interval at one size gives one pair: the seconds the belief's
        conservative step time *before* inflation predicted for the steps it did, and the seconds
        it took (overheads and noise included). The factor inflates that conservative time, so
        it is calibrated on it (split conformal on the quantity it scales; with oracle speeds the
        conservative time is the table's). :func:`qosflow.core.predict.calibrate` turns the recent
        pairs into the inflation factor, which then only grows (:func:`ratchet`). With oracle
        speeds this learns only what the tables leave out (restart overheads, decision cadence);
        until enough pairs exist the oracle is trusted as it is.
        """
        if self.calibration is None and not self.recalibrate:
            return
        for view in snap.jobs:
            last = self._ran.get(view.job_id)
            if last is None or view.done <= last[1] or not 0.0 < last[2] < math.inf:
                continue
            self._pairs.append(((view.done - last[1]) * last[2], float(snap.now) - last[0]))
        del self._pairs[: max(len(self._pairs) - CALIBRATION_WINDOW, 0)]
        if len(self._pairs) < CALIBRATION_MIN_PAIRS:
            return
        learnt = calibrate(self._pairs)
        if self.calibration is None:  # oracle speeds: inflate only what is promised
            self._oracle_factor = ratchet(self._oracle_factor, learnt)
        else:
            self.calibration = ratchet(self.calibration, learnt)

    def _reserved(
        self, jobs: list[PolicyJob], snap: SlotSnapshot
    ) -> tuple[dict[str, int], int | None]:
        """Units the guarantees' backward-fill plan needs now, and when that plan next changes.

        The plan (:func:`qosflow.core.admission.backward_fill`) is the proof behind every guarantee;
        filling late keeps early capacity free for others, so the policy must be woken when a
        planned block starts.
        """
        cands = [self._candidate(j) for j in jobs if j.view.job_id in self._guaranteed]
        if not cands:
            return {}, None
        now, slot = float(snap.now), float(snap.slot)
        plan = admission.backward_fill(cands, capacity=snap.capacity, now=now, slot_s=slot)
        if plan.failed:
            plan = repair(plan, cands, capacity=snap.capacity, now=now, slot_s=slot)
        else:
            plan = self._last_chances(plan, cands, jobs, snap)
        wake: float | None = None
        now_units: dict[str, int] = {}
        for name, row in plan.units.items():
            if not row.size:
                continue
            now_units[name] = int(row[0])
            changes = np.flatnonzero(row != row[0])
            if changes.size:
                t = float(plan.edges[int(changes[0])])
                wake = t if wake is None else min(wake, t)
        return now_units, None if wake is None else math.ceil(wake)

    def _last_chances(
        self,
        plan: admission.FillPlan,
        cands: list[admission.Candidate],
        jobs: list[PolicyJob],
        snap: SlotSnapshot,
    ) -> admission.FillPlan:
        """Reserve the fastest level, from now, for unguaranteed jobs that need it to make it.

        A deadline job told "not guaranteed" (its margin did not fit) may still finish in time
        if it runs at its knee at once. It gets that, earliest deadline first, only when every
        guarantee's plan, margins included, still fits around it: a last chance never costs a
        promise.
        """
        now, slot = float(snap.now), float(snap.slot)
        ahead: list[admission.Candidate] = []
        for job in jobs:  # already in deadline order
            if not job.tight or job.view.job_id in self._guaranteed:
                continue
            c = forward(self._candidate(job), now, slot)
            if c is None or c.deadline > job.view.deadline:
                continue
            trial = admission.backward_fill(
                [*cands, *ahead, c],
                capacity=snap.capacity,
                now=now,
                slot_s=slot,
                first={x.name for x in (*ahead, c)},
            )
            if not trial.failed:
                ahead.append(c)
                plan = trial
        return plan

    def _order(self, job: PolicyJob) -> tuple[int, float, int, float, str]:
        v = job.view
        group = 0
        if v.best_effort:
            group = 1
        elif job.need is None:
            group = 2
        return (group, v.deadline, _RANK.get(job.klass, 99), v.submit, v.job_id)

    def _allocate(self, jobs: list[PolicyJob], snap: SlotSnapshot) -> dict[str, int]:
        jobs.sort(key=self._order)
        a = Alloc({j.view.job_id: 0 for j in jobs}, snap.capacity)
        reserved, self._wake = self._reserved(jobs, snap)
        for job in jobs:  # 1. what the guarantees' plan needs now
            a.raise_to(job, reserved.get(job.view.job_id, 0))
        for first in (True, False):  # 2. minimal shares: guaranteed jobs, then the rest, EDF
            for job in jobs:
                if (job.view.job_id in self._guaranteed) != first:
                    continue
                if job.at_risk:  # a broken promise takes what the other guarantees leave
                    a.raise_to(job, job.need or 0)
                else:
                    a.exactly(job, job.need)
        for job in jobs:  # 3. running jobs keep what the core's rescale rules chose
            a.raise_to(job, job.keep)
        for job in jobs:  # 4. waiting jobs start on what is left
            a.raise_to(job, job.belief.levels[0])
        return spread(jobs, a.units, a.free)  # 5. spare units where they save the most time


__all__ = ["QosflowPolicy", "belief_of", "job_spec"]
