"""Least-privilege RBAC for qosflow on a real cluster.

Two identities, each with only what it uses, every rule naming its resources:

* ``qosflow`` — the controller side (Airflow workers, the CLI).

  - In its namespace (a Role): create/get/list/watch/patch Argo ``workflows`` (patch is the
    priority bump), create ``workflowtemplates`` and get/update the ``qosflow-train`` one by name
    (``ensure_installed``), get/list
    ``pods``, get ``pods/log`` (the trainer's CPU usage lines, :mod:`qosflow.core.usage`), patch
    ``pods/resize`` (in-place resize; ``patch pods`` does not grant it) and get
    ``persistentvolumeclaims`` (``qosflow argo check`` reads the checkpoint claim's state).
  - Cluster-wide, read-only (ClusterRole ``qosflow-capacity``): list ``nodes`` and list ``pods``.
    Free capacity is node allocatable minus the requests of the pods on the node, and pods of
    *every* namespace hold node capacity, so the list cannot be narrower; there is no ``get`` or
    ``watch``, and nothing that writes.
  - PriorityClasses (ClusterRole ``qosflow-priorityclasses``): get/list every class, update only
    the ladder's classes (``resourceNames``). Kubernetes cannot restrict ``create`` by name, so
    creating the ladder is an install step run with the installer's own rights
    (``kubectl apply -f argo_templates/priority-classes.yaml``); at run time
    :meth:`~qosflow_argo.installer.Installer.ensure_priority_class` only reads (and repairs) it.

* ``qosflow-executor`` — the service account of the training pods. Argo's executor needs
  create/patch on ``workflowtaskresults`` to report progress (without it progress stays at 0/1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qosflow.core.cluster import LABEL_MANAGED
from qosflow_argo.manifests import CLIENT_ACCOUNT, EXECUTOR_ACCOUNT, NAMESPACE, TEMPLATE_NAME

_RBAC = "rbac.authorization.k8s.io/v1"
CAPACITY_ROLE = f"{CLIENT_ACCOUNT}-capacity"
PRIORITY_ROLE = f"{CLIENT_ACCOUNT}-priorityclasses"


def _rule(
    group: str, resources: list[str], verbs: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if names is not None:
        rule["resourceNames"] = names
    return rule


def _meta(name: str, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_MANAGED: "true"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _account(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace)}


def _role(kind: str, name: str, namespace: str | None, rules: list[Any]) -> dict[str, Any]:
    return {"apiVersion": _RBAC, "kind": kind, "metadata": _meta(name, namespace), "rules": rules}


def _binding(kind: str, name: str, namespace: str, role_kind: str, account: str) -> dict[str, Any]:
    """A (Cluster)RoleBinding of role ``name`` to exactly the ServiceAccount ``account``."""
    return {
        "apiVersion": _RBAC,
        "kind": kind,
        "metadata": _meta(name, namespace if kind == "RoleBinding" else None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


@dataclass(frozen=True, slots=True)
class Access:
    """One kind of request the client makes (what a SelfSubjectAccessReview asks about).

    Attributes:
        verb: Kubernetes verb (``get``, ``list``, ``patch``...).
        resource: Resource (``pods``, ``workflows``...).
        group: API group (``""`` for the core group).
        subresource: Subresource (``resize``, ``log``), or ``""``.
        name: A resource name the rule is limited to, or ``""``.
        namespaced: Asked in the client's namespace (else cluster-wide).
        why: What the client does with it, for the check's message.
    """

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    name: str = ""
    namespaced: bool = True
    why: str = ""

    def __str__(self) -> str:
        res = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f"{self.group}/" if self.group else ""
        return f"{self.verb} {where}{res}" + (f" {self.name}" if self.name else "")


CLIENT_ACCESS: tuple[Access, ...] = (
    Access("create", "workflows", "argoproj.io", why="submit a segment"),
    Access("get", "workflows", "argoproj.io", why="watch a segment"),
    Access("list", "workflows", "argoproj.io", why="find a job's segments"),
    Access("patch", "workflows", "argoproj.io", why="stop a segment, bump its priority"),
    Access("get", "workflowtemplates", "argoproj.io", name=TEMPLATE_NAME, why="check the template"),
    Access("get", "pods", why="follow a resize"),
    Access("list", "pods", why="find a segment's pod"),
    Access("get", "pods", subresource="log", why="read the trainer's CPU usage"),
    Access("patch", "pods", subresource="resize", why="resize a pod in place"),
    Access("get", "persistentvolumeclaims", why="check the checkpoint claim"),
    Access("list", "nodes", namespaced=False, why="read the capacity"),
    Access("list", "pods", namespaced=False, why="read the capacity (pods of every namespace)"),
    Access("get", "priorityclasses", "scheduling.k8s.io", namespaced=False, why="check the ladder"),
)
"""Every kind of request ``ArgoCluster`` makes at run time (a test checks :func:`rbac` grants
each; ``qosflow argo check`` asks the API server about each)."""


def ladder_names() -> list[str]:
    """The PriorityClass names of the ladder (``qosflow.core.priority.LADDER``)."""
    from qosflow.core.priority import LADDER

    return [k.name for k in LADDER]


def rbac(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """ServiceAccounts, Roles, RoleBindings and the two ClusterRoles, in apply order."""
    client_role = _role(
        "Role",
        CLIENT_ACCOUNT,
        namespace,
        [
            _rule("argoproj.io", ["workflows"], ["create", "get", "list", "watch", "patch"]),
            # create cannot be restricted by name in Kubernetes; get and update can
            _rule("argoproj.io", ["workflowtemplates"], ["create"]),
            _rule("argoproj.io", ["workflowtemplates"], ["get", "update"], [TEMPLATE_NAME]),
            _rule("", ["pods"], ["get", "list"]),
            _rule("", ["pods/log"], ["get"]),
            _rule("", ["pods/resize"], ["patch"]),
            _rule("", ["persistentvolumeclaims"], ["get"]),
        ],
    )
    executor_role = _role(
        "Role",
        EXECUTOR_ACCOUNT,
        namespace,
        [_rule("argoproj.io", ["workflowtaskresults"], ["create", "patch"])],
    )
    capacity_role = _role(
        "ClusterRole",
        CAPACITY_ROLE,
        None,
        [_rule("", ["nodes"], ["list"]), _rule("", ["pods"], ["list"])],
    )
    priority_role = _role(
        "ClusterRole",
        PRIORITY_ROLE,
        None,
        [
            _rule("scheduling.k8s.io", ["priorityclasses"], ["get", "list"]),
            _rule("scheduling.k8s.io", ["priorityclasses"], ["update"], ladder_names()),
        ],
    )
    return [
        _account(CLIENT_ACCOUNT, namespace),
        client_role,
        _binding("RoleBinding", CLIENT_ACCOUNT, namespace, "Role", CLIENT_ACCOUNT),
        _account(EXECUTOR_ACCOUNT, namespace),
        executor_role,
        _binding("RoleBinding", EXECUTOR_ACCOUNT, namespace, "Role", EXECUTOR_ACCOUNT),
        capacity_role,
        _binding("ClusterRoleBinding", CAPACITY_ROLE, namespace, "ClusterRole", CLIENT_ACCOUNT),
        priority_role,
        _binding("ClusterRoleBinding", PRIORITY_ROLE, namespace, "ClusterRole", CLIENT_ACCOUNT),
    ]
