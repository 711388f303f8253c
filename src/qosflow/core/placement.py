"""A cluster's capacity in a job's own units, with its pods placed whole onto nodes.

The cluster reports free CPUs or GPUs per node (:class:`~qosflow.core.cluster.Capacity`). A job
counts in its unit (a worker is a pod of ``per_worker`` CPUs or GPUs) and its pods must fit whole
on nodes (:mod:`qosflow.core.layout`), so what a job may be promised is the largest size whose
pods fit: 16 free GPUs as 8 + 4 + 4 on 8-GPU nodes are 8 for a job whose 16 would be two pods of
8. The plan step and the job board cap the free units they allocate with :func:`placeable`.
"""

from __future__ import annotations

import math

from qosflow.core.cluster import Capacity
from qosflow.core.layout import largest_placeable
from qosflow.core.spec import Resources, Unit


def pod_unit(resources: Resources) -> Unit:
    """What the job's pods request: ``cpu`` or ``gpu`` (a worker's ``per_worker`` kind)."""
    return resources.worker_unit if resources.unit == "worker" else resources.unit


def job_capacity(resources: Resources, cap: Capacity) -> Capacity:
    """``cap`` (of :func:`pod_unit`) counted in the job's units, per node.

    Workers: a node with ``f`` free CPUs holds ``floor(f / per_worker)`` more workers (the total,
    known only for the whole cluster, is counted the same way: an upper bound).
    """
    if resources.unit != "worker":
        return cap
    k = resources.per_worker
    per_node = {name: math.floor(free / k) for name, free in cap.free_per_node.items()}
    return Capacity(
        unit="worker",
        total=math.floor(cap.total / k),
        free=sum(per_node.values()) if per_node else math.floor(cap.free / k),
        free_per_node=per_node,
    )


def placeable(resources: Resources, cap: Capacity) -> int:
    """The largest level of the job whose pods fit the free capacity, 0 when none does.

    ``cap`` is the cluster's, of :func:`pod_unit` (CPUs or GPUs per node, not the job's units);
    without per-node figures, its free units (a worker job's counted in workers).
    """
    if not cap.free_per_node:
        return min(job_capacity(resources, cap).free, resources.max)
    return largest_placeable(
        resources.levels,
        cap.free_per_node,
        unit=resources.unit,
        per_node=resources.per_node,
        worker_unit=resources.worker_unit,
        per_worker=resources.per_worker,
    )
