"""Pod documents: resource quantities, QoS class, conditions and container status helpers.

Kept apart from the node logic so the Kubernetes API handlers (resize validation) and the node
(scheduling, kubelet) read pods the same way.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from qosflow.local.admission import check_pod
from qosflow.local.pod_spec import (
    ARGO_MOUNT,
    apply_pod_spec_patches,
    pod_fields,
    pod_metadata,
    referenced_volumes,
)
from qosflow.local.quantity import parse as parse_quantity
from qosflow.local.status import ApiError
from qosflow.local.store import Obj, Store
from qosflow.local.workflow import PodStep

LABEL_WORKFLOW = "workflows.argoproj.io/workflow"
LABEL_COMPLETED = "workflows.argoproj.io/completed"
ANNOTATION_NODE_ID = "workflows.argoproj.io/node-id"
ANNOTATION_NODE_NAME = "workflows.argoproj.io/node-name"
RESIZABLE = ("cpu", "memory")


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (string or number) as a Decimal; ``0`` when absent."""
    if value is None or value == "":
        return Decimal(0)
    return parse_quantity(str(value))


def millicores(value: Any) -> int:
    """CPU quantity in millicores (rounded up, as the API server does)."""
    return int((quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def format_cpu(milli: int) -> str:
    """Millicores as the API server writes them (``2``, ``1500m``)."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def main_container(pod: Obj) -> Obj:
    """The ``main`` container of a pod (the first container when none is named ``main``)."""
    containers = pod["spec"]["containers"]
    return next((c for c in containers if c.get("name") == "main"), containers[0])


def effective_requests(resources: Obj | None) -> dict[str, Any]:
    """Requests, defaulted from limits as the API server does."""
    resources = resources or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def desired_cpu(pod: Obj) -> int:
    """Desired CPU (spec) of a pod in millicores, over all containers."""
    return sum(
        millicores(effective_requests(c.get("resources")).get("cpu"))
        for c in pod["spec"]["containers"]
    )


def desired_memory(pod: Obj) -> Decimal:
    """Desired memory (spec) of a pod in bytes."""
    return sum(
        (
            quantity(effective_requests(c.get("resources")).get("memory"))
            for c in pod["spec"]["containers"]
        ),
        Decimal(0),
    )


def desired(pod: Obj, resource: str) -> Decimal:
    """Desired amount of any resource (an extended one such as GPUs) of a pod, over all containers."""
    return sum(
        (
            quantity(effective_requests(c.get("resources")).get(resource))
            for c in pod["spec"]["containers"]
        ),
        Decimal(0),
    )


def extended_resources(pod: Obj) -> list[str]:
    """The extended resources (``vendor/name``, GPUs) a pod requests, sorted."""
    names = {
        str(name)
        for c in pod["spec"]["containers"]
        for name in effective_requests(c.get("resources"))
        if "/" in str(name)
    }
    return sorted(names)


def allocated_cpu(pod: Obj) -> int:
    """CPU the kubelet admitted (``allocatedResources``), or the desired CPU before that."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses:
        return desired_cpu(pod)
    return sum(millicores((s.get("allocatedResources") or {}).get("cpu")) for s in statuses)


def qos_class(containers: list[Obj]) -> str:
    """Kubernetes QoS class of a pod's containers."""
    requests_any, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = effective_requests(resources)
        requests_any = requests_any or any(quantity(requests.get(r)) > 0 for r in RESIZABLE)
        requests_any = requests_any or any(quantity(limits.get(r)) > 0 for r in RESIZABLE)
        for res in RESIZABLE:
            limit = limits.get(res)
            if limit is None or quantity(limit) != quantity(requests.get(res)):
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def set_condition(
    pod: Obj, ctype: str, status: str, now: str, *, reason: str = "", message: str = ""
) -> None:
    """Add or update a pod condition (``lastTransitionTime`` moves only when status changes)."""
    conditions: list[Obj] = pod["status"].setdefault("conditions", [])
    current = next((c for c in conditions if c["type"] == ctype), None)
    entry: Obj = {"type": ctype, "status": status, "lastProbeTime": None}
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    if ctype.startswith("PodResize"):
        entry["observedGeneration"] = pod["metadata"].get("generation", 1)
    if current is None:
        conditions.append({**entry, "lastTransitionTime": now})
        return
    changed = current.get("status") != status
    current.clear()
    current.update(entry)
    current["lastTransitionTime"] = now if changed else current.get("lastTransitionTime", now)


def drop_condition(pod: Obj, ctype: str) -> None:
    """Remove a pod condition if present."""
    conditions = pod["status"].get("conditions") or []
    pod["status"]["conditions"] = [c for c in conditions if c["type"] != ctype]


def condition(pod: Obj, ctype: str) -> Obj | None:
    """A pod condition by type, or ``None``."""
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == ctype), None)


def pod_key(pod: Obj) -> str:
    """``namespace/name`` of a pod (the key of runtime records)."""
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def pod_priority(store: Store, class_name: str, pod: str) -> tuple[int, str]:
    """Priority admission: ``(value, preemptionPolicy)`` of the class (403 when unknown)."""
    if class_name:
        klass = store.get("PriorityClass", "", class_name)
        if klass is None:
            raise ApiError(
                403,
                f'pods "{pod}" is forbidden: no PriorityClass with name {class_name} was found',
            )
    else:
        klass = next((c for c in store.items("PriorityClass") if c.get("globalDefault")), None)
    if klass is None:
        return 0, "PreemptLowerPriority"
    return int(klass["value"]), str(klass.get("preemptionPolicy", "PreemptLowerPriority"))


def _check_resize_policy(pod: str, container: Obj) -> None:
    """Argo pods have ``restartPolicy: Never``, so every resize policy must be NotRequired."""
    for index, policy in enumerate(container.get("resizePolicy") or []):
        value = policy.get("restartPolicy", "NotRequired")
        if value != "NotRequired":
            raise ApiError(
                422,
                f'Pod "{pod}" is invalid: spec.containers[0].resizePolicy[{index}].restartPolicy: '
                f'Unsupported value: "{value}": supported values: "NotRequired"',
            )


def _labels(wf: Obj, step: PodStep) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's labels and annotations: the workflow's labels, ``podMetadata``, the template's."""
    meta = wf["metadata"]
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if not k.startswith("workflows.argoproj.io/")
    }
    extra_labels, annotations = pod_metadata(step)
    labels.update(extra_labels)
    labels.update({LABEL_WORKFLOW: meta["name"], LABEL_COMPLETED: "false"})
    annotations.update({ANNOTATION_NODE_ID: step.node_id, ANNOTATION_NODE_NAME: step.node_name})
    return labels, annotations


def _default_requests(container: Obj) -> None:
    """The API server's defaulting: a limit without a request is the request too."""
    resources = container.get("resources")
    if not isinstance(resources, dict) or not isinstance(resources.get("limits"), dict):
        return
    requests = resources.get("requests")
    requests = dict(requests) if isinstance(requests, dict) else {}
    for name, value in resources["limits"].items():
        requests.setdefault(name, value)
    if requests:  # a new dict: the plan's container is shared by every attempt
        container["resources"] = {**resources, "requests": requests}


def _pod_spec(step: PodStep, grace_s: float) -> Obj:
    """The pod spec Argo's controller builds for ``step``, its podSpecPatches applied."""
    container = {k: v for k, v in step.container.items() if v is not None}
    container["name"] = "main"
    mounts = list(container.get("volumeMounts") or [])
    pod_spec: Obj = {
        "containers": [container],
        "volumes": referenced_volumes(step, mounts),
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": math.ceil(grace_s),
        **pod_fields(step),
    }
    if step.priority_class:
        pod_spec["priorityClassName"] = step.priority_class
    pod_spec = apply_pod_spec_patches(pod_spec, step)
    for each in pod_spec.get("containers") or []:
        _default_requests(each)
    main = main_container({"spec": pod_spec})  # Argo mounts /var/run/argo after the patches
    main["volumeMounts"] = [*(main.get("volumeMounts") or []), dict(ARGO_MOUNT)]
    return pod_spec


def build_pod(store: Store, wf: Obj, step: PodStep, now: str, grace_s: float) -> Obj:
    """The Pod Argo's controller creates for ``step`` (priority admission included).

    Raises:
        ApiError: 400 when the controller cannot build it (a volume nobody declares, a
            podSpecPatch that does not apply), 403 for an unknown PriorityClass, 422 for an
            invalid pod (resize policy, resources, environment, volumes), as the API server
            answers the controller.
    """
    meta = wf["metadata"]
    pod_spec = _pod_spec(step, grace_s)
    class_name = str(pod_spec.get("priorityClassName") or "")
    priority, preemption = pod_priority(store, class_name, step.pod)
    pod_spec.update(priority=priority, preemptionPolicy=preemption)
    _check_resize_policy(step.pod, main_container({"spec": pod_spec}))
    labels, annotations = _labels(wf, step)
    owner = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": step.pod,
            "namespace": meta.get("namespace", ""),
            "generation": 1,
            "creationTimestamp": now,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": pod_spec,
        "status": {"phase": "Pending"},
    }
    check_pod(pod)
    pod["status"]["qosClass"] = qos_class(pod_spec["containers"])
    return pod
