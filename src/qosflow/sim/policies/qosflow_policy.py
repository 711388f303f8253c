"""The ``qosflow`` policy: the core's cluster allocator, fed the simulator's snapshot.

Every rule is :func:`qosflow.core.allocator.allocate`'s (read its docstring for the whole
policy): admission, the guarantees' backward-fill plan and its repair, minimal shares, the
rescale rules, last chances and spreading the leftover. The Airflow watch of every job calls the
same function on the job board's snapshot. This module only turns a
:class:`~qosflow.sim.policy.SlotSnapshot` into a :class:`~qosflow.core.allocator.ClusterInput`
(jobs built with :mod:`qosflow.sim.adapter`, as the watch builds its own), keeps the allocator's
per-job state between decisions, and learns the conformal factor online from realised progress
(the simulator's stand-in for the history store's calibration): oracle speeds plan on the true
tables, inflated for guarantees by that factor once enough intervals are logged (it covers the
restart overheads the tables leave out); learned speeds plan on the core's fit of each job's
progress, with the same factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from qosflow.core.allocation import ratchet
from qosflow.core.allocator import ClusterInput, JobInput, JobState, allocate
from qosflow.core.forecast import Memory, remember
from qosflow.core.predict import Belief, Calibration, calibrate, restart_charge
from qosflow.core.spec import JobSpec
from qosflow.core.speed import FloatArray
from qosflow.sim.adapter import belief_of, job_spec
from qosflow.sim.policy import JobView, NoOverhead, OverheadModel, SlotDecision, SlotSnapshot

BELIEF_CACHE = 4096
"""Beliefs kept between decisions (one per speed table, size list and factor; then cleared)."""
CALIBRATION_WINDOW = 2000
"""Most recent (predicted, realised) interval pairs the conformal factor is learnt from."""
CALIBRATION_MIN_PAIRS = 50
"""Pairs needed before a factor is learnt with oracle speeds (nothing covers the restarts before)."""
CALIBRATION_MIN_PAIRS_LEARNED = 200
"""Pairs needed before the learnt factor replaces the core's default (1.15) with learned speeds.

The first learnt factor becomes a floor (:func:`~qosflow.core.allocation.ratchet`), so it must
not rest on the first few jobs alone: their first intervals are predicted from the prior, and
with 50 pairs the 90 % quantile is the 5th-largest ratio, which one badly predicted job can own
(195job, noise seed 6: 1.454 from 57 pairs, held for the rest of the run; about 1.06 later). At
200 pairs it is the 21st-largest. Until then the default covers the predictions.
"""


_NEW = JobState()
"""What the allocator remembers of a job it has not seen (frozen: one for all)."""


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
    _states: dict[str, JobState] = field(default_factory=dict)
    _memory: Memory = field(default_factory=Memory)
    _ran: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    _pairs: FloatArray = field(default_factory=lambda: np.empty((CALIBRATION_WINDOW, 2)))
    _logged: int = 0
    _oracle_factor: Calibration | None = None
    _beliefs: dict[tuple[int, tuple[int, ...], float | None], tuple[object, Belief]] = field(
        default_factory=dict
    )
    _specs: dict[str, tuple[object, tuple[float, ...], JobSpec]] = field(default_factory=dict)

    def _belief(self, view: JobView, levels: tuple[int, ...], factor: float | None) -> Belief:
        """:func:`belief_of` at ``factor`` (``None``: as the speeds are), built once per table.

        A view's speeds are immutable (the trace's table, shared by every job of a model and
        batch, or one fit's tabulation), so the belief is cached on the object itself; the
        entry keeps the object, so an id is never reused while its entry lives.
        """
        key = (id(view.speeds), levels, factor)
        hit = self._beliefs.get(key)
        if hit is not None and hit[0] is view.speeds:
            return hit[1]
        if len(self._beliefs) >= BELIEF_CACHE:
            self._beliefs.clear()
        calibration = None if factor is None else Calibration(factor, 0)
        belief = belief_of(view, levels, calibration)
        self._beliefs[key] = (view.speeds, belief)
        return belief

    def _spec(self, view: JobView, snap: SlotSnapshot) -> JobSpec:
        """:func:`job_spec` of the view, built once per job and speed table.

        Everything a spec holds is fixed for the job's life except its levels, which come from
        the view's speeds; the entry keeps the speeds object, so a new table builds a new spec
        (and so does any other change to what the spec is made of).
        """
        margin = max(self.margin_s, snap.slot + self.rescale_overhead_s)
        made_of = (margin, snap.node_size, view.deadline, view.total, view.max_units)
        hit = self._specs.get(view.job_id)
        if hit is not None and hit[0] is view.speeds and hit[1] == made_of:
            return hit[2]
        spec = job_spec(view, node_size=snap.node_size, margin_s=margin, dwell_s=self.dwell_s)
        self._specs[view.job_id] = (view.speeds, made_of, spec)
        return spec

    def _input(self, view: JobView, snap: SlotSnapshot) -> JobInput:
        spec = self._spec(view, snap)
        levels = spec.resources.levels
        factor = None if self.calibration is None else self.calibration.factor
        return JobInput(
            spec=spec,
            done=view.done,
            units=view.units,
            belief=self._belief(view, levels, factor),
            state=self._states.get(view.job_id, _NEW),
            rescale_overhead_s=self.rescale_overhead_s,
            belief_factor=factor,
            belief_at=lambda f: self._belief(view, levels, f),
        )

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Learn the factor, build the snapshot, allocate, remember the allocator's state."""
        self._recalibrate(snap)
        current = self._oracle_factor or self.calibration
        inputs = tuple(self._input(v, snap) for v in snap.jobs)
        present = {v.job_id for v in snap.jobs}  # a job gone (ended, cancelled) freed its units
        out = allocate(
            ClusterInput(
                now=float(snap.now),
                capacity=snap.capacity,
                slot_s=float(snap.slot),
                jobs=inputs,
                freed=bool(snap.completed) or not self._states.keys() <= present,
                plan_factor=current.factor if current is not None else None,
                max_utilisation=self.max_utilisation,
                arrivals=self._memory.arrivals,
            )
        )
        self._memory = remember(self._memory, out.arrived, float(snap.now))  # as on the board
        profiled = tuple(  # its ladder ended now: its key's history gets its samples so far
            name
            for name, a in out.jobs.items()
            if not a.state.profiling and self._states.get(name, _NEW).profiling
        )
        self._states = {name: a.state for name, a in out.jobs.items()}
        self._specs = {k: v for k, v in self._specs.items() if k in self._states}
        inflation = max(self.calibration.factor, 1.0) if self.calibration is not None else 1.0
        views = {v.job_id: v for v in snap.jobs}
        beliefs = {j.spec.name: j.belief for j in inputs}
        self._ran = {
            name: (
                float(snap.now),
                views[name].done,
                beliefs[name].conservative.step_time(a.units) / inflation,
                self._charged(views[name].units, a.units),
            )
            for name, a in out.jobs.items()
            if a.units > 0
        }
        return SlotDecision(
            allocation={name: a.units for name, a in out.jobs.items() if a.units > 0},
            rejected=out.rejected,
            wake_at=out.wake_at,
            admitted=out.admitted,
            reasons={name: v.reason for name, v in out.verdicts.items()},
            profiled=profiled,
        )

    @property
    def pairs(self) -> FloatArray:
        """The logged (predicted, realised) interval seconds the factor is learnt from.

        The newest :data:`CALIBRATION_WINDOW` of them, in no particular order (a ring).
        """
        return self._pairs[: min(self._logged, CALIBRATION_WINDOW)].copy()

    def _charged(self, held: int, units: int) -> float:
        """Seconds of restart the plan charged a job for this decision's start or change of size.

        With learned speeds the factor learns how far the plan's own predictions were off, as
        the Airflow finish step's pairs do (each decision's predicted finish, its rescale charge
        included): the core's :func:`~qosflow.core.predict.restart_charge`. With oracle speeds
        the factor is what covers every restart the tables leave out, so nothing is credited
        there.
        """
        if self.calibration is None:
            return 0.0
        return restart_charge(self.rescale_overhead_s, held, units)

    def _recalibrate(self, snap: SlotSnapshot) -> None:
        """Conformal factor from (predicted, realised) seconds of past intervals.

        Every job that ran a whole interval at one size gives one pair: the seconds the belief's
        conservative step time *before* inflation predicted for the steps it did (plus the
        restart the plan charged for the interval's start or change of size, :meth:`_charged`),
        and the seconds it took (overheads and noise included). :func:`qosflow.core.predict.calibrate`
        turns the recent pairs into the inflation factor, which then only grows
        (:func:`qosflow.core.allocation.ratchet`). With oracle speeds this learns only what the
        tables leave out; until enough pairs exist the oracle is trusted as it is.
        """
        if self.calibration is None and not self.recalibrate:
            return
        logged = self._logged
        for view in snap.jobs:
            last = self._ran.get(view.job_id)
            if last is None or view.done <= last[1] or not 0.0 < last[2] < math.inf:
                continue
            # a ring of the most recent pairs (their order does not matter to a quantile)
            self._pairs[self._logged % CALIBRATION_WINDOW] = (
                (view.done - last[1]) * last[2] + last[3],
                float(snap.now) - last[0],
            )
            self._logged += 1
        needed = (
            CALIBRATION_MIN_PAIRS if self.calibration is None else CALIBRATION_MIN_PAIRS_LEARNED
        )
        if self._logged < needed or self._logged == logged:
            return  # too few pairs, or none new since the last factor (it would be the same)
        learnt = calibrate(self.pairs)
        if self.calibration is None:  # oracle speeds: inflate only what is promised
            self._oracle_factor = ratchet(self._oracle_factor, learnt)
        else:
            self.calibration = ratchet(self.calibration, learnt)


__all__ = ["QosflowPolicy", "belief_of", "job_spec"]
