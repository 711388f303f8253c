"""CRUD of plain objects (ConfigMaps, Secrets, PVCs, ServiceAccounts, RBAC) with the API server's rules.

One :class:`ObjectApi` serves every :class:`~qosflow.local.kinds.Kind` it is given:

* create (201): the decoder's 400 for mistyped fields, the path's namespace (400 when the body
  names another), ``generateName`` (5 characters of upstream's alphabet), the kind's name rule
  and validation (422), 409 ``AlreadyExists``; ``uid`` and ``creationTimestamp`` are the server's
  and a ``resourceVersion`` in the body is refused as upstream refuses it (500);
* get / list (``labelSelector``, ``fieldSelector``, ``limit``/``continue``; sorted by namespace
  and name, as etcd returns them) and the list of every namespace (``GET /api/v1/configmaps``);
* replace (``PUT``: the body's name must be the URL's, a stale ``resourceVersion`` is 409
  ``Conflict``, the status is the server's; RBAC kinds create on update) and patch (merge,
  strategic merge, JSON patch; an apply patch creates a missing object); an update that changes
  nothing keeps the resourceVersion;
* delete: the ``Status`` with the deleted uid, or the object itself for kinds with finalizers;
  ``preconditions`` are honoured;
* ``dryRun=All`` checks everything and stores nothing.

RBAC kinds also pass the escalation check (:func:`~qosflow.local.rbac_kinds.check_escalation`);
PersistentVolumeClaims are bound by :mod:`qosflow.local.storage` once stored.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.kinds import CLAIM, CONFIG_MAP, SECRET, SERVICE_ACCOUNT, STORAGE_CLASS, Kind
from qosflow.local.namespaces import NAMESPACE, ensure_namespace
from qosflow.local.object_meta import (
    decode_error,
    invalid_error,
    label_problem,
    meta_causes,
    required,
)
from qosflow.local.patch import APPLY, apply_patch
from qosflow.local.query import field_selector, int_param, label_selector, page
from qosflow.local.rbac import Rbac, User
from qosflow.local.rbac_kinds import RBAC_KINDS, check_escalation
from qosflow.local.shapes import ShapeError, check
from qosflow.local.status import ApiError
from qosflow.local.store import Obj, Store, snapshot

Query = dict[str, list[str]]
Handler = Callable[..., tuple[int, Any]]
Validator = Callable[[Any], str | None]
OBJECT_KINDS: tuple[Kind, ...] = (
    CONFIG_MAP,
    SECRET,
    CLAIM,
    SERVICE_ACCOUNT,
    NAMESPACE,
    *RBAC_KINDS,
)
"""The kinds :class:`ObjectApi` serves in the local cluster."""
_STORED = {k.kind: k for k in (*OBJECT_KINDS, STORAGE_CLASS)}
AfterStore = Callable[[Kind, Obj], None]
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation")


def _q(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _dry_run(query: Query) -> bool:
    """``dryRun=All`` (any other value is a 400, as upstream answers)."""
    values = query.get("dryRun") or []
    for value in values:
        if value != "All":
            raise ApiError(400, f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return bool(values)


def gone(kind: Kind, name: str) -> ApiError:
    """404 ``<resource> "<name>" not found`` with upstream's details."""
    details: Obj = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.plural
    return ApiError(404, f'{kind.resource} "{name}" not found', details=details)


def _exists(kind: Kind, name: str) -> ApiError:
    details: Obj = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.plural
    return ApiError(409, f'{kind.resource} "{name}" already exists', details=details)


def _conflict(kind: Kind, name: str, why: str) -> ApiError:
    details: Obj = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.plural
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {kind.resource} "{name}": {why}',
        reason="Conflict",
        details=details,
    )


_META_ORDER = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
)


def _ordered(meta: Obj) -> Obj:
    """Metadata in the order the API server writes it (clients do not care; people do)."""
    first = {k: meta[k] for k in _META_ORDER if k in meta}
    return {**first, **{k: v for k, v in meta.items() if k not in first}}


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


class ObjectApi:
    """Route handlers of plain object kinds (callers hold the store lock).

    Args:
        store: The shared store.
        clock: Source of ``creationTimestamp``.
        rbac: The authorizer (escalation checks of RBAC writes).
        kinds: The kinds served.
        after_store: Called with each created or replaced object once stored (PVC binding).
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        rbac: Rbac,
        kinds: tuple[Kind, ...],
        after_store: AfterStore | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.rbac = rbac
        self.kinds = kinds
        self.after_store = after_store

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)`` of every kind."""
        out: list[tuple[str, str, Handler]] = []
        for kind in self.kinds:
            plural = kind.plural
            scope = f"{kind.base}/namespaces/(?P<ns>[^/]+)" if kind.namespaced else kind.base
            one = f"{scope}/{plural}/(?P<name>[^/]+)"

            def bind(method: Callable[..., tuple[int, Any]], k: Kind = kind) -> Handler:
                return lambda **kw: method(k, **kw)

            out += [
                ("GET", f"{scope}/{plural}", bind(self.list)),
                ("POST", f"{scope}/{plural}", bind(self.create)),
                ("GET", one, bind(self.get)),
                ("PUT", one, bind(self.replace)),
                ("PATCH", one, bind(self.patch)),
            ]
            if kind.deletable:
                out.append(("DELETE", one, bind(self.delete)))
            if kind.namespaced:
                out.append(("GET", f"{kind.base}/{plural}", bind(self.list)))
        return out

    # -- reads ---------------------------------------------------------------------------------
    def _current(self, kind: Kind, ns: str | None, name: str) -> Obj | None:
        return self.store.get(kind.kind, ns or "", name)

    def get(self, kind: Kind, name: str, ns: str | None = None, **_: Any) -> tuple[int, Any]:
        """``GET`` one object."""
        current = self._current(kind, ns, name)
        if current is None:
            raise gone(kind, name)
        return 200, snapshot(current)

    def list(self, kind: Kind, query: Query, ns: str | None = None, **_: Any) -> tuple[int, Any]:
        """``GET`` the list (of one namespace, or of all)."""
        int_param(query, "timeoutSeconds")
        match_labels = label_selector(_q(query, "labelSelector"))
        match_fields = field_selector(_q(query, "fieldSelector"), kind.fields)
        found = [o for o in self.store.items(kind.kind, ns) if match_labels(o) and match_fields(o)]
        found.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        shown, more = page(found, query, "limit", "continue")
        meta: Obj = {"resourceVersion": self.store.resource_version}
        if more:
            meta["continue"] = more
        return 200, {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": meta,
            "items": [snapshot(o) for o in shown],
        }

    # -- writes --------------------------------------------------------------------------------
    def _decode(self, kind: Kind, body: Any) -> Obj:
        """The body as an object of ``kind`` (the decoder's 400 otherwise)."""
        if not isinstance(body, dict):
            raise decode_error(kind.kind, "v1", "the object provided is unrecognized")
        try:
            check(body, kind.shape, kind.kind)
        except ShapeError as exc:
            raise decode_error(kind.kind, "v1", exc.message) from None
        rest = {k: copy.deepcopy(v) for k, v in body.items() if k not in ("kind", "apiVersion")}
        doc: Obj = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {}, **rest}
        if not isinstance(doc["metadata"], dict):
            raise decode_error(kind.kind, "v1", "metadata: the object provided is unrecognized")
        return doc

    def _scope(self, kind: Kind, doc: Obj, ns: str | None, *, create: bool) -> None:
        """Fill the namespace from the URL; a body naming another one is a 400."""
        meta = doc["metadata"]
        if not kind.namespaced:
            meta.pop("namespace", None)
            return
        given = meta.get("namespace")
        if given and given != ns:
            if create:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            raise ApiError(
                400,
                f"the namespace of the object ({given}) does not match the namespace on the URL "
                f"({ns})",
            )
        meta["namespace"] = ns

    def _validate(self, kind: Kind, doc: Obj, old: Obj | None) -> None:
        """Name rule, labels and annotations, then the kind's own rules."""
        name = str(doc["metadata"].get("name") or "")
        problem = kind.name_problem(name)
        causes = [("metadata.name", f'Invalid value: "{name}": {problem}')] if problem else []
        causes += meta_causes(doc["metadata"])
        if causes:
            raise invalid_error(kind.kind, name, causes, group=kind.group)
        kind.prepare(doc, old)

    def create(
        self,
        kind: Kind,
        body: Any,
        query: Query,
        ns: str | None = None,
        user: User | None = None,
        **_: Any,
    ) -> tuple[int, Any]:
        """``POST`` (201)."""
        doc = self._decode(kind, body)
        return self._create(kind, doc, ns, query, user)

    def _create(
        self, kind: Kind, doc: Obj, ns: str | None, query: Query, user: User | None
    ) -> tuple[int, Any]:
        meta = doc["metadata"]
        self._scope(kind, doc, ns, create=True)
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        if not meta.get("name"):
            cause = required("metadata.name", "name or generateName is required")
            raise invalid_error(kind.kind, "", [cause], group=kind.group)
        for key in _SERVER_FIELDS:
            meta.pop(key, None)
        if user is not None:
            check_escalation(self.rbac, user, kind, doc)
        self._validate(kind, doc, None)
        if self._current(kind, ns, meta["name"]) is not None:
            raise _exists(kind, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = ""  # set when stored
        meta["creationTimestamp"] = rfc3339(self.clock.now())
        doc["metadata"] = _ordered(meta)
        if _dry_run(query):
            doc["metadata"].pop("resourceVersion")
            return 201, doc
        if kind.namespaced:
            ensure_namespace(self.store, self.clock.now(), str(ns))
        self.store.put(doc)
        created = snapshot(doc)
        if self.after_store is not None:
            self.after_store(kind, doc)
        return 201, created

    def replace(
        self,
        kind: Kind,
        name: str,
        body: Any,
        query: Query,
        ns: str | None = None,
        user: User | None = None,
        **_: Any,
    ) -> tuple[int, Any]:
        """``PUT``: the whole object (RBAC kinds create a missing one)."""
        doc = self._decode(kind, body)
        given = str(doc["metadata"].get("name") or "")
        if given != name:
            raise ApiError(
                400, f"the name of the object ({given}) does not match the name on the URL ({name})"
            )
        current = self._current(kind, ns, name)
        if current is None:
            if not kind.create_on_update:
                raise gone(kind, name)
            doc["metadata"].pop("resourceVersion", None)
            return self._create(kind, doc, ns, query, user)
        return self._update(kind, current, doc, ns, query, user)

    def patch(
        self,
        kind: Kind,
        name: str,
        body: Any,
        content_type: str,
        query: Query,
        ns: str | None = None,
        user: User | None = None,
        **_: Any,
    ) -> tuple[int, Any]:
        """``PATCH`` (merge, strategic merge, JSON patch, apply)."""
        current = self._current(kind, ns, name)
        is_apply = content_type.split(";")[0].strip().lower() == APPLY
        if is_apply and not _q(query, "fieldManager"):
            raise ApiError(
                400,
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            )
        if current is None:
            if not is_apply:
                raise gone(kind, name)
            doc = self._decode(kind, body)
            doc["metadata"].setdefault("name", name)
            return self._create(kind, doc, ns, query, user)
        patched = apply_patch(current, body, content_type, strategic_ok=True)
        doc = self._decode(kind, patched)
        return self._update(kind, current, doc, ns, query, user)

    def _update(
        self,
        kind: Kind,
        current: Obj,
        doc: Obj,
        ns: str | None,
        query: Query,
        user: User | None,
    ) -> tuple[int, Any]:
        meta, old = doc["metadata"], current["metadata"]
        name = old["name"]
        self._scope(kind, doc, ns, create=False)
        meta["name"] = name
        version = meta.get("resourceVersion")
        if version and str(version) != old["resourceVersion"]:
            raise _conflict(kind, name, STALE)
        uid = meta.get("uid")
        if uid and uid != old.get("uid"):
            why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old.get('uid')}"
            raise _conflict(kind, name, why)
        for key in ("uid", "creationTimestamp", "generation", "resourceVersion"):
            if key in old:
                meta[key] = old[key]
        if kind.has_status:
            doc["status"] = copy.deepcopy(current.get("status"))
        if user is not None:
            check_escalation(self.rbac, user, kind, doc)
        self._validate(kind, doc, current)
        if doc == current or _dry_run(query):
            return 200, snapshot(doc)
        self.store.put(doc)
        result = snapshot(doc)
        if self.after_store is not None:
            self.after_store(kind, doc)
        return 200, result

    def delete(
        self, kind: Kind, name: str, body: Any, query: Query, ns: str | None = None, **_: Any
    ) -> tuple[int, Any]:
        """``DELETE``: the success ``Status``, or the object when it carried finalizers."""
        current = self._current(kind, ns, name)
        if current is None:
            raise gone(kind, name)
        options = body if isinstance(body, dict) else {}
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            why = f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}"
            raise _conflict(kind, name, why)
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            why = (
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}"
            )
            raise _conflict(kind, name, why)
        dry = _dry_run(query) or "All" in (options.get("dryRun") or [])
        if meta.get("finalizers"):
            shown = snapshot(current)
            shown["metadata"]["deletionTimestamp"] = rfc3339(self.clock.now())
            shown["metadata"]["deletionGracePeriodSeconds"] = 0
            if not dry:
                self.store.delete(kind.kind, ns or "", name)
            return 200, shown
        if not dry:
            self.store.delete(kind.kind, ns or "", name)
        details: Obj = {"name": name}
        if kind.group:
            details["group"] = kind.group
        details.update(kind=kind.plural, uid=meta.get("uid"))
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }


def stored_problem(obj: Any, others: Validator) -> str | None:
    """Why a stored object of these kinds cannot be served (``others`` judges other kinds).

    The store's load-time check (:class:`~qosflow.local.store.Store`): names and namespaces are
    the kind's, fields have the types the decoder would give them.
    """
    kind = _STORED.get(str(obj.get("kind"))) if isinstance(obj, dict) else None
    if kind is None:
        return others(obj)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "metadata is not an object"
    name, namespace = str(meta.get("name") or ""), meta.get("namespace", "")
    problem = kind.name_problem(name) if name else "metadata.name: Required value"
    if problem is None and kind.namespaced:
        problem = label_problem(str(namespace or ""))
    elif problem is None and namespace:
        problem = "metadata.namespace: must be empty"
    if problem is not None:
        return problem
    try:
        check(obj, kind.shape, kind.kind)
    except ShapeError as exc:
        return exc.message
    return None
