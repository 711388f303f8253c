"""Who am I and what may I do: the self reviews and the TokenRequest API.

* ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``: the caller's permission for one
  request (resource or non-resource attributes), evaluated by the very authorizer that guards
  every request (:class:`~qosflow.local.rbac.Rbac`); 201 with ``status.allowed`` and upstream's
  reason.
* ``POST /apis/authorization.k8s.io/v1/selfsubjectrulesreviews``: the caller's rules in a
  namespace (what ``kubectl auth can-i --list`` shows).
* ``POST /apis/authentication.k8s.io/v1/selfsubjectreviews``: the caller's user info
  (``kubectl auth whoami``).
* ``POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token``: a token of that ServiceAccount
  (404 when it does not exist), valid for ``spec.expirationSeconds`` (default 3600, at least 600).

Before Kubernetes 1.34 these answers carry ``"creationTimestamp": null``, from 1.34 on they omit it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.kinds import SERVICE_ACCOUNT
from qosflow.local.object_meta import Cause, decode_error, invalid_error
from qosflow.local.objects import gone
from qosflow.local.rbac import Attributes, Rbac, User
from qosflow.local.shapes import ShapeError, check
from qosflow.local.status import ApiError
from qosflow.local.store import Obj, Store
from qosflow.local.tokens import (
    API_AUDIENCE,
    DEFAULT_EXPIRATION_S,
    MAX_EXPIRATION_S,
    MIN_EXPIRATION_S,
    Tokens,
)

AUTHZ = "authorization.k8s.io"
AUTHN = "authentication.k8s.io"
Handler = Callable[..., tuple[int, Any]]
_ATTRS = {
    "namespace": "string",
    "verb": "string",
    "group": "string",
    "version": "string",
    "resource": "string",
    "subresource": "string",
    "name": "string",
}
SSAR_SHAPE = {
    "spec": {
        "resourceAttributes": _ATTRS,
        "nonResourceAttributes": {"path": "string", "verb": "string"},
    }
}
TOKEN_SHAPE = {"spec": {"audiences": ("list", "string"), "expirationSeconds": "int"}}


def _body(kind: str, body: Any, shape: Any) -> Obj:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise decode_error(kind, "v1", "the object provided is unrecognized")
    try:
        check(body, shape, kind)
    except ShapeError as exc:
        raise decode_error(kind, "v1", exc.message) from None
    return body


class ReviewApi:
    """Route handlers of the reviews and of TokenRequest (callers hold the store lock).

    Args:
        store: The shared store.
        clock: Source of token expiries.
        rbac: The authorizer.
        tokens: The token issuer.
        minor: Kubernetes minor version (1.34+ omits a null ``creationTimestamp``).
    """

    def __init__(self, store: Store, clock: Clock, rbac: Rbac, tokens: Tokens, minor: int) -> None:
        self.store = store
        self.clock = clock
        self.rbac = rbac
        self.tokens = tokens
        self.minor = minor

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)``."""
        account = r"/api/v1/namespaces/(?P<ns>[^/]+)/serviceaccounts/(?P<name>[^/]+)"
        return [
            ("POST", f"/apis/{AUTHZ}/v1/selfsubjectaccessreviews", self.access_review),
            ("POST", f"/apis/{AUTHZ}/v1/selfsubjectrulesreviews", self.rules_review),
            ("POST", f"/apis/{AUTHN}/v1/selfsubjectreviews", self.self_review),
            ("POST", f"{account}/token", self.token_request),
        ]

    def _meta(self, **fields: str) -> Obj:
        meta: Obj = dict(fields)
        if self.minor < 34:
            meta["creationTimestamp"] = None
        return meta

    def access_review(self, body: Any, user: User, **_: Any) -> tuple[int, Any]:
        """A SelfSubjectAccessReview (201)."""
        doc = _body("SelfSubjectAccessReview", body, SSAR_SHAPE)
        spec = doc.get("spec") or {}
        resource, other = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        causes: list[Cause] = []
        if resource is not None and other is not None:
            text = "cannot be specified in combination with resourceAttributes"
            causes.append(("spec.nonResourceAttributes", f'Invalid value: "object": {text}'))
        if resource is None and other is None:
            text = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
            causes.append(("spec.resourceAttributes", f'Invalid value: "null": {text}'))
        if causes:
            raise invalid_error("SelfSubjectAccessReview", "", causes, group=AUTHZ)
        if isinstance(resource, dict):
            attrs = Attributes(
                str(resource.get("verb") or ""),
                str(resource.get("group") or ""),
                str(resource.get("resource") or ""),
                str(resource.get("subresource") or ""),
                str(resource.get("namespace") or ""),
                str(resource.get("name") or ""),
            )
        else:
            other = other if isinstance(other, dict) else {}
            attrs = Attributes(str(other.get("verb") or ""), path=str(other.get("path") or ""))
        decision = self.rbac.authorize(user, attrs)
        status: Obj = {"allowed": decision.allowed}
        if decision.reason:
            status["reason"] = decision.reason
        kept = {
            k: v for k, v in spec.items() if k in ("resourceAttributes", "nonResourceAttributes")
        }
        return 201, {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": f"{AUTHZ}/v1",
            "metadata": self._meta(),
            "spec": kept,
            "status": status,
        }

    def rules_review(self, body: Any, user: User, **_: Any) -> tuple[int, Any]:
        """A SelfSubjectRulesReview (201): the caller's rules in ``spec.namespace``."""
        doc = _body("SelfSubjectRulesReview", body, {"spec": {"namespace": "string"}})
        namespace = str((doc.get("spec") or {}).get("namespace") or "")
        resource, other, incomplete = self.rbac.rules(user, namespace)
        return 201, {
            "kind": "SelfSubjectRulesReview",
            "apiVersion": f"{AUTHZ}/v1",
            "metadata": self._meta(),
            "spec": {"namespace": namespace} if namespace else {},
            "status": {
                "resourceRules": resource,
                "nonResourceRules": other,
                "incomplete": incomplete,
            },
        }

    def self_review(self, user: User, **_: Any) -> tuple[int, Any]:
        """A SelfSubjectReview (201): who the caller is."""
        return 201, {
            "kind": "SelfSubjectReview",
            "apiVersion": f"{AUTHN}/v1",
            "metadata": self._meta(),
            "status": {"userInfo": user.info()},
        }

    def token_request(self, ns: str, name: str, body: Any, **_: Any) -> tuple[int, Any]:
        """A TokenRequest for the ServiceAccount ``ns/name`` (201)."""
        doc = _body("TokenRequest", body, TOKEN_SHAPE)
        spec = doc.get("spec") or {}
        seconds = spec.get("expirationSeconds")
        seconds = DEFAULT_EXPIRATION_S if seconds is None else int(seconds)
        causes: list[Cause] = []
        if seconds < MIN_EXPIRATION_S:
            text = "may not specify a duration less than 10 minutes"
            causes.append(("spec.expirationSeconds", f"Invalid value: {seconds}: {text}"))
        elif seconds > MAX_EXPIRATION_S:
            text = "may not specify a duration larger than 2^32 seconds"
            causes.append(("spec.expirationSeconds", f"Invalid value: {seconds}: {text}"))
        account = self.store.get("ServiceAccount", ns, name)
        if account is None:
            raise gone(SERVICE_ACCOUNT, name)
        if causes:
            raise invalid_error("TokenRequest", name, causes, group=AUTHN)
        audiences = [str(a) for a in spec.get("audiences") or []] or [API_AUDIENCE]
        token, expires = self.tokens.issue(ns, account, seconds, audiences)
        if expires is None:  # pragma: no cover - a TokenRequest always expires
            raise ApiError(500, "token without an expiry")
        return 201, {
            "kind": "TokenRequest",
            "apiVersion": f"{AUTHN}/v1",
            "metadata": self._meta(name=name, namespace=ns),
            "spec": {
                "audiences": audiences,
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {"token": token, "expirationTimestamp": rfc3339(expires)},
        }
