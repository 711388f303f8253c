"""How a size becomes pods: one pod, or several pods of equal size under torchrun.

A job's size ``n`` is in its unit. A pod cannot be larger than a node, so:

* ``unit: cpu`` or ``gpu``: ``n`` up to ``per_node`` is one pod of ``n`` units; above it, ``p =
  ceil(n / per_node)`` pods of ``n / p`` units each (16 GPUs on 8-GPU nodes: 2 pods of 8), which
  must divide evenly (12 GPUs on 8-GPU nodes: 2 pods of 6; 9 GPUs cannot be split into equal pods
  of at most 8, so it is refused at the spec);
* ``unit: worker``: ``n`` workers are ``n`` pods of ``per_worker`` CPUs or GPUs each.

Several pods are one data-parallel job launched by torchrun (``launcher: torchrun``); a program
that is not distributed cannot use more than one node.

Placement (:func:`placeable`) is what a scheduler can do with the nodes' free capacity: the pods
must fit whole, each on one node, so 16 GPUs on 8-GPU nodes need two nodes with 8 free each, and
16 free GPUs spread as 8 + 4 + 4 do not make a 16-GPU job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PodResource = Literal["cpu", "gpu"]


@dataclass(frozen=True, slots=True)
class Layout:
    """The pods of one size of a job.

    Attributes:
        pods: Number of pods.
        units_per_pod: The job's units in each pod (one worker for ``unit: worker``).
        resource: What a pod requests: CPUs or GPUs.
        per_pod: How many of them each pod requests.
    """

    pods: int
    units_per_pod: int
    resource: PodResource
    per_pod: int


def layout(
    unit: str, n: int, *, per_node: int, worker_unit: PodResource = "cpu", per_worker: int = 1
) -> Layout:
    """The pods of size ``n`` (see the module docstring); ``n`` must be valid (:func:`problem`)."""
    if unit == "worker":
        return Layout(n, 1, worker_unit, per_worker)
    pods = max(1, math.ceil(n / per_node))
    per_pod = n // pods
    resource: PodResource = "gpu" if unit == "gpu" else "cpu"
    return Layout(pods, per_pod, resource, per_pod)


def problem(unit: str, n: int, *, per_node: int) -> str | None:
    """Why size ``n`` cannot be split into equal pods of at most ``per_node`` units, or ``None``."""
    if unit == "worker" or n <= per_node:
        return None
    pods = math.ceil(n / per_node)
    if n % pods:
        return (
            f"{n} {unit} units need {pods} pods of at most {per_node} (a node), and {n} does not "
            f"split into {pods} equal pods: use a multiple of {pods}"
        )
    return None


def placeable(lay: Layout, free_per_node: Mapping[str, int]) -> bool:
    """Whether the pods of ``lay`` fit whole into the nodes' free capacity (of ``lay.resource``).

    Pods are all the same size, so placing each on the node with the most room left is optimal.
    """
    free = sorted(free_per_node.values(), reverse=True)
    for _ in range(lay.pods):
        if not free or free[0] < lay.per_pod:
            return False
        free[0] -= lay.per_pod
        free.sort(reverse=True)
    return True


def largest_placeable(
    levels: tuple[int, ...],
    free_per_node: Mapping[str, int],
    *,
    unit: str,
    per_node: int,
    worker_unit: PodResource = "cpu",
    per_worker: int = 1,
) -> int:
    """The largest level whose pods fit into ``free_per_node`` (0 when none does)."""
    best = 0
    for n in levels:
        lay = layout(unit, n, per_node=per_node, worker_unit=worker_unit, per_worker=per_worker)
        if placeable(lay, free_per_node):
            best = n
    return best


def job_problem(
    unit: str, levels: tuple[int, ...], *, per_node: int, launcher: str
) -> tuple[str, str] | None:
    """``(field, rule)`` when a job's sizes cannot run as pods, or ``None``.

    Sizes above a node need several pods, so a distributed program (``launcher: torchrun``) and
    an even split into pods of at most ``per_node`` units.
    """
    multi = [n for n in levels if unit == "worker" or n > per_node]
    if multi and launcher != "torchrun":
        return (
            "launcher",
            f"a size of {multi[-1]} {unit} runs as several pods, one data-parallel job: set "
            f"launcher: torchrun (a distributed training program), or keep resources.max at most "
            f"per_node ({per_node})",
        )
    for n in levels:
        why = problem(unit, n, per_node=per_node)
        if why is not None:
            return "resources.levels", why
    return None
