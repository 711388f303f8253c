"""The scheduler of the local cluster: which node takes each pending pod, or why none can.

As ``kube-scheduler`` does it, one pod at a time in priority order (pod priority from its
PriorityClass, then the workflow's Argo ``spec.priority``, read live, then creation order):

* **Filter.** A PersistentVolumeClaim the pod mounts must exist and be bound (a cluster-wide
  pre-filter: ``0/2 nodes are available: persistentvolumeclaim "x" not found.``). On each node,
  the pod's ``nodeSelector`` and required node affinity must match the node's labels (else
  ``node(s) didn't match Pod's node affinity/selector``, which no preemption can help), then its
  requests must fit the node's free ``cpu``, ``memory`` and extended resources such as
  ``nvidia.com/gpu`` (else ``Insufficient cpu``, ...). A pod is never split across nodes.
* **Score.** Among the nodes that fit, the least allocated one after placing the pod (the mean of
  its free cpu and memory fractions, ``NodeResourcesFit``'s ``LeastAllocated``), the first node
  on a tie; a pod nominated by preemption goes to its nominated node when it fits there.
* **Unschedulable.** Otherwise the pod stays Pending with ``PodScheduled=False / Unschedulable``
  and the scheduler's message: the per-node reasons counted and sorted, then the preemption
  verdict (``0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available:
  2 No preemption victims found for incoming pod.``).
* **Preemption** (opt-in): a pod short of CPU only evicts strictly lower-priority pods of one node
  (:mod:`qosflow.local.preemption`), on the node that needs the lowest-priority, then the fewest,
  victims; it is nominated to that node.

Each pod that fits is bound and started at once, so smaller pods backfill behind a big one, as in
Kubernetes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

from qosflow.local.clock import rfc3339
from qosflow.local.pod_volumes import claim_problem
from qosflow.local.pods import (
    allocated_cpu,
    condition,
    desired,
    desired_cpu,
    desired_memory,
    extended_resources,
    pod_key,
    set_condition,
)
from qosflow.local.preemption import choose_victims, priority_of
from qosflow.local.scheduling import AFFINITY_REASON, fits_node
from qosflow.local.store import Obj
from qosflow.local.topology import NodeInfo

if TYPE_CHECKING:
    from qosflow.local.node import Nodes

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"


def queue(nodes: Nodes) -> list[Obj]:
    """Pending, unbound pods in admission order."""
    pending = [
        p
        for p in nodes.store.items("Pod")
        if p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")
    ]
    return sorted(
        pending,
        key=lambda p: (
            -int(p["spec"].get("priority", 0)),
            -nodes.argo_priority(p),
            nodes.store.creation_seq(p),
        ),
    )


def schedule(nodes: Nodes, now: float) -> None:
    """Bind and start every queued pod that fits, in priority order."""
    for pod in queue(nodes):
        try:
            _schedule_one(nodes, pod, now)
        except Exception as exc:  # one pod that cannot start must not stop the queue
            nodes.fail_pod(pod, now, exc)


def shortages(nodes: Nodes, pod: Obj, node: NodeInfo) -> list[str]:
    """The resources ``pod`` requests beyond what ``node`` has free (``cpu``, ``memory``, ...)."""
    free = nodes.free(node)
    wanted = {"cpu": Decimal(desired_cpu(pod)), "memory": desired_memory(pod)}
    for name in extended_resources(pod):
        wanted[name] = desired(pod, name)
    return [name for name, amount in wanted.items() if amount > free.get(name, Decimal(0))]


def node_reasons(nodes: Nodes, pod: Obj, node: NodeInfo) -> list[str]:
    """Why ``node`` cannot take ``pod`` now, in the scheduler's words (empty: it fits)."""
    if not fits_node(pod["spec"], node.labels, node.name):
        return [AFFINITY_REASON]
    return [f"Insufficient {name}" for name in shortages(nodes, pod, node)]


def unschedulable_message(reasons: Sequence[Sequence[str]]) -> str:
    """The scheduler's ``FitError`` message for the per-node ``reasons`` of a pod.

    Nodes short of resources only could be helped by preemption (which found no victims); a node
    that does not match the pod's node selection could not.
    """
    total = len(reasons)
    histogram = Counter(reason for node in reasons for reason in node)
    counted = sorted(f"{count} {reason}" for reason, count in histogram.items())
    message = f"0/{total} nodes are available: {', '.join(counted)}."
    helpable = sum(1 for node in reasons if all(r.startswith("Insufficient ") for r in node))
    if helpable:
        verdicts = [f"{helpable} {NO_VICTIMS}"]
        if total - helpable:
            verdicts.append(f"{total - helpable} {NOT_HELPFUL}")
        message += f" preemption: 0/{total} nodes are available: {', '.join(sorted(verdicts))}."
    return message


def _score(nodes: Nodes, pod: Obj, node: NodeInfo) -> Decimal:
    """``LeastAllocated``: the mean free fraction of cpu and memory once the pod is placed."""
    free = nodes.free(node)
    cpu = (free["cpu"] - desired_cpu(pod)) / Decimal(node.cpus * 1000)
    memory = (free["memory"] - desired_memory(pod)) / Decimal(max(node.memory, 1))
    return (cpu + memory) / 2


def _mark_unschedulable(nodes: Nodes, pod: Obj, message: str, now: float) -> None:
    """``PodScheduled=False / Unschedulable`` with ``message`` (touched only on a change)."""
    current = condition(pod, "PodScheduled")
    if current is not None and current.get("message") == message:
        return
    stamp = rfc3339(now) or ""
    set_condition(pod, "PodScheduled", "False", stamp, reason="Unschedulable", message=message)
    nodes.store.touch(pod)


def _schedule_one(nodes: Nodes, pod: Obj, now: float) -> None:
    """Start one queued pod on the best node, or mark it Unschedulable (preempting if allowed)."""
    problem = claim_problem(nodes.store, pod, len(nodes.nodes))
    if problem is not None:
        _mark_unschedulable(nodes, pod, problem, now)
        return
    reasons = [node_reasons(nodes, pod, node) for node in nodes.nodes]
    feasible = [node for node, why in zip(nodes.nodes, reasons, strict=True) if not why]
    if feasible:
        nominated = pod["status"].get("nominatedNodeName")
        chosen = next((n for n in feasible if n.name == nominated), None) or max(
            feasible, key=lambda n: (_score(nodes, pod, n), -n.index)
        )
        nodes.start(pod, chosen, now)
        return
    cpu_only = [
        n for n, why in zip(nodes.nodes, reasons, strict=True) if why == ["Insufficient cpu"]
    ]
    if cpu_only and nodes.preemption and _preempt(nodes, pod, cpu_only, now):
        return
    _mark_unschedulable(nodes, pod, unschedulable_message(reasons), now)


def _preempt(nodes: Nodes, pod: Obj, candidates: list[NodeInfo], now: float) -> bool:
    """Evict lower-priority pods of one node for ``pod`` (once); True when it waits for them."""
    if pod["status"].get("nominatedNodeName"):
        return any(nodes.store.runtime.get(k, {}).get("preempted_by") for k in nodes.procs)
    terminating = {k for k, r in nodes.store.runtime.items() if r.get("term_at") is not None}
    need = desired_cpu(pod)
    plans: list[tuple[tuple[int, int, int], NodeInfo, list[Obj]]] = []
    for node in candidates:
        running = [p for p in nodes.running_pods(node) if pod_key(p) not in terminating]
        free = int(nodes.free(node)["cpu"])
        victims = choose_victims(pod, running, need=need, free=free, cpu_of=allocated_cpu)
        if victims:
            top = max(priority_of(v) for v in victims)
            plans.append(((top, len(victims), node.index), node, victims))
    if not plans:
        return False
    _, node, victims = min(plans, key=lambda plan: plan[0])
    preemptor = pod_key(pod)
    for victim in victims:
        nodes.store.runtime[pod_key(victim)]["preempted_by"] = preemptor
        set_condition(
            victim,
            "DisruptionTarget",
            "True",
            rfc3339(now) or "",
            reason="PreemptionByScheduler",
            message=f"{preemptor}: preempting to accommodate a higher priority pod",
        )
        nodes.terminate(victim, now)
        nodes.store.touch(victim)
    pod["status"]["nominatedNodeName"] = node.name
    nodes.store.touch(pod)
    return True
