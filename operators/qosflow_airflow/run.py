"""The DAG run a job belongs to: its identity (naming the job) and the instant its deadline counts from.

A DAG run's plan and submit steps may run more than once: a task retry, or the user clearing the
task group in the UI (a *re-plan*). Each time they must find the same job, so that the re-run
re-attaches to the workflows the first run launched instead of starting a second copy. Two things
therefore come from the run, never from the clock of the try:

* the **job id** (:func:`qosflow_airflow.admitted.job_id` of the job's name and key and the run's
  :class:`RunIdentity`: DAG id, run id, map index), whatever the form of the deadline;
* the **anchor** of a relative deadline (``PT10M``, and the ``HH:MM`` form's "next such time"):
  by default when the run was queued, so a re-run, or a run that waited behind another
  (``max_active_runs``), gets the deadline it was queued with (:func:`deadline_anchor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

DeadlineAnchor = Literal["queued", "logical", "plan"]
"""What a relative deadline counts from: ``queued`` (the run's ``queued_at``, else its
``run_after``, when it became due, else its logical date), ``logical`` (its logical date, else
``run_after``), or ``plan`` (the time the plan step runs: every re-run moves the deadline). Each
falls back to the plan time. (Airflow 3's task context has no ``queued_at``; ``run_after`` is when
the scheduler could queue the run, and a data-interval timetable's logical date is the interval's
*start*, a whole interval earlier.)"""
ANCHORS: tuple[DeadlineAnchor, ...] = get_args(DeadlineAnchor)
_ATTEMPTS: dict[DeadlineAnchor, tuple[str, ...]] = {
    "queued": ("queued_at", "run_after", "logical_date"),
    "logical": ("logical_date", "run_after"),
    "plan": (),
}


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Which task instance of which DAG run planned the job.

    Attributes:
        dag_id: The DAG's id (``""`` when the context does not say).
        run_id: The DAG run's id.
        map_index: The task's map index (``-1`` when not mapped).
    """

    dag_id: str
    run_id: str
    map_index: int = -1

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the ``run`` of the plan annotation (``qosflow_argo.adopt``)."""
        return {"dag_id": self.dag_id, "run_id": self.run_id, "map_index": self.map_index}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def run_identity(context: Mapping[str, Any]) -> RunIdentity | None:
    """The run identity of a task context; ``None`` outside a DAG run (no ``run_id``)."""
    ti, dag, dag_run = context.get("ti"), context.get("dag"), context.get("dag_run")
    run_id = _text(context.get("run_id")) or _text(getattr(dag_run, "run_id", None))
    if run_id is None:
        return None
    dag_id = (
        _text(getattr(dag, "dag_id", None))
        or _text(getattr(dag_run, "dag_id", None))
        or _text(getattr(ti, "dag_id", None))
        or ""
    )
    index = getattr(ti, "map_index", -1)
    map_index = index if isinstance(index, int) and not isinstance(index, bool) else -1
    return RunIdentity(dag_id, run_id, map_index)


def check_anchor(anchor: str) -> DeadlineAnchor:
    """``anchor`` as a :data:`DeadlineAnchor`.

    Raises:
        ValueError: For anything else.
    """
    for known in ANCHORS:
        if anchor == known:
            return known
    raise ValueError(f"deadline_anchor: must be one of {list(ANCHORS)} (got {anchor!r})")


def deadline_anchor(context: Mapping[str, Any], anchor: DeadlineAnchor, plan_time: float) -> float:
    """Epoch seconds a relative deadline counts from (``plan_time`` when the run says nothing)."""
    dag_run = context.get("dag_run")
    for name in _ATTEMPTS[anchor]:
        value = getattr(dag_run, name, None)
        if value is None and name == "logical_date":
            value = context.get("logical_date")
        if isinstance(value, datetime):
            aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
            return aware.timestamp()
    return plan_time
