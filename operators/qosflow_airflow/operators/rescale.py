"""``RescaleOperator`` and ``PriorityBumpOperator``: act on the round's decision.

The actions themselves are in :mod:`qosflow_airflow.act` (the finish step takes the same ones
once the rounds are used up): a rescale resizes in place when it can, else checkpoint-restarts
at the new size (0 pauses, a paused job resumes); a bump patches a queued workflow's priority and
restarts a running one into a preempting class only when lower classes hold the units it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from qosflow_airflow import act
from qosflow_airflow.operators.base import QosflowOperator, guarded

if TYPE_CHECKING:
    from qosflow.core.decide import Decision
    from qosflow_airflow.state import TrainingState


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

    def act(self, cluster: Any, state: TrainingState, decision: Decision) -> act.Acted:
        """Do the work: the action record and the new state (``None``: unchanged)."""
        raise NotImplementedError

    def execute(self, context: Any) -> dict[str, Any]:
        """Act on the decision and push the new state."""
        state = self.current_state(context)
        decision = guarded(lambda: self.decision(context))
        record, new = guarded(lambda: self.act(self.hook.get_cluster(), state, decision))
        if new is not None:
            self.push_state(context, new)
        self.log.info("%s", record["reason"])
        return record


class RescaleOperator(_ActOperator):
    """Change the job's size to the decided number of units (0: pause; from a pause: resume)."""

    def act(self, cluster: Any, state: TrainingState, decision: Decision) -> act.Acted:
        """Resize in place if possible, else checkpoint-restart at the new size."""
        return act.rescale(cluster, state, decision)


class PriorityBumpOperator(_ActOperator):
    """Raise the job's priority class (see :func:`qosflow_airflow.act.bump`)."""

    def act(self, cluster: Any, state: TrainingState, decision: Decision) -> act.Acted:
        """Patch a queued workflow; restart a running one only when preempting pays."""
        return act.bump(cluster, state, decision)
