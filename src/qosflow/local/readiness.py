"""Readiness: a container with a ``readinessProbe`` is ready only once its probe passes.

As the kubelet's prober: the container starts not ready (``containerStatuses[].ready`` false, the
pod's ``ContainersReady`` and ``Ready`` conditions False with ``ContainersNotReady``); the probe
runs ``initialDelaySeconds`` after the start and then every ``periodSeconds`` (default 10); after
``successThreshold`` (default 1) passes in a row the container is ready, after
``failureThreshold`` (default 3) failures in a row it is not ready again. A container without a
probe is ready as soon as it runs. Argo waits for readiness before it counts a daemon step as
started (:mod:`qosflow.local.daemons`).

Probes run in the kubelet's tick (under the store lock), each bounded by its ``timeoutSeconds``,
and a tick comes at least every ``progress_tick_s``: a period shorter than that is probed once a
tick. What the probe handlers do is :mod:`qosflow.local.probes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qosflow.local.clock import rfc3339
from qosflow.local.pods import main_container, pod_key, set_condition
from qosflow.local.probes import probe_action
from qosflow.local.runner import PodProcess
from qosflow.local.store import Obj

if TYPE_CHECKING:
    from qosflow.local.node import Nodes

NOT_READY = "containers with unready status: [main]"
"""The kubelet's message on ``ContainersReady`` / ``Ready`` while ``main`` is not ready."""


def _int(probe: Obj, field: str, default: int) -> int:
    value = probe.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def has_readiness_probe(pod: Obj) -> bool:
    """Whether the pod's ``main`` container has a ``readinessProbe``."""
    return isinstance(main_container(pod).get("readinessProbe"), dict)


def start_probing(record: dict[str, Any], pod: Obj, now: float) -> None:
    """Schedule the first probe of a container that just started (in its runtime record)."""
    probe = main_container(pod).get("readinessProbe") or {}
    delay = max(0, _int(probe, "initialDelaySeconds", 0))
    record["readiness"] = {"next": now + delay, "passed": 0, "failed": 0}


def set_ready(pod: Obj, ready: bool, now: float) -> None:
    """The container's ``ready`` flag and the pod's ``ContainersReady`` / ``Ready`` conditions."""
    stamp = rfc3339(now) or ""
    for cstatus in pod["status"].get("containerStatuses") or []:
        cstatus["ready"] = ready
    for ctype in ("ContainersReady", "Ready"):
        if ready:
            set_condition(pod, ctype, "True", stamp)
        else:
            set_condition(
                pod, ctype, "False", stamp, reason="ContainersNotReady", message=NOT_READY
            )


def update_readiness(nodes: Nodes, pod: Obj, process: PodProcess, now: float) -> None:
    """Run the readiness probe of a running pod when it is due; flip ``ready`` on a threshold."""
    container = main_container(pod)
    probe = container.get("readinessProbe")
    record = nodes.store.runtime.get(pod_key(pod))
    if not isinstance(probe, dict) or record is None or record.get("term_at") is not None:
        return
    state = record.get("readiness")
    if not isinstance(state, dict):
        start_probing(record, pod, now)
        state = record["readiness"]
    if now < float(state.get("next", 0)):
        return
    state["next"] = now + max(1, _int(probe, "periodSeconds", 10))
    action = probe_action(probe, container, str(pod["status"].get("podIP") or ""))
    passed = process.probe(action)
    state["passed"] = int(state.get("passed", 0)) + 1 if passed else 0
    state["failed"] = 0 if passed else int(state.get("failed", 0)) + 1
    statuses = pod["status"].get("containerStatuses") or [{}]
    ready = bool(statuses[0].get("ready"))
    if not ready and state["passed"] >= max(1, _int(probe, "successThreshold", 1)):
        set_ready(pod, True, now)
    elif ready and state["failed"] >= max(1, _int(probe, "failureThreshold", 3)):
        set_ready(pod, False, now)
    else:
        return
    nodes.store.touch(pod)
