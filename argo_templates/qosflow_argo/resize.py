"""The body of an in-place resize (``PATCH pods/{name}/resize``): CPUs and the memory they carry.

A segment is submitted with ``memory = units × memory_per_unit`` (``manifests.memory_for``), so a
resize to ``n`` units asks for ``n × memory_per_unit`` of memory as well as ``n`` CPUs. Requests
stay equal to limits for both, so the pod keeps its Guaranteed QoS class (a resize may not change
it); the template's ``resizePolicy`` for memory is ``NotRequired``, so nothing restarts.

Memory per unit comes from the workflow's submit arguments (``memory`` ÷ ``units``), which a resize
never changes; without them, from the pod's own memory limit ÷ CPU limit. When neither gives it,
the resize changes CPU only (memory stays at its current size).

Kubernetes 1.33 rejects any memory *limit decrease* under ``NotRequired`` (1.34 allows it, with a
best-effort check against the container's usage), so on 1.33 a shrinking resize keeps the memory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from qosflow.core.spec import parse_quantity
from qosflow_argo.workflow_status import arguments, main_container

_QTY = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<suffix>[A-Za-z]*)$")
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
MEMORY_SHRINK_VERSION = (1, 34)


def resize_body(container: str, units: int, memory: str | None = None) -> dict[str, Any]:
    """Strategic-merge body of ``pods/{name}/resize``: cpu (and memory) requests = limits.

    Args:
        container: Name of the container to resize (``main``).
        units: New CPU count.
        memory: New memory quantity, or ``None`` to leave memory as it is (CPU only).

    GPUs never change, and requests stay equal to limits, so the pod keeps its Guaranteed QoS.
    """
    wanted = {"cpu": str(units)}
    if memory is not None:
        wanted["memory"] = memory
    resources = {"requests": wanted, "limits": dict(wanted)}
    return {"spec": {"containers": [{"name": container, "resources": resources}]}}


def _quantity(text: str | None) -> Fraction | None:
    if text is None:
        return None
    try:
        return Fraction(parse_quantity(str(text)))
    except ValueError:
        return None


def _per_unit(wf: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[Fraction, str] | None:
    """Memory per unit (bytes) and the suffix to write it with, from the submit or the pod."""
    args = arguments(wf)
    units, memory = args.get("units", ""), args.get("memory")
    if units.isdigit() and int(units) > 0 and memory is not None:
        total = _quantity(memory)
        if total is not None:
            return total / int(units), memory
    limits = (main_container(pod).get("resources") or {}).get("limits") or {}
    memory, cpu = limits.get("memory"), _quantity(limits.get("cpu"))
    total = _quantity(memory)
    if total is None or cpu is None or cpu <= 0:
        return None
    return total / cpu, str(memory)


def _format(total: Fraction, like: str) -> str:
    """``total`` bytes with the suffix of ``like`` when whole in it, else the best binary one."""
    match = _QTY.match(like.strip())
    if match is not None and match["suffix"]:
        scale = Fraction(parse_quantity("1" + match["suffix"]))
        if (total / scale).denominator == 1:
            return f"{total / scale}{match['suffix']}"
    size = math.ceil(total)
    for suffix, scale_bytes in _BINARY:
        if size % scale_bytes == 0:
            return f"{size // scale_bytes}{suffix}"
    return str(size)


def resize_memory(
    wf: Mapping[str, Any], pod: Mapping[str, Any], units: int, *, may_shrink: bool = True
) -> str | None:
    """Memory of ``units`` units (``units × memory_per_unit``), or ``None`` to keep it as is.

    Args:
        wf: The segment's workflow (its ``units`` and ``memory`` arguments).
        pod: The training pod (its ``main`` container's limits, the fallback and the current size).
        units: New size in units.
        may_shrink: Whether the API server accepts a memory limit decrease (Kubernetes 1.34+).

    Returns:
        The new memory quantity; ``None`` when memory per unit cannot be derived, when the pod has
        no memory limit (adding one would change its QoS class), or when the memory would shrink
        and ``may_shrink`` is false.
    """
    derived = _per_unit(wf, pod)
    limits = (main_container(pod).get("resources") or {}).get("limits") or {}
    current = _quantity(limits.get("memory"))
    if derived is None or current is None:
        return None
    per_unit, like = derived
    total = per_unit * units
    if total < current and not may_shrink:
        return None
    return _format(total, like)
