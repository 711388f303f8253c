"""In-place resize (``PATCH pods/{name}/resize``): the API server's validation and the kubelet.

Validation (:func:`check_resize`): only ``cpu`` and ``memory`` may change; requests and limits that
were set cannot be removed; quantities must parse and be >= 0; a request may not exceed its limit;
the pod's QoS class may not change; nothing else in the spec may change (``resizePolicy`` included).
Violations are 422 ``Invalid`` with the upstream messages.

The kubelet (:func:`kubelet_resize`, one step per tick): ``PodResizePending`` (``Infeasible`` above
the capacity of the pod's node, ``Deferred`` above that node's free CPU), or admit the resize
(allocate, re-pin the process, ``PodResizeInProgress``), then report the new ``resources`` and
clear the condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qosflow.local.admission import container_causes
from qosflow.local.clock import rfc3339
from qosflow.local.pods import (
    RESIZABLE,
    allocated_cpu,
    condition,
    desired_cpu,
    drop_condition,
    effective_requests,
    format_cpu,
    main_container,
    pod_key,
    qos_class,
    set_condition,
)
from qosflow.local.status import invalid
from qosflow.local.store import Obj

if TYPE_CHECKING:
    from qosflow.local.node import Nodes


def _resource_causes(index: int, before: Obj, after: Obj) -> list[tuple[str, str]]:
    """Resize rules of one container: cpu/memory only, nothing removed."""
    causes: list[tuple[str, str]] = []
    path = f"spec.containers[{index}].resources"
    res_old, res_new = before.get("resources") or {}, after.get("resources") or {}
    for kind in ("requests", "limits"):
        was, now = res_old.get(kind) or {}, res_new.get(kind) or {}
        for res in sorted(set(was) | set(now)):
            if res not in RESIZABLE and was.get(res) != now.get(res):
                causes.append(
                    (
                        f"{path}.{kind}[{res}]",
                        "Forbidden: only cpu and memory resources are mutable",
                    )
                )
            elif res in was and res not in now:
                causes.append((f"{path}.{kind}", f"Forbidden: resource {kind} cannot be removed"))
    return causes


def check_resize(pod: str, old: list[Obj], new: list[Obj]) -> None:
    """The API server's validation of a ``/resize`` (422 Invalid with upstream messages)."""

    def rest(containers: list[Obj]) -> list[Obj]:
        return [{k: v for k, v in c.items() if k != "resources"} for c in containers]

    if len(new) != len(old) or rest(new) != rest(old):
        raise invalid(
            "Pod", pod, [("spec", "Forbidden: only cpu and memory resources are mutable")]
        )
    causes = [c for i, container in enumerate(new) for c in container_causes(i, container)]
    causes += [
        c for i, (b, a) in enumerate(zip(old, new, strict=True)) for c in _resource_causes(i, b, a)
    ]
    if causes:
        raise invalid("Pod", pod, causes)
    before_qos, after_qos = qos_class(old), qos_class(new)
    if before_qos != after_qos:
        raise invalid(
            "Pod",
            pod,
            [
                (
                    "spec",
                    f'Invalid value: "{after_qos}": Pod QOS Class may not change as a result of resizing',
                )
            ],
        )


def kubelet_resize(nodes: Nodes, pod: Obj, now: float) -> None:
    """Kubelet side of an in-place resize (one step per tick)."""
    stamp = rfc3339(now) or ""
    status = pod["status"]
    cstatus = (status.get("containerStatuses") or [None])[0]
    if cstatus is None:
        return
    container = main_container(pod)
    desired = effective_requests(container.get("resources"))
    in_progress = condition(pod, "PodResizeInProgress") is not None
    if in_progress:
        cstatus["resources"] = {k: dict(v) for k, v in (container.get("resources") or {}).items()}
        drop_condition(pod, "PodResizeInProgress")
        status["observedGeneration"] = pod["metadata"].get("generation", 1)
        nodes.store.touch(pod)
        return
    want, have = desired_cpu(pod), allocated_cpu(pod)
    allocated_memory = (cstatus.get("allocatedResources") or {}).get("memory")
    if want == have and desired.get("memory") == allocated_memory:
        if condition(pod, "PodResizePending") is not None:  # resized back: nothing to wait for
            drop_condition(pod, "PodResizePending")
            nodes.store.touch(pod)
        return
    host = nodes.node_of(pod)
    capacity = host.cpus * 1000
    free = capacity - nodes.used_cpu(host, exclude=pod, kubelet=True)
    if want > capacity:
        _pending(
            nodes,
            pod,
            stamp,
            "Infeasible",
            f"Node didn't have enough capacity: cpu, requested: {want}, capacity: {capacity}",
        )
    elif want > free:
        _pending(
            nodes,
            pod,
            stamp,
            "Deferred",
            "Node didn't have enough resource: cpu, "
            f"requested: {want}, used: {capacity - free}, capacity: {capacity}",
        )
    else:
        _apply_resize(nodes, pod, want, desired, stamp)


def _pending(nodes: Nodes, pod: Obj, stamp: str, reason: str, message: str) -> None:
    """Set ``PodResizePending`` (only writes when something changed)."""
    current = condition(pod, "PodResizePending")
    gen = pod["metadata"].get("generation", 1)
    if current and current.get("reason") == reason and current.get("observedGeneration") == gen:
        return
    set_condition(pod, "PodResizePending", "True", stamp, reason=reason, message=message)
    pod["status"]["observedGeneration"] = gen
    nodes.store.touch(pod)


def _apply_resize(nodes: Nodes, pod: Obj, want: int, desired: dict[str, Any], stamp: str) -> None:
    """Admit a resize: allocate, re-pin the process, mark it in progress."""
    key = pod_key(pod)
    record = nodes.store.runtime[key]
    cores = nodes.pick_cores(nodes.node_of(pod), want, list(record.get("cores") or []), exclude=key)
    record["cores"] = cores
    process = nodes.procs.get(key)
    if process is not None:
        process.set_cores(nodes.host_cores(cores), want / 1000)
    cstatus = pod["status"]["containerStatuses"][0]
    cstatus["allocatedResources"] = {**desired, "cpu": format_cpu(want)}
    drop_condition(pod, "PodResizePending")
    set_condition(pod, "PodResizeInProgress", "True", stamp)
    pod["status"]["observedGeneration"] = pod["metadata"].get("generation", 1)
    nodes.store.touch(pod)
