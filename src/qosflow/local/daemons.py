"""Daemon steps (``daemon: true``), as Argo v4.1.2's controller runs them.

Upstream (``workflow/controller``), and here:

* ``assessNodeStatus`` (operator.go): the Pod node of a daemon template becomes ``Running`` and
  ``daemoned: true`` only once its pod runs **and** every container is ready (readiness probes:
  :mod:`qosflow.local.readiness`); until then it stays Pending. Once daemoned its ``podIP`` is
  recorded, and ``{{steps.<name>.ip}}`` resolves to it in later steps (``buildLocalScope``).
* ``NodeStatus.Fulfilled`` (workflow_types.go): a daemoned node that is not Pending counts as
  fulfilled, so its step group ends (Succeeded) while the daemon keeps running, and the next
  group starts.
* A daemon pod that ends by itself fails its node: exit 0 too (``Daemoned pod succeeded. Marking
  it as failed``), and ``daemoned`` is cleared. Before it was ready, that fails its group and so
  the workflow (``child '<id>' failed``); after, its group has already succeeded and stays so:
  the workflow's outcome is then its other steps' (``executeStepGroup`` returns a fulfilled
  group as it is).
* ``killDaemonedChildren`` (exec_control.go), deferred in ``executeSteps`` (steps.go) once the
  steps node is fulfilled, and in ``markWorkflowPhase`` (operator.go): every daemoned node of the
  steps template gets its containers terminated (SIGTERM, then SIGKILL after the pod's grace
  period) and is marked **Succeeded** with ``daemoned`` cleared (``finishedAt`` is left unset, as
  upstream leaves it). This happens when the template succeeds, fails, is stopped or terminated,
  or passes its ``activeDeadlineSeconds``.
* The workflow reaches its final phase only once the daemon's pod has ended (upstream waits for
  the pod's task result, which its ``wait`` container reports when the main container ends), so
  a finished segment holds no capacity.
* A ``retryStrategy`` on a daemon template: the Retry node is daemoned along with its attempt
  (``processNodeRetries``); a failed attempt is retried as any other.
"""

from __future__ import annotations

from collections.abc import Callable

from qosflow.local.node_tree import fulfilled
from qosflow.local.store import Obj
from qosflow.local.workflow import pod_name

DAEMON_SUCCEEDED = "Daemoned pod succeeded. Marking it as failed"
"""Upstream's log line for a daemon whose pod exited 0 (the node gets no message)."""


def all_ready(pod: Obj) -> bool:
    """Whether every container of a running pod is ready."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def assess_running_daemon(node: Obj, pod: Obj) -> None:
    """A daemon's running pod: the node becomes Running and daemoned once the pod is ready."""
    if fulfilled(node) or not all_ready(pod):
        return
    status = pod.get("status") or {}
    node.update(
        phase="Running",
        daemoned=True,
        podIP=status.get("podIP", ""),
        hostNodeName=(pod.get("spec") or {}).get("nodeName", ""),
    )
    node.pop("message", None)


def kill_daemons(wf: Obj, terminate: Callable[[str], None]) -> bool:
    """``killDaemonedChildren``: terminate every daemoned node's pod, mark the node Succeeded.

    Args:
        wf: The workflow.
        terminate: Sends SIGTERM to the pod of that name (its grace period follows).

    Returns:
        Whether any daemon was killed.
    """
    name = wf["metadata"]["name"]
    killed = False
    for node in (wf.get("status") or {}).get("nodes", {}).values():
        if not node.get("daemoned"):
            continue
        if node.get("type") == "Pod":
            terminate(pod_name(name, str(node["name"]), str(node.get("templateName", ""))))
        node["phase"] = "Succeeded"
        node.pop("daemoned", None)
        killed = True
    return killed
