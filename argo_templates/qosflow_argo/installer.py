"""Installing what qosflow needs on a cluster: template, PriorityClasses, RBAC, checkpoint claim.

Idempotent: an object that already matches is left alone, one that drifted is updated (with its
current ``resourceVersion``), a missing one is created, and a create that races another installer
(409) is treated as "exists". A PriorityClass whose ``value`` or ``preemptionPolicy`` differs cannot
be updated (Kubernetes forbids it); that is reported as a clear error instead of a 422.

PriorityClasses are cluster-scoped and Kubernetes cannot restrict ``create`` by name, so qosflow's
runtime account may only read them and update the ladder's own classes
(:mod:`qosflow_argo.rbac`). Creating the ladder is an install step run with the installer's own
rights (``kubectl apply -f argo_templates/priority-classes.yaml``, or ``ensure_installed()`` as an
administrator). When the ladder exists, installing needs no ``create``; when a class is missing and
the account may not create it, :class:`LadderMissing` names every missing class and the command
that installs them.

The RBAC objects (:mod:`qosflow_argo.rbac`) are installed by ``qosflow argo install`` (an
administrator's token: granting rights needs rights) and compared on every install: a Role whose
rules drifted is updated; a binding whose ``roleRef`` differs cannot be (Kubernetes forbids it)
and is reported with the command that fixes it. The checkpoint claim is created when missing and
otherwise left alone (its size and class are the storage's business); its state is reported.
"""

from __future__ import annotations

import copy
from typing import Any

from qosflow.core.errors import ClusterError, NotFoundError
from qosflow_argo import manifests
from qosflow_argo.argo_server import ArgoServer
from qosflow_argo.contract import check_manifest
from qosflow_argo.kube import KubeApi
from qosflow_argo.rbac import rbac as rbac_objects

IMMUTABLE = ("value", "preemptionPolicy")
INSTALL_LADDER = "kubectl apply -f argo_templates/priority-classes.yaml"
FORBIDDEN = 403


class LadderMissing(ClusterError):
    """PriorityClasses of the ladder are missing and this account may not create them.

    Attributes:
        missing: Names of the missing classes.
        detail: The API server's refusal of the create.
    """

    def __init__(self, missing: list[str], detail: str) -> None:
        """Name the missing classes, the refusal and how to install them."""
        self.missing = list(missing)
        self.detail = detail
        super().__init__(
            f"PriorityClass {', '.join(missing)} missing, and this account may not create "
            f"PriorityClasses ({detail}): creating the ladder is an install step run with the "
            f"installer's own rights: `{INSTALL_LADDER}` (see docs/real-cluster.md)",
            status=FORBIDDEN,
        )


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
    """Brings the install manifests onto a cluster through the two APIs.

    With ``dry_run`` it reads what is there and writes nothing: each object is reported as it
    would be (``would be created``, ``would be updated``, ``unchanged``).
    """

    def __init__(self, argo: ArgoServer, kube: KubeApi, *, dry_run: bool = False) -> None:
        """Use these clients."""
        self.argo = argo
        self.kube = kube
        self.dry_run = dry_run

    def ensure(
        self,
        namespace: str,
        template_name: str,
        *,
        rbac: bool = False,
        claim: dict[str, Any] | None = None,
    ) -> dict[str, str]:
        """Install or update everything; returns object name → created/updated/unchanged.

        Args:
            namespace: The namespace of the namespaced objects.
            template_name: Name of the WorkflowTemplate.
            rbac: Also the ServiceAccounts, Roles and bindings of :func:`qosflow_argo.rbac.rbac`.
            claim: A checkpoint PersistentVolumeClaim to create when missing
                (:func:`manifests.checkpoint_claim`).

        Raises:
            LadderMissing: Some ladder classes are missing and this account may not create them
                (the others are still checked, so the error names every missing class).
        """
        result = {
            f"WorkflowTemplate/{template_name}": self.ensure_template(namespace, template_name)
        }
        if rbac:
            for doc in rbac_objects(namespace):
                result[f"{doc['kind']}/{doc['metadata']['name']}"] = self.ensure_object(doc)
        if claim is not None:
            name = claim["metadata"]["name"]
            result[f"PersistentVolumeClaim/{name}"] = self.ensure_claim(claim)
        missing: list[str] = []
        refusal = ""
        for klass in manifests.priority_classes():
            check_manifest(klass)
            name = klass["metadata"]["name"]
            try:
                result[f"PriorityClass/{name}"] = self.ensure_priority_class(klass)
            except LadderMissing as exc:
                missing += exc.missing
                refusal = refusal or exc.detail
        if missing:
            raise LadderMissing(missing, refusal)
        return result

    def ensure_template(self, namespace: str, name: str) -> str:
        """The WorkflowTemplate ``name``, as :func:`manifests.workflow_template` renders it."""
        desired = manifests.workflow_template(namespace)
        desired["metadata"]["name"] = name
        check_manifest(desired)
        try:
            existing = self.argo.get_template(name)
        except NotFoundError:
            if self.dry_run:
                return "would be created"
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
        if self.dry_run:
            return "would be updated"
        update = copy.deepcopy(desired)
        update["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        self.argo.update_template(name, update)
        return "updated"

    def ensure_object(self, desired: dict[str, Any]) -> str:
        """A ServiceAccount, Role or binding: create it, or update it when its content drifted.

        Raises:
            ClusterError: A binding's ``roleRef`` differs (immutable), or the API refused.
        """
        check_manifest(desired)
        kind, name = desired["kind"], desired["metadata"]["name"]
        try:
            existing = self.kube.read_object(kind, name)
        except NotFoundError:
            if self.dry_run:
                return "would be created"
            try:
                self.kube.create_object(desired)
                return "created"
            except ClusterError as exc:
                if exc.status != 409:
                    raise
            existing = self.kube.read_object(kind, name)
        content = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
        labels = desired["metadata"].get("labels", {})
        if covers(existing, content) and covers(existing.get("metadata"), {"labels": labels}):
            return "unchanged"
        if "roleRef" in desired and not covers(existing.get("roleRef"), desired["roleRef"]):
            raise ClusterError(
                f"{kind} {name} exists with roleRef {existing.get('roleRef')}, qosflow needs "
                f"{desired['roleRef']}; a roleRef cannot change: delete the binding "
                f"(`kubectl delete {kind.lower()} {name}`) and install again"
            )
        if self.dry_run:
            return "would be updated"
        update = copy.deepcopy(desired)
        update["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        self.kube.replace_object(update)
        return "updated"

    def ensure_claim(self, desired: dict[str, Any]) -> str:
        """The checkpoint claim: created when missing, else its phase, size and access modes."""
        check_manifest(desired)
        name = desired["metadata"]["name"]
        try:
            existing = self.kube.read_object("PersistentVolumeClaim", name)
        except NotFoundError:
            if self.dry_run:
                return "would be created"
            created = True
            try:
                self.kube.create_object(desired)
            except ClusterError as exc:
                if exc.status != 409:
                    raise
                created = False
            # the create answer is the claim before any provisioner bound it: read it again
            existing = self.kube.read_object("PersistentVolumeClaim", name)
            if created:
                return f"created ({claim_state(existing)})"
        return f"exists ({claim_state(existing)})"

    def _create_priority_class(self, desired: dict[str, Any]) -> dict[str, Any] | None:
        """Create it; ``None`` when created, the existing class when another installer won."""
        name = desired["metadata"]["name"]
        try:
            self.kube.create_priority_class(desired)
            return None
        except ClusterError as exc:
            if exc.status == FORBIDDEN:
                raise LadderMissing([name], str(exc)) from exc
            if exc.status != 409:
                raise
        existing: dict[str, Any] = self.kube.read_priority_class(name)
        return existing

    def ensure_priority_class(self, desired: dict[str, Any]) -> str:
        """One PriorityClass of the ladder: read it, create it only when it is missing.

        Raises:
            LadderMissing: It is missing and the create was forbidden (403).
            ClusterError: Its immutable fields differ, or a needed update was refused.
        """
        name = desired["metadata"]["name"]
        try:
            existing = self.kube.read_priority_class(name)
        except NotFoundError:
            if self.dry_run:
                return "would be created"
            created = self._create_priority_class(desired)
            if created is None:
                return "created"
            existing = created
        for key in IMMUTABLE:
            if str(existing.get(key, "PreemptLowerPriority")) != str(desired[key]):
                raise ClusterError(
                    f"PriorityClass {name} exists with {key}={existing.get(key)!r}, qosflow needs "
                    f"{desired[key]!r}; {key} cannot change in an update: delete the class "
                    f"(`kubectl delete priorityclass {name}`) and install again"
                )
        if covers(existing, desired):
            return "unchanged"
        if self.dry_run:
            return "would be updated"
        update = copy.deepcopy(desired)
        update["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        try:
            self.kube.replace_priority_class(update)
        except ClusterError as exc:
            if exc.status != FORBIDDEN:
                raise
            raise ClusterError(
                f"PriorityClass {name} differs from the ladder (labels or description) and this "
                f"account may not update it ({exc}): apply argo_templates/rbac.yaml, whose "
                f"qosflow-priorityclasses role may update the ladder's classes, or run "
                f"`{INSTALL_LADDER}`",
                status=FORBIDDEN,
            ) from exc
        return "updated"


def claim_state(claim: dict[str, Any]) -> str:
    """``Bound, 10Gi, ReadWriteOnce`` (phase, capacity or request, access modes) of a claim."""
    spec, status = claim.get("spec") or {}, claim.get("status") or {}
    size = (status.get("capacity") or {}).get("storage") or (
        (spec.get("resources") or {}).get("requests") or {}
    ).get("storage", "?")
    modes = ",".join(status.get("accessModes") or spec.get("accessModes") or []) or "?"
    return f"{status.get('phase') or 'Pending'}, {size}, {modes}"
