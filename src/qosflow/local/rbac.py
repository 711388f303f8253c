"""RBAC authorization over the stored Roles, ClusterRoles and their bindings, as the API server does.

A request is described by :class:`Attributes` (verb, API group, resource, subresource, namespace,
name; or a non-resource path). :meth:`Rbac.authorize` walks the ClusterRoleBindings, then the
RoleBindings of the request's namespace, and allows the request when one rule of a role bound to
the user matches (``RuleAllows`` of ``k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac``):

* verbs and API groups match exactly or by ``*``;
* resources match exactly (``pods/resize`` for a subresource), by ``*``, or by ``*/resize``;
* ``resourceNames``, when given, must contain the request's name (so ``list`` and ``create``,
  which carry no name, are never allowed by a rule with names);
* non-resource URLs match exactly, by ``*``, or by a prefix ending in ``*``.

Members of ``system:masters`` (the cluster's admin token) are allowed everything before RBAC is
consulted, like the API server's privileged-group authorizer. The reasons are upstream's:
``RBAC: allowed by RoleBinding "qosflow/qosflow" of Role "qosflow" to ServiceAccount
"qosflow/qosflow"``, and a binding to a missing role adds ``RBAC: role.rbac.authorization.k8s.io
"x" not found`` to a denial. The default ClusterRoles every cluster has for authenticated users
(discovery, ``/version``, self reviews) are seeded by :func:`seed_bootstrap`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from qosflow.local.store import Obj, Store

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class User:
    """An authenticated identity.

    Attributes:
        name: User name (``system:serviceaccount:<ns>:<name>`` for a service account).
        groups: Groups the user belongs to.
        uid: UID of the identity (a service account's uid), or ``""``.
    """

    name: str
    groups: tuple[str, ...] = (AUTHENTICATED,)
    uid: str = ""

    @property
    def privileged(self) -> bool:
        """Whether the user is in ``system:masters`` (allowed everything)."""
        return MASTERS in self.groups

    def info(self) -> Obj:
        """``UserInfo`` as the authentication API shows it."""
        info: Obj = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            info["uid"] = self.uid
        return info


def service_account_user(namespace: str, name: str, uid: str = "") -> User:
    """The user of a service account's token, with the groups the API server gives it."""
    return User(
        f"{SA_PREFIX}{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
        uid,
    )


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request asks to do (the API server's ``authorizer.Attributes``).

    Attributes:
        verb: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``, ...
        group: API group (``""`` for the core group).
        resource: Resource (``pods``); empty for a non-resource request.
        subresource: Subresource (``resize``, ``log``, ``token``) or ``""``.
        namespace: Namespace, ``""`` for cluster-scoped requests.
        name: Object name, ``""`` when the request names none (list, create).
        path: The URL path of a non-resource request.
    """

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def resource_request(self) -> bool:
        """Whether this is a request for an API resource (not a path like ``/version``)."""
        return bool(self.resource)

    @property
    def combined(self) -> str:
        """``resource/subresource`` as rules name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of the authorizer: allowed or not, and upstream's reason (may be empty)."""

    allowed: bool
    reason: str = ""


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _resource_matches(rule: Obj, attrs: Attributes) -> bool:
    for resource in _strings(rule.get("resources")):
        if resource in ("*", attrs.combined):
            return True
        if attrs.subresource and resource == f"*/{attrs.subresource}":
            return True
    return False


def _url_matches(rule: Obj, path: str) -> bool:
    for url in _strings(rule.get("nonResourceURLs")):
        if url in ("*", path) or (url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    """Whether one PolicyRule allows the request (upstream's ``RuleAllows``)."""
    verbs = _strings(rule.get("verbs"))
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return _url_matches(rule, attrs.path)
    groups = _strings(rule.get("apiGroups"))
    if "*" not in groups and attrs.group not in groups:
        return False
    names = _strings(rule.get("resourceNames"))
    return _resource_matches(rule, attrs) and (not names or attrs.name in names)


def _applies(subject: Any, user: User, binding_namespace: str) -> bool:
    """Whether a binding's subject is this user (``appliesToUser``)."""
    if not isinstance(subject, dict):
        return False
    kind, name = subject.get("kind"), str(subject.get("name") or "")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = str(subject.get("namespace") or binding_namespace)
        return bool(namespace) and f"{SA_PREFIX}{namespace}:{name}" == user.name
    return False


def _describe_subject(subject: Obj, binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f'ServiceAccount "{subject.get("name")}/{namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


@dataclass(frozen=True, slots=True)
class Grant:
    """The rules one binding gives a user, and how upstream names the grant."""

    source: str
    rules: tuple[Obj, ...]


_URL_KEYS = ("verbs", "nonResourceURLs")
_RULE_KEYS = ("verbs", "apiGroups", "resources", "resourceNames")


class Rbac:
    """The RBAC authorizer over one store (callers hold the store lock)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _role_rules(self, kind: str, namespace: str, name: str) -> list[Obj] | str:
        """The rules of a referenced role, or upstream's error text when it is missing."""
        if kind == "ClusterRole":
            role = self.store.get("ClusterRole", "", name)
            missing = f'clusterrole.rbac.authorization.k8s.io "{name}" not found'
        else:
            role = self.store.get("Role", namespace, name)
            missing = f'role.rbac.authorization.k8s.io "{name}" not found'
        if role is None:
            return missing
        return [r for r in role.get("rules") or [] if isinstance(r, dict)]

    def grants(self, user: User, namespace: str) -> Iterator[Grant | str]:
        """Every grant of ``user`` in ``namespace`` (cluster-wide ones first); errors as text."""
        bindings: list[tuple[Obj, str]] = [(b, "") for b in self.store.items("ClusterRoleBinding")]
        if namespace:
            bindings += [(b, namespace) for b in self.store.items("RoleBinding", namespace)]
        for binding, ns in bindings:
            subject = next(
                (s for s in binding.get("subjects") or [] if _applies(s, user, ns)), None
            )
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            kind, role_name = str(ref.get("kind") or ""), str(ref.get("name") or "")
            rules = self._role_rules(kind, ns, role_name)
            if isinstance(rules, str):
                yield rules
                continue
            name = binding["metadata"]["name"]
            who = _describe_subject(subject, ns)
            source = (
                f'RoleBinding "{name}/{ns}" of {kind} "{role_name}" to {who}'
                if ns
                else f'ClusterRoleBinding "{name}" of {kind} "{role_name}" to {who}'
            )
            yield Grant(source, tuple(rules))

    def authorize(self, user: User, attrs: Attributes) -> Decision:
        """Allow or deny one request, with upstream's reason."""
        if user.privileged:
            return Decision(True)
        errors: list[str] = []
        for grant in self.grants(user, attrs.namespace):
            if isinstance(grant, str):
                errors.append(grant)
                continue
            if any(rule_allows(rule, attrs) for rule in grant.rules):
                return Decision(True, f"RBAC: allowed by {grant.source}")
        if not errors:
            return Decision(False)
        text = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        return Decision(False, f"RBAC: {text}")

    def rules(self, user: User, namespace: str) -> tuple[list[Obj], list[Obj], bool]:
        """``(resource rules, non-resource rules, incomplete)`` of a SelfSubjectRulesReview."""
        if user.privileged:
            everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
            return [everything], [{"verbs": ["*"], "nonResourceURLs": ["*"]}], False
        resource: list[Obj] = []
        other: list[Obj] = []
        incomplete = False
        for grant in self.grants(user, namespace):
            if isinstance(grant, str):
                incomplete = True
                continue
            for rule in grant.rules:
                if rule.get("nonResourceURLs"):
                    other.append({k: list(rule[k]) for k in _URL_KEYS if rule.get(k)})
                else:
                    resource.append(
                        {k: list(rule[k]) for k in _RULE_KEYS if rule.get(k) is not None}
                    )
        return resource, other, incomplete


def forbidden_message(user: User, attrs: Attributes, reason: str = "") -> str:
    """Upstream's 403 text (``responsewriters.Forbidden`` + ``apierrors.NewForbidden``)."""
    if not attrs.resource_request:
        text = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        return f"forbidden: {text}" + (f": {reason}" if reason else "")
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    text = (
        f'User "{user.name}" cannot {attrs.verb} resource "{attrs.combined}" '
        f'in API group "{attrs.group}" {scope}'
    )
    if reason:
        text += f": {reason}"
    resource = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    named = f'{resource} "{attrs.name}"' if attrs.name else resource
    return f"{named} is forbidden: {text}"


def forbidden_details(attrs: Attributes) -> Obj:
    """``Status.details`` of a 403 (empty fields are left out, as Go's ``omitempty`` does)."""
    details: Obj = {}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.group:
        details["group"] = attrs.group
    if attrs.resource:
        details["kind"] = attrs.resource
    return details


_BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
DISCOVERY_URLS = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]
BOOTSTRAP_ROLES: dict[str, list[Obj]] = {
    "cluster-admin": [
        {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
        {"verbs": ["*"], "nonResourceURLs": ["*"]},
    ],
    "system:basic-user": [
        {
            "verbs": ["create"],
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        },
        {
            "verbs": ["create"],
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["selfsubjectreviews"],
        },
    ],
    "system:discovery": [{"verbs": ["get"], "nonResourceURLs": DISCOVERY_URLS}],
    "system:public-info-viewer": [
        {
            "verbs": ["get"],
            "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
        }
    ],
}
BOOTSTRAP_BINDINGS: dict[str, list[str]] = {
    "cluster-admin": [MASTERS],
    "system:basic-user": [AUTHENTICATED],
    "system:discovery": [AUTHENTICATED],
    "system:public-info-viewer": [AUTHENTICATED, "system:unauthenticated"],
}


def _bootstrap_meta(name: str, now: str | None) -> Obj:
    return {
        "name": name,
        "labels": dict(_BOOTSTRAP_LABELS),
        "annotations": dict(_AUTOUPDATE),
        "creationTimestamp": now,
    }


def seed_bootstrap(store: Store, now: str | None) -> None:
    """Create the default ClusterRoles and bindings a new cluster has, when they are missing.

    Like the API server's bootstrap policy: ``cluster-admin`` for ``system:masters``, and for every
    authenticated user discovery, ``/version`` and the self reviews (``system:basic-user``).
    """
    api = f"{RBAC_GROUP}/v1"
    for name, rules in BOOTSTRAP_ROLES.items():
        if store.get("ClusterRole", "", name) is None:
            store.put(
                {
                    "kind": "ClusterRole",
                    "apiVersion": api,
                    "metadata": _bootstrap_meta(name, now),
                    "rules": [dict(r) for r in rules],
                }
            )
    for name, groups in BOOTSTRAP_BINDINGS.items():
        if store.get("ClusterRoleBinding", "", name) is None:
            store.put(
                {
                    "kind": "ClusterRoleBinding",
                    "apiVersion": api,
                    "metadata": _bootstrap_meta(name, now),
                    "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                    "subjects": [
                        {"kind": "Group", "apiGroup": RBAC_GROUP, "name": g} for g in groups
                    ],
                }
            )
