"""Planning and replay: the core functions composed the way every front end uses them.

``plan_job`` is what the CLI's ``qosflow plan`` and the Airflow ``PlanTrainingOperator`` call:
history prior → speed fit → belief → admission against the jobs already guaranteed → initial size,
priority class and the deadline-derived schedule. ``replay_progress`` feeds a progress log through
the decision function, the same call the Airflow sensor's trigger makes on live progress.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from qosflow.core.admission import Candidate, Verdict, admit, candidate
from qosflow.core.decide import Decision, JobSnapshot, decide, margin_for
from qosflow.core.fit import Measured, fit, measured
from qosflow.core.predict import Belief, Calibration, Prediction, belief_from_fit, predict, schedule
from qosflow.core.prior import stated_prior, timed
from qosflow.core.priority import PriorityClassDef, argo_priority, classify, laxity
from qosflow.core.spec import JobSpec
from qosflow.core.speed import ProgressSample, SpeedModel
from qosflow.core.windows import stale_before


def estimate_of(job: JobSpec) -> tuple[SpeedModel, tuple[Measured, ...]] | None:
    """What the job's own ``step_seconds_estimate`` gives (``None``: it states none).

    Returns:
        The prior through the estimate, at ``step_seconds_estimate_at`` (default
        ``resources.min``), and what it counts as measured: one window above one node, which
        the plan step records as a timing of the key (:func:`qosflow.core.prior.stated_prior`).
    """
    if job.step_seconds_estimate is None:
        return None
    at = job.step_seconds_estimate_at or job.resources.min
    return stated_prior(job.resources.per_node, step_time=job.step_seconds_estimate, units=at)


def belief_for(
    job: JobSpec,
    samples: Sequence[ProgressSample] = (),
    *,
    prior: SpeedModel | None = None,
    calibration: Calibration | None = None,
    known: Sequence[Measured] = (),
    timings: Sequence[Measured] = (),
    history_at: float | None = None,
) -> Belief:
    """Fit the job's speed from its progress samples (and prior) and turn it into a belief.

    Without a history prior, the user's ``step_seconds_estimate`` shapes a pessimistic default;
    with neither, nothing is known until the first steady progress window (every step time
    infinite). Above one node the estimate also counts as one window measured at its size
    (:func:`qosflow.core.prior.stated_prior`), as do the key's ``timings`` (the estimates
    other jobs of the key stated there, newest first; ``HistoryStore.timings``), each only
    where no run measured (:func:`qosflow.core.prior.timed`).
    ``known``: what the history the prior was fitted on measured (``measured`` of the key's
    history): those sizes count as observed and their medians anchor the belief
    (:func:`qosflow.core.predict.belief_from_fit`). ``history_at``: ``samples`` are a key's history
    read by a plan at that time, so stale windows give way to newer ones
    (:func:`qosflow.core.windows.usable`).
    """
    shape, stated = estimate_of(job) or (None, ())
    prior = shape if prior is None else prior
    result = fit(
        samples,
        node_size=job.resources.per_node,
        prior=prior,
        stale_before=stale_before(history_at),
    )
    known = (*known, *timed((*timings, *stated), known, result.measured))
    return belief_from_fit(result, job.resources.levels, calibration or Calibration(), known=known)


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of planning one job.

    Attributes:
        job: Job name.
        verdict: Admission verdict (kind, initial units, reason, counter-offer).
        prediction: Finish times at the initial size.
        priority_class: PriorityClass name for the first segment.
        priority: Argo ``spec.priority`` (EDF rank).
        schedule: ``(time, steps that must be done by then)`` at the initial size.
        candidate: The job as admission saw it (to pass on as an admitted job).
        belief: The belief it was planned on (what the job board shares of it).
    """

    job: str
    verdict: Verdict
    prediction: Prediction
    priority_class: str
    priority: int
    schedule: list[tuple[float, int]] = field(default_factory=list)
    candidate: Candidate | None = None
    belief: Belief | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (XCom, workflow annotation)."""
        return {
            "job": self.job,
            "verdict": self.verdict.to_dict(),
            "units": self.verdict.units,
            "median_finish": self.prediction.median_finish,
            "conservative_finish": self.prediction.conservative_finish,
            "priority_class": self.priority_class,
            "priority": self.priority,
            "schedule": [[t, s] for t, s in self.schedule],
        }


def plan_job(
    job: JobSpec,
    *,
    capacity: int,
    now: float,
    admitted: Sequence[Candidate] = (),
    samples: Sequence[ProgressSample] = (),
    prior: SpeedModel | None = None,
    calibration: Calibration | None = None,
    history: Sequence[ProgressSample] = (),
    timings: Sequence[Measured] = (),
) -> Plan:
    """Admit and size a job that has not started yet.

    Args:
        job: The validated job.
        capacity: Units of the job's kind in the whole cluster.
        now: Current time (epoch seconds).
        admitted: Jobs already guaranteed (their remaining work and deadlines).
        samples: Progress already observed for this job (usually none).
        prior: Speed model from history (``HistoryStore.prior``), or ``None`` for the default.
        calibration: Conformal calibration from history, or ``None`` for the default factor.
        history: Progress samples of earlier runs of the job's key (``HistoryStore.history``).
            While this job has measured nothing, it is planned on what they measured: their
            sizes count as observed (the probe rule) and their spread sets the conservative
            bound, instead of the prior's shape alone. Once it has measured, their sizes still
            count as observed when ``prior`` is given (it is their fit, ``prior_of(history)``).
        timings: The key's timings above one node, newest first (``HistoryStore.timings``):
            each counts as one window measured at its size where no run measured.

    Returns:
        The plan: verdict, initial size, prediction, priority and schedule.
    """
    old = stale_before(now)
    known = measured(history, stale_before=old) if samples and prior is not None else ()
    belief = belief_for(
        job,
        samples or history,
        prior=prior,
        calibration=calibration,
        known=known,
        timings=timings,
        history_at=None if samples else now,
    )
    cand = candidate(job, belief, steps_done=0, now=now)
    unknown = all(math.isinf(t) for t in cand.step_time)
    verdict = _verdict(job, cand, admitted, capacity=capacity, now=now, unknown=unknown)
    units = verdict.units if verdict.units in job.resources.levels else job.resources.min
    pred = predict(
        belief, now=now, steps_done=0, total_steps=job.total_steps, units=units, current_units=units
    )
    klass = _priority_class(job, belief, verdict, pred, now=now)
    plan_schedule = (
        []
        if unknown
        else schedule(
            belief,
            start=now,
            steps_done=0,
            total_steps=job.total_steps,
            units=units,
            deadline=job.deadline,
            margin=margin_for(job, now),
            points=12,
        )
    )
    return Plan(
        job=job.name,
        verdict=verdict,
        prediction=pred,
        priority_class=klass.name,
        priority=argo_priority(deadline=job.deadline, now=now, klass=klass),
        schedule=plan_schedule,
        candidate=cand,
        belief=belief,
    )


def _verdict(
    job: JobSpec,
    cand: Candidate,
    admitted: Sequence[Candidate],
    *,
    capacity: int,
    now: float,
    unknown: bool,
) -> Verdict:
    """Admission, or the verdict for a job whose speed nothing tells yet."""
    if not unknown:
        return admit(
            cand, admitted, capacity=capacity, now=now, if_not_guaranteed=job.if_not_guaranteed
        )
    why = "(no history, no progress, no step_seconds_estimate)"
    if job.if_not_guaranteed == "reject":
        return Verdict(
            "rejected",
            0,
            f"no speed is known for {job.key} {why}, so its deadline cannot be guaranteed and "
            "its spec says if_not_guaranteed: reject",
            None,
        )
    return Verdict(
        "best_effort",
        job.resources.min,
        f"no speed is known for {job.key} yet {why}: starting at {job.resources.min} "
        f"{job.resources.unit} to measure it; the deadline is not guaranteed until it has been "
        "measured",
        None,
    )


def _priority_class(
    job: JobSpec, belief: Belief, verdict: Verdict, pred: Prediction, *, now: float
) -> PriorityClassDef:
    """The first segment's class: laxity at the knee, the fastest the job can go.

    The minimal share finishes just before the deadline by construction, so laxity at it would
    call every guaranteed job urgent.
    """
    fastest = predict(
        belief,
        now=now,
        steps_done=0,
        total_steps=job.total_steps,
        units=belief.knee,
        current_units=pred.units,
    )
    lax = laxity(
        now=now,
        deadline=job.deadline,
        submitted_at=job.submitted_at,
        conservative_finish=min(fastest.conservative_finish, pred.conservative_finish),
    )
    return classify(
        lax, guaranteed=verdict.kind == "guaranteed", hopeless=verdict.kind == "rejected"
    )


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One progress report and the decision taken on it."""

    time: float
    steps: int
    units: int
    decision: Decision


def replay_progress(
    job: JobSpec,
    rows: Sequence[tuple[float, int, int]],
    *,
    free_units: int = 0,
    every: int = 1,
    prior: SpeedModel | None = None,
    calibration: Calibration | None = None,
) -> Iterator[ReplayStep]:
    """Feed ``(time, steps_done, units)`` reports through the decision function, in order.

    A change of ``units`` between reports counts as a rescale (for the dwell rule).
    """
    samples: list[ProgressSample] = []
    last_rescale: float | None = None
    for i, (when, steps, units) in enumerate(rows):
        if samples and units != samples[-1].units:
            last_rescale = when
        samples.append(ProgressSample(when, steps, units))
        if i % max(every, 1) and i != len(rows) - 1:
            continue
        belief = belief_for(job, samples, prior=prior, calibration=calibration)
        snap = JobSnapshot(
            spec=job,
            now=when,
            steps_done=steps,
            units=units,
            queued=False,
            last_rescale_at=last_rescale,
        )
        yield ReplayStep(when, steps, units, decide(snap, belief, free_units=free_units))
