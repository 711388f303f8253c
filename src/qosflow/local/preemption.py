"""Scheduler preemption (opt-in): which running pods a pending pod may evict to fit.

As the Kubernetes scheduler does it on one node: only pods of strictly lower priority are victims,
never on behalf of a pod whose ``preemptionPolicy`` is ``Never``; the lowest priority goes first,
and among equals the most recently started (it loses the least work). If evicting every
candidate would still not make room, nobody is evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from qosflow.local.store import Obj


def priority_of(pod: Obj) -> int:
    """A pod's resolved priority (``spec.priority``, 0 when unset)."""
    return int(pod["spec"].get("priority") or 0)


def choose_victims(
    pending: Obj,
    running: Sequence[Obj],
    *,
    need: int,
    free: int,
    cpu_of: Callable[[Obj], int],
) -> list[Obj]:
    """Pods to evict so that ``need`` millicores fit (``free`` are free now); ``[]`` when none.

    Args:
        pending: The pod that does not fit.
        running: Running pods that are not already being terminated.
        need: Millicores the pending pod requests.
        free: Millicores free now.
        cpu_of: Millicores a running pod holds.
    """
    if pending["spec"].get("preemptionPolicy") == "Never":
        return []
    floor = priority_of(pending)
    candidates = sorted(
        (p for p in running if priority_of(p) < floor),
        key=lambda p: (priority_of(p), -_started(p)),
    )
    victims: list[Obj] = []
    for pod in candidates:
        if free >= need:
            break
        victims.append(pod)
        free += cpu_of(pod)
    return victims if free >= need else []


def _started(pod: Obj) -> float:
    """Sortable start time (RFC 3339 strings sort chronologically); 0 when unknown."""
    stamp = str(pod["status"].get("startTime") or "")
    return float(stamp.replace("-", "").replace(":", "").replace("T", "").rstrip("Z") or 0)
