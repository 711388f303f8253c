"""``RescaleOperator`` and ``PriorityBumpOperator``: act on the round's decision.

Rescale: in place when the unit is CPU and the cluster supports it (and the resize is not deferred
or infeasible); otherwise checkpoint → stop → verify → resubmit the next segment with the new size
and resume (:func:`~qosflow_airflow.restart.checkpoint_restart`).

Priority bump: a queued workflow gets its Argo ``spec.priority`` and PriorityClass patched; a
running one is checkpoint-restarted into the higher class only when the class is the preempting
``urgent`` one (pod priority is immutable, so anything less would cost a restart for nothing);
otherwise the step is a no-op that says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from qosflow.core.cluster import Phase, ResizeState
from qosflow_airflow.operators.base import QosflowOperator, guarded
from qosflow_airflow.restart import checkpoint_restart
from qosflow_airflow.state import TrainingState

if TYPE_CHECKING:
    from qosflow.core.decide import Decision

_APPLIED = (ResizeState.DONE, ResizeState.IN_PROGRESS)


class _ActOperator(QosflowOperator):
    """Shared: the round's decision and the current state."""

    template_fields: Sequence[str] = ("conn_id", "watch_task_id", "state_task_ids")

    def __init__(self, *, watch_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.watch_task_id = watch_task_id

    def decision(self, context: Any) -> Decision:
        """The decision the round's watch pushed."""
        from qosflow.core.decide import Decision

        event = context["ti"].xcom_pull(task_ids=self.watch_task_id) or {}
        if not event.get("decision"):
            raise AirflowFailException(f"no decision in XCom of {self.watch_task_id}")
        return Decision.from_dict(event["decision"])

    def act(self, context: Any, state: TrainingState, decision: Decision) -> dict[str, Any]:
        """Do the work; return the action record (XCom)."""
        raise NotImplementedError

    def execute(self, context: Any) -> dict[str, Any]:
        """Act on the decision and push the new state."""
        state = self.current_state(context)
        decision = guarded(lambda: self.decision(context))
        record = guarded(lambda: self.act(context, state, decision))
        self.log.info("%s", record["reason"])
        return record


class RescaleOperator(_ActOperator):
    """Change the job's size to the decided number of units."""

    def act(self, context: Any, state: TrainingState, decision: Decision) -> dict[str, Any]:
        """Resize in place if possible, else checkpoint-restart at the new size."""
        cluster = self.hook.get_cluster()
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
            return record
        if cluster.supports_in_place_resize(unit):
            result = cluster.resize(state.workflow, target)
            if result.state in _APPLIED:
                new = state.evolve(units=target, last_rescale_at=now)
                self.push_state(context, new)
                record.update(
                    how="in_place",
                    units=target,
                    reason=f"resized {state.workflow} in place "
                    f"from {state.units} to {target} {unit} ({result.state.value})",
                )
                return record
            self.log.warning("in-place resize %s: %s", result.state.value, result.message)
        restart = checkpoint_restart(
            cluster,
            state,
            units=target,
            priority_class=state.priority_class,
            priority=state.priority,
            reason=f"qosflow rescale to {target} {unit}: {decision.reason}",
        )
        self.push_state(context, restart.state)
        if restart.finished:
            record.update(how="none", to=state.units, reason=f"{state.workflow} finished first")
            return record
        record.update(
            how="restart",
            units=target,
            workflow=restart.state.workflow,
            reason=f"checkpoint-restart: {state.workflow} stopped at step {restart.resumed_from}, "
            f"{restart.state.workflow} resumes on {target} {unit}",
        )
        return record


class PriorityBumpOperator(_ActOperator):
    """Raise the job's priority when the deadline is at risk."""

    def act(self, context: Any, state: TrainingState, decision: Decision) -> dict[str, Any]:
        """Patch a queued workflow; restart a running one into ``urgent``; else no-op."""
        from qosflow.core.priority import argo_priority, by_name, classify, laxity

        cluster = self.hook.get_cluster()
        now = cluster.now()
        spec = state.spec
        lax = laxity(
            now=now,
            deadline=spec.deadline,
            submitted_at=spec.submitted_at,
            conservative_finish=decision.conservative_finish,
        )
        klass = classify(
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
                reason=f"laxity {lax:.2f} maps "
                f"to {klass.name}, not above {state.priority_class}: no bump",
            )
            return record
        priority = argo_priority(deadline=spec.deadline, now=now, klass=klass)
        status = cluster.status(state.workflow)
        if status.phase is Phase.PENDING:
            cluster.set_priority(state.workflow, priority=priority, priority_class=klass.name)
            self.push_state(context, state.evolve(priority_class=klass.name, priority=priority))
            record.update(
                how="patch",
                reason=f"queued {state.workflow}: priority "
                f"{state.priority_class} → {klass.name} (spec.priority {priority})",
            )
            return record
        if klass.preempts:
            restart = checkpoint_restart(
                cluster,
                state,
                units=state.units,
                priority_class=klass.name,
                priority=priority,
                reason=f"qosflow priority bump to {klass.name}",
            )
            self.push_state(context, restart.state)
            record.update(
                how="restart",
                reason=f"running {state.workflow} restarted into "
                f"{klass.name} from step {restart.resumed_from}",
            )
            return record
        record.update(
            how="none",
            to=state.priority_class,
            reason=f"running pod keeps "
            f"{state.priority_class}: {klass.name} does not preempt, a restart "
            "would cost more than it gains",
        )
        return record
