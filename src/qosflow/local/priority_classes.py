"""PriorityClasses of the emulated Kubernetes API (``scheduling.k8s.io/v1``).

CRUD with the API server's rules: ``value`` and ``preemptionPolicy`` are immutable (422
``may not be changed in an update.``), ``system-`` names are reserved (422), a value above 1e9 and
a second ``globalDefault`` are refused by the Priority admission plugin (403). Deleting a class
leaves existing pods alone. The built-in ``system-*`` classes are always present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.names import name_problem
from qosflow.local.patch import apply_patch
from qosflow.local.query import label_selector
from qosflow.local.shapes import PRIORITY_CLASS, check
from qosflow.local.status import ApiError, already_exists, conflict, invalid, not_found
from qosflow.local.store import Obj, Store, snapshot

SCHED = "scheduling.k8s.io"
MAX_USER_PRIORITY = 1_000_000_000
SYSTEM_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
Query = dict[str, list[str]]
Handler = Callable[..., tuple[int, Any]]


def _q(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


class PriorityClassApi:
    """Route handlers of ``/apis/scheduling.k8s.io/v1/priorityclasses``."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        for name, value in SYSTEM_CLASSES.items():
            if store.get("PriorityClass", "", name) is None:
                store.put(self._class_doc({"metadata": {"name": name}, "value": value}))

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)``; named groups become keyword arguments."""
        pcs, name = "/apis/scheduling.k8s.io/v1/priorityclasses", r"(?P<name>[^/]+)"
        return [
            ("GET", pcs, self.list_classes),
            ("POST", pcs, self.create_class),
            ("GET", f"{pcs}/{name}", self.get_class),
            ("PUT", f"{pcs}/{name}", self.replace_class),
            ("PATCH", f"{pcs}/{name}", self.patch_class),
            ("DELETE", f"{pcs}/{name}", self.delete_class),
        ]

    def _class_doc(self, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the object provided is unrecognized")
        check(body, PRIORITY_CLASS, "PriorityClass")
        meta = snapshot(body.get("metadata") or {})
        doc: Obj = {
            "apiVersion": f"{SCHED}/v1",
            "kind": "PriorityClass",
            "metadata": meta,
            "value": body.get("value"),
            "preemptionPolicy": body.get("preemptionPolicy") or "PreemptLowerPriority",
        }
        for key in ("description", "globalDefault"):
            if key in body:
                doc[key] = body[key]
        name = str(meta.get("name") or "")
        causes = []
        if not name:
            causes.append(("metadata.name", "Required value: name or generateName is required"))
        elif name_problem(name):
            causes.append(("metadata.name", str(name_problem(name))))
        if not isinstance(doc["value"], int) or isinstance(doc["value"], bool):
            causes.append(("value", "Required value"))
        if doc["preemptionPolicy"] not in ("PreemptLowerPriority", "Never"):
            causes.append(
                (
                    "preemptionPolicy",
                    f'Unsupported value: "{doc["preemptionPolicy"]}": supported values: "Never", "PreemptLowerPriority"',
                )
            )
        if causes:
            raise invalid("PriorityClass", name, causes, group=SCHED)
        meta.setdefault("creationTimestamp", rfc3339(self.clock.now()))
        meta.setdefault("generation", 1)
        return doc

    def _class_or_404(self, name: str) -> Obj:
        klass = self.store.get("PriorityClass", "", name)
        if klass is None:
            raise not_found("priorityclasses", name, group=SCHED)
        return klass

    def _admit_class(self, doc: Obj) -> None:
        """The Priority admission plugin's rules for user classes."""
        name = doc["metadata"]["name"]
        if name.startswith("system-") and SYSTEM_CLASSES.get(name) != doc["value"]:
            raise invalid(
                "PriorityClass",
                name,
                [
                    (
                        "metadata.name",
                        f"Invalid value: \"{name}\": priority class names with 'system-' prefix are reserved for system use",
                    )
                ],
                group=SCHED,
            )
        if doc["value"] > MAX_USER_PRIORITY and name not in SYSTEM_CLASSES:
            raise ApiError(
                403,
                f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: maximum allowed value of a user defined priority is {MAX_USER_PRIORITY}',
            )
        if doc.get("globalDefault"):
            other = next(
                (
                    c
                    for c in self.store.items("PriorityClass")
                    if c.get("globalDefault") and c["metadata"]["name"] != name
                ),
                None,
            )
            if other is not None:
                raise ApiError(
                    403,
                    f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: PriorityClass {other["metadata"]["name"]} is already marked as default. Only one default can exist',
                )

    def list_classes(self, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /apis/scheduling.k8s.io/v1/priorityclasses``."""
        match = label_selector(_q(query, "labelSelector"))
        items = [snapshot(c) for c in self.store.items("PriorityClass") if match(c)]
        return 200, {
            "kind": "PriorityClassList",
            "apiVersion": f"{SCHED}/v1",
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": items,
        }

    def create_class(self, body: Any, **_: Any) -> tuple[int, Any]:
        """``POST`` a PriorityClass (201)."""
        doc = self._class_doc(body)
        name = doc["metadata"]["name"]
        if self.store.get("PriorityClass", "", name) is not None:
            raise already_exists("priorityclasses", name, group=SCHED)
        self._admit_class(doc)
        self.store.put(doc)
        return 201, snapshot(doc)

    def get_class(self, name: str, **_: Any) -> tuple[int, Any]:
        """``GET`` a PriorityClass."""
        return 200, snapshot(self._class_or_404(name))

    def _update_class(self, current: Obj, doc: Obj) -> tuple[int, Any]:
        name = current["metadata"]["name"]
        version = doc["metadata"].get("resourceVersion")
        if version and str(version) != current["metadata"]["resourceVersion"]:
            raise conflict("priorityclasses.scheduling.k8s.io", name)
        causes = [
            (f, "Forbidden: may not be changed in an update.")
            for f in ("value", "preemptionPolicy")
            if doc[f] != current[f]
        ]
        if causes:
            raise invalid("PriorityClass", name, causes, group=SCHED)
        self._admit_class(doc)
        for key in ("name", "uid", "creationTimestamp", "generation"):
            if key in current["metadata"]:
                doc["metadata"][key] = current["metadata"][key]
        self.store.put(doc)
        return 200, snapshot(doc)

    def replace_class(self, name: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``PUT`` a PriorityClass: ``value`` and ``preemptionPolicy`` are immutable (422)."""
        current = self._class_or_404(name)
        return self._update_class(current, self._class_doc(body))

    def patch_class(self, name: str, body: Any, content_type: str, **_: Any) -> tuple[int, Any]:
        """``PATCH`` a PriorityClass (merge, strategic or JSON patch)."""
        current = self._class_or_404(name)
        patched = apply_patch(current, body, content_type, strategic_ok=True)
        return self._update_class(current, self._class_doc(patched))

    def delete_class(self, name: str, **_: Any) -> tuple[int, Any]:
        """``DELETE`` a PriorityClass (existing pods keep their priority)."""
        klass = self._class_or_404(name)
        if name in SYSTEM_CLASSES:
            raise ApiError(
                403,
                f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: cannot delete a system priority class',
            )
        self.store.delete("PriorityClass", "", name)
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": SCHED,
                "kind": "priorityclasses",
                "uid": klass["metadata"]["uid"],
            },
        }
