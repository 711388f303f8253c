"""Argo's Pod and Retry nodes: how they are made and how a pod's state is copied into its node.

As ``assessNodeStatus`` does it (operator.go): a Pending pod keeps its node Pending with the
reason (``Unschedulable: ...``, ``CreateContainerConfigError: ...``); a running pod makes it
Running (a daemon's only once it is ready: :mod:`qosflow.local.daemons`); an ended pod ends it,
Succeeded or Failed with the container's message, ``pod deleted`` when the scheduler preempted it,
the shutdown message when the workflow was stopped. ``hostNodeName`` is the pod's node.
"""

from __future__ import annotations

from qosflow.local.clock import rfc3339
from qosflow.local.daemons import assess_running_daemon
from qosflow.local.node_tree import DONE, valid_progress
from qosflow.local.store import Obj
from qosflow.local.workflow import PodStep

PROGRESS_ANNOTATION = "workflows.argoproj.io/progress"


def pending_reason(pod: Obj) -> str:
    """Why a pod is Pending, as Argo's ``getPendingReason`` reads it.

    A waiting container first (``CreateContainerConfigError: secret "x" not found``), then an
    ``Unschedulable`` condition (``Unschedulable: 0/1 nodes are available: ...``).
    """
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is not None:
            reason = str(waiting.get("reason") or "")
            return f"{reason}: {waiting['message']}" if waiting.get("message") else reason
    for cond in status.get("conditions") or []:
        if cond.get("reason") == "Unschedulable":
            return f"Unschedulable: {cond['message']}" if cond.get("message") else "Unschedulable"
    return ""


def _base_node(wf: Obj, step: PodStep, node_type: str, now: float) -> Obj:
    """The fields every node of a step has (``boundaryID`` and ``inputs`` when they apply)."""
    wf_name = wf["metadata"]["name"]
    node: Obj = {
        "id": step.node_id,
        "name": step.node_name,
        "displayName": step.display_name,
        "type": node_type,
        "templateName": step.template,
        "templateScope": f"local/{wf_name}",
        "phase": "Pending" if node_type == "Pod" else "Running",
        "startedAt": rfc3339(now),
        "finishedAt": None,
    }
    if step.node_name != wf_name:
        node["boundaryID"] = wf_name
    if step.inputs:
        node["inputs"] = {"parameters": [{"name": k, "value": v} for k, v in step.inputs]}
    return node


def pod_node(wf: Obj, step: PodStep, now: float) -> Obj:
    """The Pending Pod node of a step (progress from its annotation, else ``0/1``)."""
    node = _base_node(wf, step, "Pod", now)
    initial = step.metadata.get("annotations", {}).get(PROGRESS_ANNOTATION, "")
    node["progress"] = initial if valid_progress(initial) else "0/1"
    return node


def retry_node(wf: Obj, step: PodStep, now: float) -> Obj:
    """The Running Retry node of a step with a ``retryStrategy`` (its attempts are children)."""
    node = _base_node(wf, step, "Retry", now)
    node["children"] = []
    return node


def _ended(step: PodStep, node: Obj, pod: Obj, shutdown: str) -> None:
    """An ended pod's node: Succeeded, Failed (with why), or the shutdown's message."""
    status = pod["status"]
    node.pop("daemoned", None)
    if shutdown:
        node.update(phase="Failed", message=shutdown)
        return
    conditions = status.get("conditions") or []
    if any(c.get("type") == "DisruptionTarget" for c in conditions):  # preempted
        node.update(phase="Failed", message="pod deleted")
        return
    if status.get("phase") == "Succeeded":
        node["phase"] = "Failed" if step.daemon else "Succeeded"  # a daemon should never end
        return
    cstatus = (status.get("containerStatuses") or [{}])[0]
    terminated = cstatus.get("state", {}).get("terminated") or {}
    code = terminated.get("exitCode")
    node["phase"] = "Failed"
    node["message"] = (
        terminated.get("message") or status.get("message") or f"Error (exit code {code})"
    )


def sync_pod_node(
    step: PodStep,
    node: Obj,
    pod: Obj | None,
    progress: str | None,
    now: float,
    shutdown: str = "",
) -> None:
    """Copy the state of ``pod`` (``None``: deleted) into its Pod node.

    ``progress`` is the pod's last ``N/M``, if any; while the workflow shuts down, ``shutdown`` is
    the message of every node whose pod ends.
    """
    if node.get("phase") in DONE:
        return
    if pod is None:
        node.update(phase="Error", message="pod deleted", finishedAt=rfc3339(now))
        node.pop("daemoned", None)
        return
    if progress is not None:
        node["progress"] = progress
    phase = pod["status"].get("phase")
    if phase == "Pending":
        reason = pending_reason(pod)
        if reason:
            node["message"] = reason
        return
    if phase == "Running" and step.daemon:
        assess_running_daemon(node, pod)
        return
    node["hostNodeName"] = pod["spec"].get("nodeName", "")
    node.pop("message", None)
    if phase == "Running":
        node["phase"] = "Running"
        return
    node["finishedAt"] = rfc3339(now)
    _ended(step, node, pod, shutdown)
