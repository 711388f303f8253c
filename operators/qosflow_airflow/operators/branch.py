"""``DeadlineBranchOperator``: map the round's decision to the task ids that act on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow.sdk import BaseBranchOperator
from airflow.sdk.exceptions import AirflowFailException

#: The actions of ``qosflow.decide.Action`` (kept literal: no core import at DAG-parse time).
ACTIONS = ("done", "on_track", "scale_up", "scale_down", "bump", "at_risk")


def branch_for(
    decision: Mapping[str, Any] | None,
    branches: Mapping[str, str],
    current_units: int | None = None,
) -> str:
    """The task id for a decision's action (``done`` when the watch saw the job end).

    ``at_risk`` with a bigger size than the current one goes to the rescale branch (the most the
    job can get is worth more than a priority class a running pod cannot change); at risk, a job
    never gives units away, so a smaller size goes to the bump branch.

    Raises:
        AirflowFailException: When the decision is missing or its action has no branch.
    """
    if not decision:
        raise AirflowFailException("no decision to branch on")
    action = str(decision.get("action", ""))
    if action not in ACTIONS:
        raise AirflowFailException(f"decision.action: unknown action {action!r}")
    target = decision.get("units")
    bigger = target is not None and current_units is not None and int(target) > current_units
    if action == "at_risk" and bigger:  # never give units away while at risk
        action = "scale_up"
    if action not in branches:
        raise AirflowFailException(f"no branch configured for action {action!r}")
    return branches[action]


class DeadlineBranchOperator(BaseBranchOperator):
    """Follow the branch configured for the decision the watch task pushed.

    Args:
        watch_task_id: The watch (sensor) task of this round.
        branches: Action value (``done``, ``on_track``, ``scale_up``, ``scale_down``, ``bump``,
            ``at_risk``) → full task id (with its group prefix).
        **kwargs: The usual operator arguments.
    """

    template_fields: Sequence[str] = ("watch_task_id",)

    def __init__(self, *, watch_task_id: str, branches: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.watch_task_id = watch_task_id
        self.branches = dict(branches)

    def choose_branch(self, context: Any) -> str | Iterable[str] | None:
        """The task id of the decided action."""
        event = context["ti"].xcom_pull(task_ids=self.watch_task_id) or {}
        decision = event.get("decision")
        chosen = branch_for(decision, self.branches, event.get("units"))
        self.log.info(
            "decision %s → %s: %s", (decision or {}).get("action"), chosen, event.get("message")
        )
        return chosen
