"""Least-privilege RBAC for qosflow on a real cluster.

Two identities, each with only what it uses:

* ``qosflow`` — the controller side (Airflow workers, the CLI). In its namespace: create/get/list/
  watch/patch Argo ``workflows`` (patch is the priority bump), get/create/update the
  ``workflowtemplates`` (``ensure_installed``), get/list ``pods``, get ``pods/log`` (the
  trainer's CPU usage lines, :mod:`qosflow.core.usage`) and patch ``pods/resize`` (in-place
  resize; ``patch pods`` does not grant it). Cluster-wide, read-only: ``nodes`` and ``pods`` (free
  capacity = node allocatable minus pod requests), and get/create/update ``priorityclasses`` (the
  ladder; values are immutable, so there is no delete).
* ``qosflow-executor`` — the service account of the training pods. Argo's executor needs
  create/patch on ``workflowtaskresults`` to report progress (without it progress stays at 0/1).
"""

from __future__ import annotations

from typing import Any

from qosflow.core.cluster import LABEL_MANAGED
from qosflow_argo.manifests import CLIENT_ACCOUNT, EXECUTOR_ACCOUNT, NAMESPACE

_RBAC = "rbac.authorization.k8s.io/v1"


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


def _meta(name: str, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_MANAGED: "true"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _account(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace)}


def _binding(kind: str, name: str, namespace: str, role_kind: str, account: str) -> dict[str, Any]:
    """A (Cluster)RoleBinding of role ``name`` to exactly the ServiceAccount ``account``."""
    return {
        "apiVersion": _RBAC,
        "kind": kind,
        "metadata": _meta(name, namespace if kind == "RoleBinding" else None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def rbac(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """ServiceAccounts, Roles, RoleBindings and the read-only ClusterRole, in apply order."""
    client_role = {
        "apiVersion": _RBAC,
        "kind": "Role",
        "metadata": _meta(CLIENT_ACCOUNT, namespace),
        "rules": [
            _rule("argoproj.io", ["workflows"], ["create", "get", "list", "watch", "patch"]),
            _rule("argoproj.io", ["workflowtemplates"], ["get", "create", "update"]),
            _rule("", ["pods"], ["get", "list"]),
            _rule("", ["pods/log"], ["get"]),
            _rule("", ["pods/resize"], ["patch"]),
        ],
    }
    executor_role = {
        "apiVersion": _RBAC,
        "kind": "Role",
        "metadata": _meta(EXECUTOR_ACCOUNT, namespace),
        "rules": [_rule("argoproj.io", ["workflowtaskresults"], ["create", "patch"])],
    }
    capacity = f"{CLIENT_ACCOUNT}-capacity"
    cluster_role = {
        "apiVersion": _RBAC,
        "kind": "ClusterRole",
        "metadata": _meta(capacity, None),
        "rules": [
            _rule("", ["nodes", "pods"], ["get", "list"]),
            _rule("scheduling.k8s.io", ["priorityclasses"], ["get", "create", "update"]),
        ],
    }
    return [
        _account(CLIENT_ACCOUNT, namespace),
        client_role,
        _binding("RoleBinding", CLIENT_ACCOUNT, namespace, "Role", CLIENT_ACCOUNT),
        _account(EXECUTOR_ACCOUNT, namespace),
        executor_role,
        _binding("RoleBinding", EXECUTOR_ACCOUNT, namespace, "Role", EXECUTOR_ACCOUNT),
        cluster_role,
        _binding("ClusterRoleBinding", capacity, namespace, "ClusterRole", CLIENT_ACCOUNT),
    ]
