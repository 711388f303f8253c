"""Validation of an in-place resize (``PATCH pods/{name}/resize``), as the API server does it.

Only ``cpu`` and ``memory`` may change; requests and limits that were set cannot be removed; a
request may not exceed its limit; the pod's QoS class may not change; nothing else in the spec may
change (``resizePolicy`` included). Violations are 422 ``Invalid`` with the upstream messages.
"""

from __future__ import annotations

from qosflow.local.pods import RESIZABLE, qos_class, quantity
from qosflow.local.status import invalid
from qosflow.local.store import Obj


def _resource_causes(index: int, before: Obj, after: Obj) -> list[tuple[str, str]]:
    """Resize rules of one container: cpu/memory only, nothing removed, request <= limit."""
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
    requests, limits = res_new.get("requests") or {}, res_new.get("limits") or {}
    for res in RESIZABLE:
        if res in requests and res in limits and quantity(requests[res]) > quantity(limits[res]):
            causes.append(
                (
                    f"{path}.requests",
                    f'Invalid value: "{requests[res]}": must be less than or equal to {res} limit of {limits[res]}',
                )
            )
    return causes


def check_resize(pod: str, old: list[Obj], new: list[Obj]) -> None:
    """The API server's validation of a ``/resize`` (422 Invalid with upstream messages)."""

    def rest(containers: list[Obj]) -> list[Obj]:
        return [{k: v for k, v in c.items() if k != "resources"} for c in containers]

    if len(new) != len(old) or rest(new) != rest(old):
        raise invalid(
            "Pod", pod, [("spec", "Forbidden: only cpu and memory resources are mutable")]
        )
    causes = [
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
