"""Free capacity: node allocatable minus the requests of non-terminal pods, per node.

A pod's request is the larger of the sum over its containers and the largest init container, plus
its ``spec.overhead``; while a resize is pending the scheduler counts the larger of desired and
allocated, so this does too. Unschedulable nodes (cordoned) are left out. A ``worker`` unit is one
pod: its capacity is the node's ``pods`` allocatable minus its pods.

Pods of every namespace hold node capacity, so the pods come from a cluster-wide list: the reason
the runtime account has ``list pods`` (read-only, nothing else) in all namespaces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from qosflow.core.cluster import Capacity
from qosflow.core.spec import Unit, parse_quantity
from qosflow_argo.manifests import GPU_RESOURCE

RESOURCE: dict[str, str] = {"cpu": "cpu", "gpu": GPU_RESOURCE, "worker": "pods"}


def _qty(value: Any) -> Decimal:
    return parse_quantity(str(value)) if value is not None else Decimal(0)


def _request(container: Mapping[str, Any], resource: str) -> Decimal:
    return _qty(((container.get("resources") or {}).get("requests") or {}).get(resource))


def pod_request(pod: Mapping[str, Any], resource: str) -> Decimal:
    """What the scheduler reserves for ``resource`` on the pod's node."""
    if resource == "pods":
        return Decimal(1)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    allocated = {
        c.get("name"): _qty((c.get("allocatedResources") or {}).get(resource))
        for c in status.get("containerStatuses") or []
    }
    main = sum(
        (
            max(_request(c, resource), allocated.get(c.get("name"), Decimal(0)))
            for c in spec.get("containers") or []
        ),
        Decimal(0),
    )
    init = max(
        (_request(c, resource) for c in spec.get("initContainers") or []), default=Decimal(0)
    )
    return max(main, init) + _qty((spec.get("overhead") or {}).get(resource))


def free_capacity(
    unit: Unit,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    *,
    gpu_resource: str = GPU_RESOURCE,
) -> Capacity:
    """Free and total whole units of ``unit`` over schedulable nodes.

    A GPU is the extended resource ``gpu_resource`` (``nvidia.com/gpu`` unless the connection
    names another vendor's), counted from the nodes' allocatable.
    """
    resource = gpu_resource if unit == "gpu" else RESOURCE[unit]
    used: dict[str, Decimal] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node and phase not in ("Succeeded", "Failed"):
            used[node] = used.get(node, Decimal(0)) + pod_request(pod, resource)
    total, free, per_node = 0, 0, {}
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        name = str((node.get("metadata") or {}).get("name", ""))
        allocatable = _qty(((node.get("status") or {}).get("allocatable") or {}).get(resource))
        node_free = max(0, math.floor(allocatable - used.get(name, Decimal(0)) + Decimal("1e-9")))
        total += math.floor(allocatable + Decimal("1e-9"))
        free += node_free
        per_node[name] = node_free
    return Capacity(unit=unit, total=total, free=free, free_per_node=per_node)
