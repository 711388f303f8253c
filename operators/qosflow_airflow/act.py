"""Acting on one decision: resize, pause, resume, restart or re-prioritise one job.

Both the round steps (``RescaleOperator``, ``PriorityBumpOperator``) and the finish step (which
keeps steering once the rounds are used up) act through these two functions, so an action is
the same whichever step takes it. Each returns the action record (what the report shows) and the
job's new training state, or ``None`` when nothing changed.

Rescale: in place when the unit is CPU and the cluster supports it (and the resize is not deferred
or infeasible); otherwise checkpoint → stop → verify → resubmit the next segment with the new size
and resume (:func:`~qosflow_airflow.restart.checkpoint_restart`). A target of 0 is a pause
(checkpoint and stop); a paused job's next rescale is its resume.

Priority bump: a queued workflow gets its Argo ``spec.priority`` and PriorityClass patched; a
running one is checkpoint-restarted into a higher class only when that class preempts *and* the
job is to grow into units that are not free (pod priority is immutable: a restart that cannot
take anyone's units only costs time); otherwise nothing changes and the record says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qosflow.core.cluster import Phase, ResizeState
from qosflow_airflow import metrics
from qosflow_airflow.restart import checkpoint_pause, checkpoint_restart

if TYPE_CHECKING:
    from qosflow.core.decide import Decision
    from qosflow_airflow.state import TrainingState

_APPLIED = (ResizeState.DONE, ResizeState.IN_PROGRESS)
_LOG = logging.getLogger(__name__)

Acted = tuple[dict[str, Any], "TrainingState | None"]
"""An action record and the new state (``None``: the state did not change)."""


def rescale(cluster: Any, state: TrainingState, decision: Decision) -> Acted:
    """Change the job's size to ``decision.units`` (0: pause; from a pause: resume)."""
    now = cluster.now()
    target, unit = decision.units, state.spec.resources.unit
    record: dict[str, Any] = {
        "time": now,
        "from": state.units,
        "to": target,
        "units": state.units,
        "how": "none",
    }
    if target == state.units:
        record["reason"] = f"already at {target} {unit}; nothing to do"
        return record, None
    if target == 0:
        return _pause(cluster, state, decision, record)
    if state.paused:  # resume: the stopped segment's checkpoint, at the target size
        return _restart(cluster, state, decision, record, resume=True)
    # a torchrun job's size is its pods and processes: it changes by checkpoint-restart
    if state.spec.launcher == "none" and cluster.supports_in_place_resize(unit):
        result = cluster.resize(state.workflow, target)
        if result.state in _APPLIED:
            record.update(
                how="in_place",
                units=target,
                reason=f"resized {state.workflow} in place "
                f"from {state.units} to {target} {unit} ({result.state.value})",
            )
            metrics.rescaled(state.spec.key, "in_place")
            return record, state.evolve(units=target, last_rescale_at=now)
        _LOG.warning("in-place resize %s: %s", result.state.value, result.message)
    return _restart(cluster, state, decision, record, resume=False)


def _pause(cluster: Any, state: TrainingState, decision: Decision, record: dict[str, Any]) -> Acted:
    """Target 0: checkpoint and stop; nothing is resubmitted until units come back."""
    paused = checkpoint_pause(cluster, state, reason=f"qosflow pause: {decision.reason}")
    if paused.finished:
        record.update(how="none", to=state.units, reason=f"{state.workflow} finished first")
        return record, paused.state
    record.update(
        how="pause",
        units=0,
        resumed_from=paused.resumed_from,
        reason=f"paused: {state.workflow} stopped at step {paused.resumed_from}; its units "
        f"go to jobs that need them more ({decision.reason})",
    )
    metrics.rescaled(state.spec.key, "pause")
    return record, paused.state


def _restart(
    cluster: Any,
    state: TrainingState,
    decision: Decision,
    record: dict[str, Any],
    *,
    resume: bool,
) -> Acted:
    """Checkpoint → stop → resubmit at the target (a paused job: resubmit only)."""
    target, unit = decision.units, state.spec.resources.unit
    what = "resumed after a pause" if resume else "checkpoint-restart"
    return _resubmit(
        cluster,
        state,
        record,
        how="resume" if resume else "restart",
        units=target,
        priority_class=decision.priority_class or state.priority_class,
        priority=state.priority,
        reason=f"qosflow rescale to {target} {unit}: {decision.reason}",
        says=lambda new, at: (
            f"{what}: {state.workflow} stopped at step {at}, {new} resumes on {target} {unit}"
        ),
    )


def _resubmit(
    cluster: Any,
    state: TrainingState,
    record: dict[str, Any],
    *,
    how: str,
    units: int,
    priority_class: str,
    priority: int,
    reason: str,
    says: Callable[[str, int], str],
) -> Acted:
    """Checkpoint-restart the job into its next segment; ``says(workflow, step)`` words it.

    A job that finished before it could be stopped is left as it is (nothing changed).
    """
    restart = checkpoint_restart(
        cluster, state, units=units, priority_class=priority_class, priority=priority, reason=reason
    )
    if restart.finished:
        record.update(how="none", to=record["from"], reason=f"{state.workflow} finished first")
        return record, restart.state
    record.update(
        how=how,
        units=units,
        workflow=restart.state.workflow,
        resumed_from=restart.resumed_from,
        reason=says(restart.state.workflow, restart.resumed_from),
    )
    metrics.rescaled(state.spec.key, how)
    return record, restart.state


def bump(cluster: Any, state: TrainingState, decision: Decision) -> Acted:
    """Patch a queued workflow's priority; restart a running one only when preempting pays."""
    from qosflow.core.priority import argo_priority, by_name, classify, laxity
    from qosflow_airflow.board import job_capacity

    now = cluster.now()
    spec = state.spec
    lax = laxity(
        now=now,
        deadline=spec.deadline,
        submitted_at=spec.submitted_at,
        conservative_finish=decision.conservative_finish,
    )
    decided = by_name(decision.priority_class) if decision.priority_class else None
    klass = decided or classify(
        lax, guaranteed=state.guaranteed, hopeless=False, previous=state.priority_class
    )
    current = by_name(state.priority_class)
    record: dict[str, Any] = {
        "time": now,
        "from": state.priority_class,
        "to": klass.name,
        "units": state.units,
    }
    if current is not None and klass.value <= current.value:
        record.update(
            how="none",
            to=state.priority_class,
            reason=f"laxity {lax:.2f} maps to {klass.name}, not above {state.priority_class}: "
            "no bump",
        )
        return record, None
    priority = argo_priority(deadline=spec.deadline, now=now, klass=klass)
    status = cluster.status(state.workflow)
    if status.phase is Phase.PENDING:
        cluster.set_priority(state.workflow, priority=priority, priority_class=klass.name)
        record.update(
            how="patch",
            reason=f"queued {state.workflow}: priority "
            f"{state.priority_class} → {klass.name} (spec.priority {priority})",
        )
        return record, state.evolve(priority_class=klass.name, priority=priority)
    grow = max(decision.units, state.units)
    free = job_capacity(cluster, spec.resources)[0].free
    if klass.preempts and grow - state.units > free:
        return _resubmit(
            cluster,
            state,
            record,
            how="restart",
            units=grow,
            priority_class=klass.name,
            priority=priority,
            reason=f"qosflow priority bump to {klass.name} on {grow} units",
            says=lambda _, at: (
                f"running {state.workflow} restarted into {klass.name} on {grow} "
                f"units from step {at} (lower classes hold the units it needs)"
            ),
        )
    why = (
        f"{klass.name} does not preempt"
        if not klass.preempts
        else f"the {grow - state.units} more units it needs are free or not needed"
    )
    record.update(
        how="none",
        to=state.priority_class,
        reason=f"running pod keeps {state.priority_class}: {why}; a restart would cost more "
        "than it gains",
    )
    return record, None
