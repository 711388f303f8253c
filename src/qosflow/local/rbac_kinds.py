"""Roles, ClusterRoles and their bindings as objects: validation, defaults, escalation checks.

Validation follows ``pkg/apis/rbac/validation``: every rule needs verbs; a resource rule needs
API groups and resources; non-resource URLs only in ClusterRoles and never mixed with resources; a
binding's ``roleRef`` (``apiGroup`` defaulted to ``rbac.authorization.k8s.io``) names a Role or a
ClusterRole and never changes; subjects are ServiceAccounts (with a namespace in a
ClusterRoleBinding), Users or Groups. Names are path segments (``system:basic-user`` is fine).

Escalation prevention (``ConfirmNoEscalation``): a user who is not in ``system:masters`` may
write a role only with rules it already holds (or with the ``escalate`` verb on it), and a
binding only to a role whose rules it holds (or with the ``bind`` verb on it); otherwise 403
listing what it lacks, one target per line. A binding to a missing role grants nothing, so it is
allowed.
"""

from __future__ import annotations

from itertools import product

from qosflow.local.kinds import OBJECT_META, Kind
from qosflow.local.object_meta import (
    Cause,
    bad,
    invalid_error,
    path_segment_problem,
    required,
    subdomain_problem,
    unsupported,
)
from qosflow.local.rbac import RBAC_GROUP, Attributes, Rbac, User
from qosflow.local.status import ApiError
from qosflow.local.store import Obj

_LIST = ("list", "string")
RULE = {
    "verbs": _LIST,
    "apiGroups": _LIST,
    "resources": _LIST,
    "resourceNames": _LIST,
    "nonResourceURLs": _LIST,
}
SUBJECT = {"kind": "string", "apiGroup": "string", "name": "string", "namespace": "string"}
ROLE_REF = {"apiGroup": "string", "kind": "string", "name": "string"}


def _rule_causes(rules: list[Obj], namespaced: bool) -> list[Cause]:
    """``ValidatePolicyRule`` for each rule."""
    causes: list[Cause] = []
    for i, rule in enumerate(rules):
        where = f"rules[{i}]"
        if not rule.get("verbs"):
            causes.append(required(f"{where}.verbs", "verbs must contain at least one value"))
        urls = rule.get("nonResourceURLs") or []
        if urls:
            if namespaced:
                text = "namespaced rules cannot apply to non-resource URLs"
                causes.append(bad(f"{where}.nonResourceURLs", urls, text))
            if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                text = "rules cannot apply to both regular resources and non-resource URLs"
                causes.append(bad(f"{where}.nonResourceURLs", urls, text))
            continue
        if not rule.get("apiGroups"):
            text = "resource rules must supply at least one api group"
            causes.append(required(f"{where}.apiGroups", text))
        if not rule.get("resources"):
            text = "resource rules must supply at least one resource"
            causes.append(required(f"{where}.resources", text))
    return causes


def _prepare_role(kind: str, namespaced: bool) -> Kind:
    def prepare(doc: Obj, old: Obj | None) -> None:
        rules = doc.get("rules") or []
        doc["rules"] = rules
        causes = _rule_causes(rules, namespaced)
        aggregation = doc.get("aggregationRule")
        if aggregation is not None and not aggregation.get("clusterRoleSelectors"):
            causes.append(
                required(
                    "aggregationRule.clusterRoleSelectors",
                    "at least one clusterRoleSelector required if aggregationRule is non-nil",
                )
            )
        if causes:
            raise invalid_error(kind, doc["metadata"]["name"], causes, group=RBAC_GROUP)

    shape = {"metadata": OBJECT_META, "rules": ("list", RULE)}
    if not namespaced:
        shape["aggregationRule"] = {
            "clusterRoleSelectors": ("list", {"matchLabels": ("map", "string")})
        }
    return Kind(
        kind,
        "roles" if namespaced else "clusterroles",
        group=RBAC_GROUP,
        namespaced=namespaced,
        shape=shape,
        prepare=prepare,
        name_problem=path_segment_problem,
        create_on_update=True,
    )


def _subject_causes(subject: Obj, where: str, namespaced: bool) -> list[Cause]:
    """``ValidateRoleBindingSubject`` (after the v1 defaults of ``apiGroup``)."""
    kind, name = subject.get("kind"), str(subject.get("name") or "")
    if kind in ("User", "Group") and not subject.get("apiGroup"):
        subject["apiGroup"] = RBAC_GROUP
    causes: list[Cause] = [] if name else [required(f"{where}.name")]
    group = str(subject.get("apiGroup") or "")
    if kind == "ServiceAccount":
        if name and subdomain_problem(name):
            causes.append(bad(f"{where}.name", name, str(subdomain_problem(name))))
        if group:
            causes.append(unsupported(f"{where}.apiGroup", group, [""]))
        if not namespaced and not subject.get("namespace"):
            causes.append(required(f"{where}.namespace"))
    elif kind in ("User", "Group"):
        if group != RBAC_GROUP:
            causes.append(unsupported(f"{where}.apiGroup", group, [RBAC_GROUP]))
    else:
        kinds = ["ServiceAccount", "User", "Group"]
        causes.append(unsupported(f"{where}.kind", kind or "", kinds))
    return causes


def _ref_text(ref: Obj) -> str:
    return (
        f'rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", Kind:"{ref.get("kind", "")}", '
        f'Name:"{ref.get("name", "")}"}}'
    )


def _prepare_binding(kind: str, namespaced: bool) -> Kind:
    role_kinds = ["Role", "ClusterRole"] if namespaced else ["ClusterRole"]

    def prepare(doc: Obj, old: Obj | None) -> None:
        ref = doc["roleRef"] = doc.get("roleRef") or {}
        if not ref.get("apiGroup"):
            ref["apiGroup"] = RBAC_GROUP
        causes: list[Cause] = []
        if ref["apiGroup"] != RBAC_GROUP:
            causes.append(unsupported("roleRef.apiGroup", ref["apiGroup"], [RBAC_GROUP]))
        if ref.get("kind") not in role_kinds:
            causes.append(unsupported("roleRef.kind", ref.get("kind") or "", role_kinds))
        name = str(ref.get("name") or "")
        if not name:
            causes.append(required("roleRef.name"))
        elif path_segment_problem(name):
            causes.append(bad("roleRef.name", name, str(path_segment_problem(name))))
        for i, subject in enumerate(doc.get("subjects") or []):
            causes += _subject_causes(subject, f"subjects[{i}]", namespaced)
        if old is not None and not causes and old.get("roleRef") != ref:
            causes.append(("roleRef", f"Invalid value: {_ref_text(ref)}: cannot change roleRef"))
        if causes:
            raise invalid_error(kind, doc["metadata"]["name"], causes, group=RBAC_GROUP)

    return Kind(
        kind,
        "rolebindings" if namespaced else "clusterrolebindings",
        group=RBAC_GROUP,
        namespaced=namespaced,
        shape={"metadata": OBJECT_META, "roleRef": ROLE_REF, "subjects": ("list", SUBJECT)},
        prepare=prepare,
        name_problem=path_segment_problem,
        create_on_update=True,
    )


ROLE = _prepare_role("Role", namespaced=True)
CLUSTER_ROLE = _prepare_role("ClusterRole", namespaced=False)
ROLE_BINDING = _prepare_binding("RoleBinding", namespaced=True)
CLUSTER_ROLE_BINDING = _prepare_binding("ClusterRoleBinding", namespaced=False)
RBAC_KINDS = (ROLE, CLUSTER_ROLE, ROLE_BINDING, CLUSTER_ROLE_BINDING)


def _rule_text(rule: Obj) -> str:
    """A rule as upstream lists the permissions not held (``rbacv1helpers.CompactString``)."""
    parts = []
    for key, label in (
        ("apiGroups", "APIGroups"),
        ("resources", "Resources"),
        ("nonResourceURLs", "NonResourceURLs"),
        ("resourceNames", "ResourceNames"),
        ("verbs", "Verbs"),
    ):
        if rule.get(key):
            parts.append(f"{label}:[" + " ".join(f'"{v}"' for v in rule[key]) + "]")
    return "{" + ", ".join(parts) + "}"


def _missing_atoms(
    rbac: Rbac, user: User, namespace: str, rule: Obj
) -> dict[tuple[str, ...], list[str]]:
    """``(group, resource, name)`` or ``(url,)`` -> the verbs of ``rule`` the user lacks there."""
    verbs = [str(v) for v in rule.get("verbs") or []]
    missing: dict[tuple[str, ...], list[str]] = {}
    if rule.get("nonResourceURLs"):
        for url, verb in product(rule["nonResourceURLs"], verbs):
            if not rbac.authorize(user, Attributes(verb, path=str(url))).allowed:
                missing.setdefault((str(url),), []).append(verb)
        return missing
    names = [str(n) for n in rule.get("resourceNames") or []] or [""]
    for group, resource, name, verb in product(
        rule.get("apiGroups") or [], rule.get("resources") or [], names, verbs
    ):
        base, _, sub = str(resource).partition("/")
        if not rbac.authorize(
            user, Attributes(verb, str(group), base, sub, namespace, name)
        ).allowed:
            missing.setdefault((str(group), str(resource), name), []).append(verb)
    return missing


def not_held(rbac: Rbac, user: User, namespace: str, rules: list[Obj]) -> list[str]:
    """What of ``rules`` the user does not hold in ``namespace``, one compact line per target."""
    lines = set()
    for rule in rules:
        for target, verbs in _missing_atoms(rbac, user, namespace, rule).items():
            if len(target) == 1:
                missing: Obj = {"nonResourceURLs": [target[0]], "verbs": verbs}
            else:
                missing = {"apiGroups": [target[0]], "resources": [target[1]], "verbs": verbs}
                if target[2]:
                    missing["resourceNames"] = [target[2]]
            lines.add(_rule_text(missing))
    return sorted(lines)


def check_escalation(rbac: Rbac, user: User, kind: Kind, doc: Obj) -> None:
    """403 when ``user`` would grant permissions it does not hold (``escalate``/``bind`` aside)."""
    if user.privileged or kind not in RBAC_KINDS:
        return
    namespace = doc["metadata"].get("namespace", "") if kind.namespaced else ""
    name = doc["metadata"]["name"]
    if kind in (ROLE, CLUSTER_ROLE):
        verb, resource, role_name = "escalate", kind.plural, name
        rules = list(doc.get("rules") or [])
    else:
        ref = doc.get("roleRef") or {}
        role_kind, role_name = str(ref.get("kind")), str(ref.get("name") or "")
        verb, resource = "bind", "roles" if role_kind == "Role" else "clusterroles"
        store_ns = namespace if role_kind == "Role" else ""
        role = rbac.store.get(role_kind, store_ns, role_name)
        rules = list((role or {}).get("rules") or [])
    special = Attributes(verb, RBAC_GROUP, resource, "", namespace, role_name)
    if rbac.authorize(user, special).allowed:
        return
    missing = not_held(rbac, user, namespace, rules)
    if not missing:
        return
    groups = " ".join(f'"{g}"' for g in user.groups)
    held = "\n".join(missing)
    raise ApiError(
        403,
        f'{kind.resource} "{name}" is forbidden: user "{user.name}" (groups=[{groups}]) is '
        f"attempting to grant RBAC permissions not currently held:\n{held}",
        details={"name": name, "group": RBAC_GROUP, "kind": kind.plural},
    )
