"""The jobs already guaranteed on the cluster, as admission sees them, and run-unique job ids.

Admission must not promise a new job capacity that a running job was already promised. Every
segment qosflow submits carries its plan as JSON in the ``qosflow.dev/plan`` annotation, and the
plan step adds an ``admission`` block to it: the verdict kind, the deadline, the margin, the
planned levels with their conservative step times and the total steps. :func:`admitted_jobs`
reads those blocks back from the cluster's active qosflow workflows, takes the progress from their
status, and returns one :class:`~qosflow.core.admission.Candidate` per ``guaranteed`` job (best-effort
jobs reserve nothing).

Between a plan step and its submit step a promised job has no workflow yet; the plan step
records its promise in the history store's promise ledger, and :func:`admitted_jobs` counts the
ledger's promises (``pending``) next to the cluster's annotations.

The annotations are not part of the ``ClusterView`` Protocol: they are read from the Argo
Server the cluster talks to (``cluster.argo.list_workflows``, as ``ArgoCluster`` has it); a
cluster without one reports no admitted job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qosflow.core.cluster import ANNOTATION_PLAN, LABEL_MANAGED, ClusterView, JobStatus, Phase
from qosflow.core.errors import QosflowError

if TYPE_CHECKING:
    from qosflow.core.admission import Candidate

log = logging.getLogger(__name__)

ADMISSION_KEY = "admission"
_NAME_ROOM = 52
"""52 + "-" + 6 hex = 59, so the workflow ``<id>-s<segment>`` stays within the 63 characters of a
label value (Argo labels every pod with its workflow's name) for segments up to 99."""


def job_id(name: str, *parts: object) -> str:
    """A job id unique per planned run: ``<name[:52]>-<6 hex of a hash of parts>``.

    It names the workflows (``<id>-s<k>``), their ``qosflow.dev/job`` label (≤ 63 characters) and
    the checkpoint directory. The plan step hashes the DAG run's identity and the job's name and
    key (:func:`qosflow_airflow.operators.plan.plan_job_id`), never a time, so it is the same
    for every try and every re-plan of one run.
    """
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:6]
    return f"{name[:_NAME_ROOM].rstrip('-')}-{digest}"


def admission_block(cand: Candidate, kind: str, total_steps: int, unit: str) -> dict[str, Any]:
    """What the plan annotation carries so later plans can admit against this job."""
    return {
        "kind": kind,
        "unit": unit,
        "deadline": cand.deadline if math.isfinite(cand.deadline) else None,
        "margin": cand.margin,
        "levels": list(cand.levels),
        "step_time": [t if math.isfinite(t) else None for t in cand.step_time],
        "total_steps": total_steps,
    }


def plan_annotations(cluster: object) -> dict[str, str]:
    """Workflow name → plan annotation text, for every qosflow workflow the cluster can list."""
    argo = getattr(cluster, "argo", None)
    lister = getattr(argo, "list_workflows", None)
    if not callable(lister):
        return {}
    out: dict[str, str] = {}
    for wf in lister(f"{LABEL_MANAGED}=true"):
        meta = wf.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ANNOTATION_PLAN)
        if meta.get("name") and text:
            out[str(meta["name"])] = str(text)
    return out


def _block(text: str | None) -> Mapping[str, Any] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    block = data.get(ADMISSION_KEY) if isinstance(data, dict) else None
    return block if isinstance(block, dict) else None


def _candidate(job: str, block: Mapping[str, Any], segments: Sequence[JobStatus]) -> Candidate:
    from qosflow.core.admission import Candidate

    done = max(((s.steps_done or 0) for s in segments), default=0)
    running = [s.units for s in segments if s.phase is Phase.RUNNING]
    deadline = block.get("deadline")
    return Candidate(
        name=job,
        deadline=math.inf if deadline is None else float(deadline),
        remaining_steps=max(int(block["total_steps"]) - done, 0),
        margin=float(block["margin"]),
        levels=tuple(int(n) for n in block["levels"]),
        step_time=tuple(math.inf if t is None else float(t) for t in block["step_time"]),
        guaranteed=True,
        running_units=running[0] if running else 0,
    )


@dataclass(frozen=True, slots=True)
class Admitted:
    """The qosflow jobs active on the cluster, for one unit kind.

    Attributes:
        guaranteed: One candidate per guaranteed job with a segment pending or running.
        held_units: Units requested by the active segments of every planned qosflow job of the
            kind (guaranteed or best effort): admission accounts for the guaranteed ones itself,
            and best-effort ones reserve nothing, so the plan may count these units as capacity.
        own_units: Units held by the active segments of the excluded job itself (a re-plan of
            a run whose workflow runs already): its own units are capacity for it.
    """

    guaranteed: list[Candidate] = field(default_factory=list)
    held_units: int = 0
    own_units: int = 0


def succeeded_jobs(cluster: ClusterView) -> set[str]:
    """Job ids whose newest segment succeeded: done, whether or not their finish step ran."""
    newest: dict[str, JobStatus] = {}
    for status in cluster.list_jobs():
        seen = newest.get(status.job)
        if seen is None or status.segment > seen.segment:
            newest[status.job] = status
    return {job for job, s in newest.items() if s.phase is Phase.SUCCEEDED}


def admitted_jobs(
    cluster: ClusterView,
    *,
    unit: str,
    exclude: str = "",
    pending: Mapping[str, Mapping[str, Any]] | None = None,
) -> Admitted:
    """The active qosflow jobs of ``unit`` kind (``exclude``: this job's own id).

    ``pending``: the promise ledger's guarantees (job id → admission block,
    :meth:`qosflow.store.history.PromiseLedger.pending`); a promised job whose workflow is not on the
    cluster yet (its plan step ran, its submit step has not) reserves its whole job from now.
    A job whose plan annotation is missing or unreadable reserves nothing and its units count as
    used, with a warning.
    """
    by_job: dict[str, list[JobStatus]] = {}
    own = 0
    for status in cluster.list_jobs():
        if status.job != exclude:
            by_job.setdefault(status.job, []).append(status)
        elif exclude and not status.phase.finished:
            own += status.units
    annotations = plan_annotations(cluster)
    out: list[Candidate] = []
    held = 0
    for job, segments in sorted(by_job.items()):
        active = [s for s in segments if not s.phase.finished]
        if not active:
            continue
        newest_first = sorted(segments, key=lambda s: -s.segment)
        block = next(
            (b for s in newest_first if (b := _block(annotations.get(s.name))) is not None), None
        )
        if block is None:
            log.warning("%s: no admission block in its plan annotation; not reserved", job)
            continue
        if block.get("unit", unit) != unit:
            continue
        held += sum(s.units for s in active)
        if block.get("kind") != "guaranteed":
            continue
        try:
            out.append(_candidate(job, block, segments))
        except (QosflowError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: unreadable admission block (%s); not reserved", job, exc)
    out.extend(_promised(pending or {}, unit, {exclude, *by_job}))
    return Admitted(out, held, own)


def _promised(
    pending: Mapping[str, Mapping[str, Any]], unit: str, skip: set[str]
) -> list[Candidate]:
    """Candidates of the ledger's guarantees whose workflow is not on the cluster yet.

    ``skip``: this job itself and every job the cluster shows (its annotation counts there).
    """
    out: list[Candidate] = []
    for job, block in sorted(pending.items()):
        if job in skip or block.get("kind") != "guaranteed" or block.get("unit", unit) != unit:
            continue
        try:
            out.append(_candidate(job, block, []))
        except (QosflowError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: unreadable promise in the ledger (%s); not reserved", job, exc)
    return out
