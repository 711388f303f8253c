"""Who may call the listeners, and what: bearer tokens and per-request RBAC for both APIs.

Authentication: the cluster's admin token is a member of ``system:masters`` (allowed everything);
a ServiceAccount token (:mod:`qosflow.local.tokens`) is ``system:serviceaccount:<ns>:<name>``.
Both listeners accept both (the Argo Server in client auth mode passes the caller's Kubernetes
token on).

Authorization, with the one authorizer :class:`~qosflow.local.rbac.Rbac` (the SelfSubjectAccessReview
answers with it too):

* Kubernetes: every request is mapped to attributes as the API server's ``RequestInfoFactory``
  does (:func:`kube_attributes`: ``/api/v1/namespaces/{ns}/pods/{name}/resize`` with ``PATCH`` is
  ``patch`` of ``pods/resize`` in ``""``; a ``GET`` without a name is ``list``, or ``watch`` with
  ``watch=true``; ``/version`` is the non-resource path), checked before the body is read; a denial
  is upstream's 403 ``Status``.
* Argo Server: each route maps to the Kubernetes calls the real server makes with the caller's
  token (:data:`ARGO_CHECKS`: a stop is ``get`` then ``patch`` of ``workflows``, a submit is ``get``
  of the ``workflowtemplates`` it names then ``create`` of ``workflows``...), checked once the body
  is parsed; a denial is ``{"code": 7, "message": ...}`` with the message the real server relays
  (the Kubernetes text, or its own ``Permission denied, you are not allowed to list workflows ...``
  and ``permission denied`` where it asks a SelfSubjectAccessReview first).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from qosflow.local.clock import Clock
from qosflow.local.rbac import (
    MASTERS,
    Attributes,
    Rbac,
    User,
    forbidden_details,
    forbidden_message,
)
from qosflow.local.status import ApiError
from qosflow.local.store import Store
from qosflow.local.tokens import Tokens

ADMIN = User("qosflow-local-admin", (MASTERS, "system:authenticated"))
ARGO = "argoproj.io"
Query = dict[str, list[str]]
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


class Gate(Protocol):
    """What a listener asks about each request."""

    def authenticate(self, header: str) -> User | None:
        """The user of an ``Authorization`` header, or ``None`` (401)."""
        ...

    def before_body(self, user: User, method: str, path: str, query: Query) -> None:
        """Raise a 403 ``ApiError`` for a request refused before its body is read."""
        ...

    def after_body(self, user: User, method: str, path: str, query: Query, body: Any) -> None:
        """Raise a 403 ``ApiError`` for a request refused once its body is parsed."""
        ...


def kube_attributes(method: str, path: str, query: Query) -> Attributes:
    """The authorization attributes of a Kubernetes API request (``RequestInfoFactory``)."""
    verb = _VERBS.get(method, method.lower())
    parts = [p for p in path.split("/") if p]
    resource_request = (parts[:1] == ["api"] and len(parts) >= 3) or (
        parts[:1] == ["apis"] and len(parts) >= 4
    )
    if not resource_request:
        return Attributes(method.lower(), path=path)
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "watch":
        verb, rest = "watch", rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    if not rest:
        return Attributes(method.lower(), path=path)
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        watching = (query.get("watch") or ["false"])[0].lower() in ("true", "1")
        verb = "watch" if watching else "list"
    elif not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, group, resource, subresource, namespace, name)


@dataclass(frozen=True, slots=True)
class Check:
    """One Kubernetes call the Argo Server makes for a request, and how it reports a denial.

    Attributes:
        attrs: The call's attributes.
        style: ``kube`` (it relays the API server's 403 text), ``list`` (its own
            ``Permission denied, you are not allowed to list workflows...``) or ``can_i`` (its
            SelfSubjectAccessReview: ``permission denied``).
    """

    attrs: Attributes
    style: str = "kube"


Checks = Callable[[dict[str, str], Any], list[Check]]


def _wf(verb: str, *, named: bool = True, style: str = "kube") -> Checks:
    def checks(groups: dict[str, str], body: Any) -> list[Check]:
        name = groups.get("name", "") if named else ""
        return [Check(Attributes(verb, ARGO, "workflows", "", groups["ns"], name), style)]

    return checks


def _tmpl(verb: str, *, named: bool = True, style: str = "kube") -> Checks:
    def checks(groups: dict[str, str], body: Any) -> list[Check]:
        name = groups.get("name", "") if named else ""
        return [Check(Attributes(verb, ARGO, "workflowtemplates", "", groups["ns"], name), style)]

    return checks


def _both(*parts: Checks) -> Checks:
    return lambda groups, body: [c for part in parts for c in part(groups, body)]


def _create(groups: dict[str, str], body: Any) -> list[Check]:
    """A create with ``createOptions.dryRun`` is answered without calling Kubernetes."""
    options = (body or {}).get("createOptions") if isinstance(body, dict) else None
    if isinstance(options, dict) and options.get("dryRun"):
        return []
    return _wf("create", named=False)(groups, body)


def _submit(groups: dict[str, str], body: Any) -> list[Check]:
    """A submit reads the named template, then creates the workflow (unless a dry run)."""
    body = body if isinstance(body, dict) else {}
    name = str(body.get("resourceName") or "")
    get = Check(Attributes("get", ARGO, "workflowtemplates", "", groups["ns"], name))
    options = body.get("submitOptions") if isinstance(body.get("submitOptions"), dict) else {}
    if options and options.get("dryRun"):
        return [get]
    return [get, *_wf("create", named=False)(groups, body)]


_NS, _NAME = r"(?P<ns>[^/]+)", r"(?P<name>[^/]+)"
_WFS, _TMPLS = f"/api/v1/workflows/{_NS}", f"/api/v1/workflow-templates/{_NS}"
ARGO_CHECKS: list[tuple[str, str, Checks]] = [
    ("POST", _WFS, _create),
    ("POST", f"{_WFS}/submit", _submit),
    ("POST", f"{_WFS}/lint", lambda groups, body: []),
    ("GET", _WFS, _wf("list", named=False, style="list")),
    ("GET", f"/api/v1/workflow-events/{_NS}", _wf("watch", named=False)),
    ("GET", f"{_WFS}/{_NAME}", _wf("get")),
    ("DELETE", f"{_WFS}/{_NAME}", _both(_wf("get"), _wf("delete"))),
    ("PUT", f"{_WFS}/{_NAME}/stop", _both(_wf("get"), _wf("patch"))),
    ("PUT", f"{_WFS}/{_NAME}/terminate", _both(_wf("get"), _wf("patch"))),
    ("POST", _TMPLS, _tmpl("create", named=False)),
    ("GET", _TMPLS, _tmpl("list", named=False)),
    ("GET", f"{_TMPLS}/{_NAME}", _tmpl("get", style="can_i")),
    ("PUT", f"{_TMPLS}/{_NAME}", _tmpl("update")),
    ("DELETE", f"{_TMPLS}/{_NAME}", _tmpl("delete")),
]
"""Argo Server route → the Kubernetes calls it makes with the caller's token, in order."""
_COMPILED = [(m, re.compile(p), c) for m, p, c in ARGO_CHECKS]


def argo_checks(method: str, path: str, body: Any) -> list[Check]:
    """The checks of one Argo Server request (none for version, info, userinfo, lint)."""
    for route_method, pattern, checks in _COMPILED:
        match = pattern.fullmatch(path)
        if match is not None and route_method == method:
            return checks(match.groupdict(), body)
    return []


def _named_watch(groups: dict[str, str], query: Query) -> list[Check]:
    """A watch filtered to one workflow reads it first (``getWorkflow``)."""
    selector = (query.get("listOptions.fieldSelector") or [""])[0]
    named = re.fullmatch(r"metadata\.name=([^,]+)", selector)
    if named is None:
        return []
    return [Check(Attributes("get", ARGO, "workflows", "", groups["ns"], named.group(1)))]


class Access:
    """Tokens and RBAC of one cluster, and the gates of its two listeners.

    Args:
        store: The shared store (its lock is taken for every decision).
        clock: Token expiry clock.
        admin_token: The cluster's admin token.
    """

    def __init__(self, store: Store, clock: Clock, admin_token: str) -> None:
        self.store = store
        self.rbac = Rbac(store)
        self.tokens = Tokens(store, clock)
        self._admin = admin_token

    def authenticate(self, header: str) -> User | None:
        """The user of ``Authorization: Bearer <token>``, or ``None``."""
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if hmac.compare_digest(token.encode(), self._admin.encode()):
            return ADMIN
        with self.store.lock:
            return self.tokens.user(token)

    def check(self, user: User, attrs: Attributes) -> str | None:
        """``None`` when allowed, else upstream's 403 text for the Kubernetes API."""
        if user.privileged:
            return None
        with self.store.lock:
            decision = self.rbac.authorize(user, attrs)
        return None if decision.allowed else forbidden_message(user, attrs, decision.reason)

    def gate(self, kind: str) -> Gate:
        """The gate of the ``kube`` or ``argo`` listener."""
        return KubeGate(self) if kind == "kube" else ArgoGate(self)


class KubeGate:
    """The Kubernetes API: every request checked before its body is read."""

    def __init__(self, access: Access) -> None:
        self.access = access

    def authenticate(self, header: str) -> User | None:
        """See :meth:`Access.authenticate`."""
        return self.access.authenticate(header)

    def before_body(self, user: User, method: str, path: str, query: Query) -> None:
        """403 ``Status`` when RBAC refuses the request."""
        if user.privileged:
            return
        attrs = kube_attributes(method, path, query)
        message = self.access.check(user, attrs)
        if message is not None:
            raise ApiError(403, message, details=forbidden_details(attrs))

    def after_body(self, user: User, method: str, path: str, query: Query, body: Any) -> None:
        """Nothing more to check."""


class ArgoGate:
    """The Argo Server: the Kubernetes calls of a route checked once its body is parsed."""

    def __init__(self, access: Access) -> None:
        self.access = access

    def authenticate(self, header: str) -> User | None:
        """See :meth:`Access.authenticate`."""
        return self.access.authenticate(header)

    def before_body(self, user: User, method: str, path: str, query: Query) -> None:
        """Nothing is checked before the route's handler would run."""

    def after_body(self, user: User, method: str, path: str, query: Query, body: Any) -> None:
        """403 ``{code: 7}`` with the real server's message when a call would be refused."""
        if user.privileged:
            return
        checks = argo_checks(method, path, body)
        watch = re.fullmatch(r"/api/v1/workflow-events/(?P<ns>[^/]+)", path)
        if watch is not None and method == "GET":
            checks = _named_watch(watch.groupdict(), query) + checks
        for check in checks:
            message = self.access.check(user, check.attrs)
            if message is None:
                continue
            if check.style == "list":
                ns = check.attrs.namespace
                message = (
                    f'Permission denied, you are not allowed to list workflows in namespace "{ns}".'
                    f" Maybe you want to specify a namespace with query parameter `.namespace={ns}`?"
                )
            elif check.style == "can_i":
                message = "permission denied"
            raise ApiError(403, message)
