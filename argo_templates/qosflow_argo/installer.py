"""Installing what qosflow needs on a cluster: the WorkflowTemplate and the PriorityClass ladder.

Idempotent: an object that already matches is left alone, one that drifted is updated (with its
current ``resourceVersion``), a missing one is created, and a create that races another installer
(409) is treated as "exists". A PriorityClass whose ``value`` or ``preemptionPolicy`` differs cannot
be updated (Kubernetes forbids it); that is reported as a clear error instead of a 422.
"""

from __future__ import annotations

import copy
from typing import Any

from qosflow.core.errors import ClusterError, NotFoundError
from qosflow_argo import manifests
from qosflow_argo.argo_server import ArgoServer
from qosflow_argo.contract import check_manifest
from qosflow_argo.kube import KubeApi

IMMUTABLE = ("value", "preemptionPolicy")


def covers(actual: Any, desired: Any) -> bool:
    """True when ``actual`` holds everything in ``desired`` (servers add defaults and metadata)."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(
            covers(actual.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(covers(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return bool(actual == desired or str(actual) == str(desired))


class Installer:
    """Brings the install manifests onto a cluster through the two APIs."""

    def __init__(self, argo: ArgoServer, kube: KubeApi) -> None:
        """Use these clients."""
        self.argo = argo
        self.kube = kube

    def ensure(self, namespace: str, template_name: str) -> dict[str, str]:
        """Install or update everything; returns object name → created/updated/unchanged."""
        result = {
            f"WorkflowTemplate/{template_name}": self.ensure_template(namespace, template_name)
        }
        for klass in manifests.priority_classes():
            check_manifest(klass)
            result[f"PriorityClass/{klass['metadata']['name']}"] = self.ensure_priority_class(klass)
        return result

    def ensure_template(self, namespace: str, name: str) -> str:
        """The WorkflowTemplate ``name``, as :func:`manifests.workflow_template` renders it."""
        desired = manifests.workflow_template(namespace)
        desired["metadata"]["name"] = name
        check_manifest(desired)
        try:
            existing = self.argo.get_template(name)
        except NotFoundError:
            try:
                self.argo.create_template(desired)
                return "created"
            except ClusterError as exc:
                if exc.status != 409:
                    raise
                existing = self.argo.get_template(name)
        if covers(existing, {k: desired[k] for k in ("spec",)}) and covers(
            existing.get("metadata"), {"labels": desired["metadata"].get("labels", {})}
        ):
            return "unchanged"
        update = copy.deepcopy(desired)
        update["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        self.argo.update_template(name, update)
        return "updated"

    def ensure_priority_class(self, desired: dict[str, Any]) -> str:
        """One PriorityClass of the ladder."""
        name = desired["metadata"]["name"]
        try:
            existing = self.kube.read_priority_class(name)
        except NotFoundError:
            try:
                self.kube.create_priority_class(desired)
                return "created"
            except ClusterError as exc:
                if exc.status != 409:
                    raise
                existing = self.kube.read_priority_class(name)
        for key in IMMUTABLE:
            if str(existing.get(key, "PreemptLowerPriority")) != str(desired[key]):
                raise ClusterError(
                    f"PriorityClass {name} exists with {key}={existing.get(key)!r}, qosflow needs "
                    f"{desired[key]!r}; {key} cannot change in an update: delete the class "
                    f"(`kubectl delete priorityclass {name}`) and install again"
                )
        if covers(existing, desired):
            return "unchanged"
        update = copy.deepcopy(desired)
        update["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        self.kube.replace_priority_class(update)
        return "updated"
