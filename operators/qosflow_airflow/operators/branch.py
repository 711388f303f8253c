"""``DeadlineBranchOperator``: map the round's decision to the task ids that act on it.

Its XCom is the decision in full, so the grid says what was decided and why, not only which
branch turned green: the action, the target size and the size it had, the reason in words, the
branch taken (``branch``: the task id; ``taken``: its name in the round), the watch's message and
the decision's predictions (median and conservative finish, deadline, margin).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

from airflow.sdk import BaseBranchOperator
from airflow.sdk.exceptions import AirflowFailException

BranchKey = Literal["done", "on_track", "scale_up", "scale_down", "bump", "at_risk"]
"""The actions of ``qosflow.core.decide.Action`` (a literal type: no core import at DAG-parse time;
a test checks the two agree)."""
ACTIONS: tuple[BranchKey, ...] = get_args(BranchKey)


def branch_for(
    decision: Mapping[str, Any] | None,
    branches: Mapping[BranchKey, str],
    current_units: int | None = None,
) -> str:
    """The task id for a decision's action (``done`` when the watch saw the job end).

    ``at_risk`` follows the decision's target size whenever it differs from the current one: a
    bigger one is the most the job can get, a smaller one is faster when the job runs above its
    throughput knee. Either goes to the rescale branch (as ``scale_up``/``scale_down``); only at
    the target size already (or with no target) does ``at_risk`` go to its own (bump) branch.

    Raises:
        AirflowFailException: When the decision is missing or its action has no branch.
    """
    if not decision:
        raise AirflowFailException("no decision to branch on")
    action = _action(decision.get("action"))
    if action == "at_risk":
        action = _resize_direction(decision.get("units"), current_units) or action
    if action not in branches:
        raise AirflowFailException(f"no branch configured for action {action!r}")
    return branches[action]


def _action(value: Any) -> BranchKey:
    for action in ACTIONS:
        if value == action:
            return action
    raise AirflowFailException(f"decision.action: unknown action {value!r}")


def _resize_direction(target: Any, current: int | None) -> BranchKey | None:
    """``scale_up``/``scale_down`` when the target size differs from the current one."""
    if target is None or current is None or int(target) == current:
        return None
    return "scale_up" if int(target) > current else "scale_down"


class DeadlineBranchOperator(BaseBranchOperator):
    """Follow the branch configured for the decision the watch task pushed.

    Args:
        watch_task_id: The watch (sensor) task of this round.
        branches: Action value (``done``, ``on_track``, ``scale_up``, ``scale_down``, ``bump``,
            ``at_risk``) → full task id (with its group prefix).
        **kwargs: The usual operator arguments.
    """

    template_fields: Sequence[str] = ("watch_task_id",)

    def __init__(
        self, *, watch_task_id: str, branches: Mapping[BranchKey, str], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.watch_task_id = watch_task_id
        unknown = sorted(set(branches) - set(ACTIONS))
        if unknown:
            raise ValueError(f"branches: unknown actions {unknown} (known: {list(ACTIONS)})")
        self.branches: dict[BranchKey, str] = dict(branches)

    def choose_branch(self, context: Any) -> str | Iterable[str] | None:
        """The task id of the decided action."""
        event = context["ti"].xcom_pull(task_ids=self.watch_task_id) or {}
        return branch_for(event.get("decision"), self.branches, event.get("units"))

    def execute(self, context: Any) -> dict[str, Any]:
        """Publish the decision, its reason and the branch (XCom); follow the branch.

        The record is pushed as the ``return_value`` XCom *before* branching: Airflow 3 skips
        the other branches by raising ``DownstreamTasksSkipped`` out of ``do_branch``, so a
        returned value would never be stored.
        """
        ti = context["ti"]
        event = ti.xcom_pull(task_ids=self.watch_task_id) or {}
        chosen = self.choose_branch(context)
        record = decision_record(event, str(chosen))
        ti.xcom_push(key="return_value", value=record)
        self.log.info(
            "decided %s (%s → %s units) → %s: %s",
            record["action"],
            record["current_units"],
            record["units"],
            record["taken"],
            record["reason"],
        )
        self.do_branch(context, chosen)
        return record


def decision_record(event: Mapping[str, Any], chosen: str) -> dict[str, Any]:
    """What the decide step publishes: the watch's decision and the branch it took."""
    decision = dict(event.get("decision") or {})
    return {
        "action": decision.get("action"),
        "units": decision.get("units"),
        "current_units": event.get("units"),
        "reason": decision.get("reason"),
        "branch": chosen,
        "taken": chosen.rsplit(".", 1)[-1],
        "time": event.get("time"),
        "workflow": event.get("workflow"),
        "message": event.get("message"),
        "priority_class": decision.get("priority_class"),
        "median_finish": decision.get("median_finish"),
        "conservative_finish": decision.get("conservative_finish"),
        "deadline": decision.get("deadline"),
        "margin": decision.get("margin"),
    }
