"""Airflow Deadline Alerts from a job's deadline: the DAG run itself is watched for the miss.

The finish step reports a miss once the job has ended; a Deadline Alert says so *when the
deadline passes*, while the run is still going, from Airflow's own scheduler and triggerer
(experimental in Airflow 3.1+: ``airflow.sdk.definitions.deadline``)::

    from qosflow_airflow.alerts import deadline_alert

    with DAG(..., deadline=deadline_alert("PT4H")):  # the job's relative deadline
        deadline_training({..., "deadline": "PT4H"}, ...)

The alert's reference is the run's queued time (``anchor="queued"``, what
``deadline_training``'s ``deadline_anchor`` counts from by default) or its logical date
(``"logical"``) plus the duration; an ISO instant is a fixed deadline. When the run has not
finished by then, the triggerer awaits :func:`deadline_missed`, which logs the miss and returns
a record of it as JSON text (Airflow keeps the callback's result in the ``callback`` table's
``output``, a text column: in Airflow 3.3.2 a callback returning a dict makes the triggerer fail
writing it, so the record is a string). A templated deadline
(``{{ params.deadline }}``) cannot be an alert: a DAG's ``deadline`` is not rendered per run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

log = logging.getLogger(__name__)

CALLBACK = "qosflow_airflow.alerts.deadline_missed"
"""The callback's import path (the triggerer imports it: it must be in the installed package)."""


def _deadline_of(job_or_deadline: Mapping[str, Any] | str | timedelta) -> tuple[str, Any]:
    """``(job name, deadline)`` of a job mapping, or ``("", deadline)``."""
    if isinstance(job_or_deadline, Mapping):
        name = str(job_or_deadline.get("name") or "")
        return name, job_or_deadline.get("deadline")
    return "", job_or_deadline


def _parse(deadline: Any) -> timedelta | datetime:
    """A duration (``PT4H``, a ``timedelta``) or an aware instant.

    Raises:
        ValueError: For templates, ``HH:MM`` clock times and anything else.
    """
    if isinstance(deadline, timedelta | datetime):
        value: timedelta | datetime = deadline
    elif isinstance(deadline, str) and "{{" in deadline:
        raise ValueError(
            f"deadline {deadline!r} is a template: a DAG's deadline alert is fixed when the DAG "
            "is parsed, so give the duration itself (e.g. 'PT4H')"
        )
    elif isinstance(deadline, str) and deadline.strip().upper().startswith("P"):
        from qosflow.core.deadline import parse_iso_duration

        value = parse_iso_duration(deadline.strip())
    elif isinstance(deadline, str) and "T" in deadline:
        value = datetime.fromisoformat(deadline.strip().replace("Z", "+00:00"))
    else:
        raise ValueError(
            f"deadline {deadline!r}: a deadline alert needs an ISO duration ('PT4H') or an ISO "
            "instant; an 'HH:MM' clock time depends on the run's day"
        )
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if isinstance(value, timedelta) and value <= timedelta(0):
        raise ValueError(f"deadline {deadline!r}: must be a positive duration")
    return value


def deadline_alert(
    job_or_deadline: Mapping[str, Any] | str | timedelta,
    *,
    anchor: Literal["queued", "logical"] = "queued",
    name: str | None = None,
) -> Any:
    """A ``DeadlineAlert`` for ``DAG(deadline=...)`` from a job's deadline.

    Args:
        job_or_deadline: A job spec mapping (its ``deadline`` and ``name``), an ISO duration
            (``PT4H``), a ``timedelta``, or an ISO instant.
        anchor: What a duration counts from: the run's queued time (default, as
            ``deadline_training``'s ``deadline_anchor``) or its logical date.
        name: The alert's name (default: ``qosflow: <job> deadline``).

    Returns:
        An ``airflow.sdk.definitions.deadline.DeadlineAlert`` whose callback is
        :func:`deadline_missed` (run by the triggerer).

    Raises:
        ValueError: The deadline is a template, a clock time, or not positive.
        ImportError: This Airflow has no Deadline Alerts (they came in 3.1).
    """
    try:
        from airflow.sdk.definitions.callback import AsyncCallback
        from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
    except ImportError as exc:  # pragma: no cover - the provider needs Airflow 3.3
        raise ImportError(f"this Airflow has no Deadline Alerts (3.1+): {exc}") from exc
    job, raw = _deadline_of(job_or_deadline)
    value = _parse(raw)
    if isinstance(value, datetime):
        reference, interval = DeadlineReference.FIXED_DATETIME(value), timedelta(0)
    else:
        reference = (
            DeadlineReference.DAGRUN_QUEUED_AT
            if anchor == "queued"
            else DeadlineReference.DAGRUN_LOGICAL_DATE
        )
        interval = value
    deadline_text = value.isoformat() if isinstance(value, datetime) else str(raw)
    label = name or f"qosflow: {job or 'training'} deadline"
    callback = AsyncCallback(
        CALLBACK, kwargs={"job": job, "deadline": deadline_text, "anchor": anchor}
    )
    return DeadlineAlert(reference=reference, interval=interval, callback=callback, name=label)


async def deadline_missed(
    job: str = "",
    deadline: str = "",
    anchor: str = "queued",
    context: Mapping[str, Any] | None = None,
    **_: Any,
) -> str:
    """The alert's callback: the run is still going past the job's deadline.

    Runs in the triggerer. Logs the miss (``ERROR``, naming the DAG run and the deadline) and
    returns a record of it as JSON text, which Airflow keeps as the callback's ``output``.
    """
    run = dict((context or {}).get("dag_run") or {})
    alert = dict((context or {}).get("deadline") or {})
    record = {
        "job": job,
        "deadline": deadline,
        "anchor": anchor,
        "dag_id": run.get("dag_id"),
        "run_id": run.get("dag_run_id") or run.get("run_id"),
        "deadline_time": str(alert.get("deadline_time") or ""),
        "detected_at": datetime.now(UTC).isoformat(),
    }
    log.error(
        "qosflow deadline missed: %s of %s/%s is still running past its deadline %s (%s)",
        job or "the training",
        record["dag_id"],
        record["run_id"],
        record["deadline_time"] or deadline,
        f"{anchor} + {deadline}" if anchor and deadline else "fixed",
    )
    return json.dumps(record)
