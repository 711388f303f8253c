"""Reading a Workflow (and its pod) into a :class:`~qosflow.core.cluster.JobStatus` — pure functions.

* Phase: ``""``/absent and ``Pending`` → PENDING; ``Error`` folds into FAILED; a Failed/Error
  workflow whose ``spec.shutdown`` is ``Stop`` was stopped for a checkpoint-restart → STOPPED. A
  Running workflow whose training pod is still Pending (queued for resources: Argo says Running)
  is reported PENDING with no start time, so policies see it as queued, not as slow.
* Progress: ``N/M`` of the training Pod node (the newest attempt when the retry strategy made
  several). Values that are not ``N/M`` with ``0 <= N <= M``, ``M > 0`` are ignored, and so is
  Argo's automatic ``0/1``/``1/1`` when the job has more than one step (no report yet).
* Units: the pod's actual CPU (``status.containerStatuses[main].resources``, what an in-place resize
  changed), else its spec, else the workflow's ``units`` argument.
* Resize: ``PodResizePending`` (``Deferred``/``Infeasible``) and ``PodResizeInProgress`` conditions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from qosflow.core.cluster import LABEL_JOB, LABEL_SEGMENT, JobStatus, Phase, ResizeState
from qosflow.core.spec import parse_quantity
from qosflow_argo.manifests import ANNOTATION_UNITS, GPU_RESOURCE

_PROGRESS = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_PHASES = {
    "": Phase.PENDING,
    "Pending": Phase.PENDING,
    "Running": Phase.RUNNING,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
    "Error": Phase.FAILED,
}
NODE_ID_ANNOTATION = "workflows.argoproj.io/node-id"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def parse_progress(text: str | None) -> tuple[int, int] | None:
    """``"37/100"`` → ``(37, 100)``; ``None`` for anything Argo would ignore."""
    match = _PROGRESS.match(text or "")
    if match is None:
        return None
    done, total = int(match[1]), int(match[2])
    return (done, total) if 0 <= done <= total and total > 0 else None


def parse_time(text: str | None) -> float | None:
    """RFC 3339 → epoch seconds (``None`` for a null or missing time)."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def phase_of(wf: Mapping[str, Any]) -> Phase:
    """The qosflow phase of a Workflow."""
    raw = (wf.get("status") or {}).get("phase") or ""
    phase = _PHASES.get(raw, Phase.FAILED)
    if phase is Phase.FAILED and (wf.get("spec") or {}).get("shutdown") == "Stop":
        return Phase.STOPPED
    return phase


def arguments(wf: Mapping[str, Any]) -> dict[str, str]:
    """The workflow's ``spec.arguments.parameters`` as a dict."""
    params = ((wf.get("spec") or {}).get("arguments") or {}).get("parameters") or []
    return {p["name"]: str(p.get("value", "")) for p in params if "name" in p}


WORKER = "worker("
"""Display name prefix of the worker pods of a multi-pod segment (``worker(0:0)``, ...)."""


def waiting_workers(wf: Mapping[str, Any]) -> str:
    """For a multi-pod segment: which worker pods have not started and why (``""``: none).

    A worker that cannot be scheduled keeps the others waiting at the rendezvous; they give up
    after its join timeout (the segment then fails and releases every pod), and this says why.
    """
    nodes = ((wf.get("status") or {}).get("nodes") or {}).values()
    workers = [
        n
        for n in nodes
        if n.get("type") == "Pod" and str(n.get("displayName", "")).startswith(WORKER)
    ]
    waiting = [n for n in workers if n.get("phase") == "Pending"]
    if not waiting or len(waiting) == len(workers):
        return ""
    why = next((str(n["message"]) for n in waiting if n.get("message")), "not scheduled yet")
    return f"{len(waiting)} of {len(workers)} worker pods have not started: {why}"


def training_node(wf: Mapping[str, Any]) -> dict[str, Any] | None:
    """The newest Pod node of the training (the running or last attempt).

    In a multi-pod segment that is the worker pod that reports the job's progress: torchrun's
    rank 0 writes it, and the rendezvous hands rank 0 to whichever pod it orders first (not
    necessarily the pod Argo numbered 0), so among the live workers the one with the most
    progress is it. The rendezvous daemon is never the training node.
    """
    nodes = ((wf.get("status") or {}).get("nodes") or {}).values()
    pods: list[dict[str, Any]] = [
        dict(n) for n in nodes if n.get("type") == "Pod" and n.get("templateName") != "rendezvous"
    ]
    workers = [n for n in pods if str(n.get("displayName", "")).startswith(WORKER)]
    pods = workers or pods
    if not pods:
        return None

    def order(node: dict[str, Any]) -> tuple[bool, int, str, str]:
        active = node.get("phase") in (None, "", "Pending", "Running")
        done = (parse_progress(node.get("progress")) or (0, 0))[0] if workers else 0
        return active, done, str(node.get("startedAt") or ""), str(node.get("name") or "")

    return max(pods, key=order)


def _cpu(resources: Mapping[str, Any] | None, key: str = "cpu") -> int | None:
    for part in ("limits", "requests"):
        value = ((resources or {}).get(part) or {}).get(key)
        if value is not None:
            return max(1, math.floor(parse_quantity(str(value)) + Decimal("1e-9")))
    return None


def main_container(pod: Mapping[str, Any], where: str = "spec") -> dict[str, Any]:
    """The ``main`` container of a pod (``spec`` side or ``status.containerStatuses``)."""
    items = (
        (pod.get("spec") or {}).get("containers")
        if where == "spec"
        else (pod.get("status") or {}).get("containerStatuses")
    ) or []
    for container in items:
        if container.get("name") == "main":
            return dict(container)
    return dict(items[0]) if items else {}


def pod_units(pod: Mapping[str, Any], unit: str) -> int | None:
    """Units the pod really has: actual resources first, then its spec."""
    key = GPU_RESOURCE if unit == "gpu" else "cpu"
    actual = _cpu(main_container(pod, "status").get("resources"), key)
    return actual if actual is not None else _cpu(main_container(pod).get("resources"), key)


def resize_state(pod: Mapping[str, Any], desired: int | None = None) -> tuple[ResizeState, str]:
    """State of the pod's last in-place resize and the kubelet's message."""
    conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    pending = conditions.get("PodResizePending")
    if pending and pending.get("status") == "True":
        reason = pending.get("reason") or ""
        state = ResizeState.INFEASIBLE if reason == "Infeasible" else ResizeState.DEFERRED
        return state, str(pending.get("message") or reason)
    progress = conditions.get("PodResizeInProgress")
    if progress and progress.get("status") == "True":
        return ResizeState.IN_PROGRESS, str(progress.get("message") or "")
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and int(observed) < int(generation):
        return ResizeState.IN_PROGRESS, "the kubelet has not seen the resize yet"
    actual = _cpu(main_container(pod, "status").get("resources"))
    if desired is not None and actual is not None and actual != desired:
        return ResizeState.IN_PROGRESS, f"actual cpu {actual}, desired {desired}"
    return ResizeState.DONE, ""


def pod_for(wf: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The pod of the training node among the workflow's pods (newest when unsure)."""
    name = (wf.get("metadata") or {}).get("name")
    mine = [
        p for p in pods if (p.get("metadata") or {}).get("labels", {}).get(WORKFLOW_LABEL) == name
    ]
    if not mine:
        return None
    node = training_node(wf)
    if node is not None:
        for pod in mine:
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if annotations.get(NODE_ID_ANNOTATION) == node.get("id"):
                return dict(pod)
    newest = max(mine, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    return dict(newest)


def job_status(
    wf: Mapping[str, Any], pod: Mapping[str, Any] | None = None, resize: ResizeState | None = None
) -> JobStatus:
    """Everything qosflow reads from one Workflow (and its training pod, when given)."""
    meta, spec, status = wf.get("metadata") or {}, wf.get("spec") or {}, wf.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    args = arguments(wf)
    unit = labels.get("qosflow.dev/unit", "cpu")
    total = int(args["steps"]) if args.get("steps", "").isdigit() else None
    node = training_node(wf)
    progress = parse_progress((node or {}).get("progress") or status.get("progress"))
    phase = phase_of(wf)
    started = parse_time((node or {}).get("startedAt") or status.get("startedAt"))
    if phase is Phase.RUNNING and node is not None and node.get("phase") == "Pending":
        phase, started = Phase.PENDING, None
    steps_done: int | None = None
    if progress is not None and (total is None or progress[1] == total or total == 1):
        steps_done, total = progress
    one_pod = unit != "worker" and args.get("pods", "1") == "1"
    units = pod_units(pod, unit) if pod is not None and one_pod else None
    if units is None:
        fallback = annotations.get(ANNOTATION_UNITS) or args.get("units") or "0"
        units = int(fallback) if fallback.isdigit() else 0
    message = str(status.get("message") or "")
    node_message = str((node or {}).get("message") or "") or waiting_workers(wf)
    if node_message and node_message not in message:
        message = f"{message}: {node_message}" if message else node_message
    segment = labels.get(LABEL_SEGMENT, "0")
    return JobStatus(
        name=str(meta.get("name", "")),
        job=str(labels.get(LABEL_JOB, args.get("job", ""))),
        segment=int(segment) if segment.isdigit() else 0,
        phase=phase,
        steps_done=steps_done,
        total_steps=total,
        units=units,
        priority_class=str(spec.get("podPriorityClassName") or ""),
        priority=int(spec.get("priority") or 0),
        message=message,
        started_at=started,
        finished_at=parse_time(status.get("finishedAt")),
        pod_name=(pod.get("metadata") or {}).get("name") if pod is not None else None,
        resize=resize,
    )
