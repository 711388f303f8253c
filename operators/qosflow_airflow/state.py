"""The training state the steps hand to each other through XCom.

Airflow tasks share nothing but XCom, so every step that changes the running job (submit, rescale,
priority bump) pushes a complete :class:`TrainingState` under the XCom key ``state``; the next step
takes the newest one (:func:`latest_state`). A job spec travels as the mapping :func:`job_to_dict`
builds, with its deadline and submission time resolved, and is re-validated by
:func:`qosflow.core.spec.load_job` on the way back in, so an XCom edited by hand cannot smuggle in an
invalid spec.

No secret travels here: XCom is stored in Airflow's database and shown in its UI, so the state
names no database URL or token. Each step that needs the history store re-reads its URL from the
connection (``conn_id``); a state written by an older qosflow with a ``history_url`` is read
without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the core's speed model pulls in scipy: not at DAG-parse time
    from qosflow.core.spec import JobSpec
    from qosflow.core.speed import ProgressSample

STATE_KEY = "state"
DONE, FAILED, DECISION = "done", "failed", "decision"
"""How a watch ends (:class:`qosflow_airflow.watch.WatchEvent`'s ``status``)."""


class XComPuller(Protocol):
    """The part of a task instance this module needs."""

    def xcom_pull(self, task_ids: str, key: str = ...) -> Any:
        """Pull one XCom value."""
        ...


def job_to_dict(spec: JobSpec) -> dict[str, Any]:
    """A JSON-safe mapping that :func:`job_from_dict` turns back into the same spec."""
    res = spec.resources
    deadline = spec.submitted_at if math.isinf(spec.deadline) else spec.deadline
    return {
        "name": spec.name,
        "key": spec.key,
        "total_steps": spec.total_steps,
        "deadline": datetime.fromtimestamp(deadline, UTC).isoformat(),
        "submitted_at": spec.submitted_at,
        "resources": {
            "unit": res.unit,
            "min": res.min,
            "max": res.max,
            "levels": list(res.levels),
            "per_node": res.per_node,
            "memory_per_unit": res.memory_per_unit,
            **({"per_worker": {res.worker_unit: res.per_worker}} if res.unit == "worker" else {}),
        },
        "checkpoint_every_steps": spec.checkpoint_every_steps,
        "best_effort": spec.best_effort,
        "if_not_guaranteed": spec.if_not_guaranteed,
        "margin_seconds": spec.margin_seconds,
        "dwell_seconds": spec.dwell_seconds,
        "image": spec.image,
        "command": list(spec.command),
        "step_seconds_estimate": spec.step_seconds_estimate,
        "step_seconds_estimate_at": spec.step_seconds_estimate_at,
        "launcher": spec.launcher,
        "pod": spec.pod.to_spec(),
        "checkpoint": None
        if spec.checkpoint is None
        else {"volume": spec.checkpoint.volume, "path": spec.checkpoint.path},
    }


def job_from_dict(data: Mapping[str, Any]) -> JobSpec:
    """Rebuild a spec from :func:`job_to_dict` output (validated again by ``load_job``)."""
    from qosflow.core.spec import load_job

    fields = {k: v for k, v in data.items() if v is not None}
    submitted = float(fields.pop("submitted_at"))
    return load_job(fields, now=datetime.fromtimestamp(submitted, UTC))


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (XCom is strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def samples_to_rows(samples: Iterable[ProgressSample]) -> list[list[float | None]]:
    """JSON rows ``[time, steps_done, units, share, pods]`` (``share`` ``None`` when unreported)."""
    return [[s.time, s.steps_done, s.units, s.share, s.pods] for s in samples]


def samples_from_rows(rows: Iterable[Sequence[float | None]]) -> list[ProgressSample]:
    """Inverse of :func:`samples_to_rows` (rows of three, without a share, are read too)."""
    from qosflow.core.speed import ProgressSample

    out = []
    for row in rows:
        t, n, u = (float(v) if v is not None else math.nan for v in row[:3])
        share = row[3] if len(row) > 3 else None
        pods = int(row[4] or 1) if len(row) > 4 else 1
        out.append(ProgressSample(t, int(n), int(u), None if share is None else float(share), pods))
    return out


@dataclass(frozen=True, slots=True)
class TrainingState:
    """Where a deadline job stands: which segment runs, at what size and priority.

    Attributes:
        job: The job spec as :func:`job_to_dict` made it.
        workflow: Name of the current segment's workflow.
        segment: Current segment number.
        units: Units of the current segment.
        priority_class: PriorityClass of the current segment's pod.
        priority: Argo ``spec.priority`` of the current segment.
        guaranteed: Whether admission guaranteed the deadline.
        checkpoint_dir: Checkpoint directory shared by all segments.
        last_rescale_at: When the size last changed (epoch seconds), ``None`` before any change.
        job_id: The run-unique job id naming the workflows (``<id>-s<k>``); empty: the spec's
            name (states written before job ids existed).
        plan: The plan JSON every segment carries in its ``qosflow.dev/plan`` annotation.
        resumed_from: The step the current segment resumed from: where the previous segment
            was stopped (its last checkpoint); ``None`` for segment 0 or when unknown.
    """

    job: Mapping[str, Any]
    workflow: str
    segment: int
    units: int
    priority_class: str
    priority: int
    guaranteed: bool
    checkpoint_dir: str
    last_rescale_at: float | None = None
    job_id: str = ""
    plan: str = "{}"
    resumed_from: int | None = None

    @property
    def name(self) -> str:
        """The job id the workflows are named and labelled by."""
        return self.job_id or str(self.job["name"])

    @property
    def spec(self) -> JobSpec:
        """The validated job spec."""
        return job_from_dict(self.job)

    @property
    def paused(self) -> bool:
        """The cluster allocator paused the job: its last segment was stopped, it holds nothing."""
        return self.units == 0

    def evolve(self, **changes: Any) -> TrainingState:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (XCom)."""
        data = asdict(self)
        data["job"] = dict(self.job)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingState:
        """Inverse of :meth:`to_dict`."""
        last, resumed = data.get("last_rescale_at"), data.get("resumed_from")
        return cls(
            job=dict(data["job"]),
            workflow=str(data["workflow"]),
            segment=int(data["segment"]),
            units=int(data["units"]),
            priority_class=str(data["priority_class"]),
            priority=int(data["priority"]),
            guaranteed=bool(data["guaranteed"]),
            checkpoint_dir=str(data["checkpoint_dir"]),
            last_rescale_at=None if last is None else float(last),
            job_id=str(data.get("job_id", "")),
            plan=str(data.get("plan", "{}")),
            resumed_from=None if resumed is None else int(resumed),
        )


def latest_state(ti: XComPuller, task_ids: Sequence[str]) -> TrainingState | None:
    """The state pushed by the first of ``task_ids`` (newest first) that pushed one."""
    for task_id in task_ids:
        value = ti.xcom_pull(task_ids=task_id, key=STATE_KEY)
        if value:
            return TrainingState.from_dict(value)
    return None


def watch_rows(ti: XComPuller, watch_task_ids: Sequence[str]) -> list[list[Any]]:
    """The progress rows the watch steps observed, in round order (a fit starts from them)."""
    rows: list[list[Any]] = []
    for task_id in watch_task_ids:
        event = ti.xcom_pull(task_ids=task_id)
        if event:
            rows.extend(list(r) for r in event.get("samples", []))
    return rows
