"""The emulated Kubernetes API subset: nodes, pods (+ resize), PriorityClasses, Workflow CRs...

... and the plain objects and reviews of installs (ConfigMaps, Secrets, PVCs, ServiceAccounts,
RBAC, namespaces, StorageClasses, self reviews, TokenRequest). What qosflow's client and its install touch, with the real status codes and ``Status`` bodies, as
Kubernetes ``kubernetes_version`` answers them (``/version``; before 1.33 there is no
``pods/{name}/resize``, so a resize is a 404). Resize validation lives in
:mod:`qosflow.local.resize`, PriorityClasses in :mod:`qosflow.local.priority_classes`, plain
objects in :mod:`qosflow.local.objects`, reviews and tokens in :mod:`qosflow.local.reviews`; the
Workflow custom resource takes merge or JSON patches only (strategic merge answers 415) and shares
the store with the Argo side. Every patched object is checked for the types the controller reads
before it is stored (a CRD-style 422 for a Workflow, the decoder's 400 for a pod), and numeric
query parameters are checked (400 naming them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from qosflow.local.access import Access
from qosflow.local.clock import Clock, rfc3339
from qosflow.local.errors import LocalClusterError
from qosflow.local.kinds import CLAIM, Kind
from qosflow.local.kube_version import (
    DEFAULT_KUBERNETES_VERSION,
    RESIZE_MINOR,
    kubernetes_minor,
    version_info,
)
from qosflow.local.names import pod_dir
from qosflow.local.namespaces import seed_namespaces
from qosflow.local.node import Nodes
from qosflow.local.objects import OBJECT_KINDS, ObjectApi
from qosflow.local.patch import apply_patch
from qosflow.local.priority_classes import PriorityClassApi
from qosflow.local.query import field_selector, int_param, label_selector, page
from qosflow.local.rbac import seed_bootstrap
from qosflow.local.resize import check_resize
from qosflow.local.reviews import ReviewApi
from qosflow.local.server import Text
from qosflow.local.shapes import POD_PATCH, STORED_WORKFLOW, ShapeError, check
from qosflow.local.status import ApiError, conflict, invalid, not_found
from qosflow.local.storage import StorageClassApi, bind_claim, seed_storage_class
from qosflow.local.store import Obj, Store, snapshot
from qosflow.local.topology import node_document

_POD_FIELDS = frozenset({"metadata.name", "metadata.namespace", "status.phase", "spec.nodeName"})
Query = dict[str, list[str]]
Handler = Callable[..., tuple[int, Any]]


_OPENAPI = {"int64": "integer", "int32": "integer", "bool": "boolean", "string": "string"}


def _q(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _list(kind: str, query: Query, items: list[Obj], store: Store) -> tuple[int, Any]:
    """A Kubernetes list answer with ``limit``/``continue`` paging."""
    int_param(query, "timeoutSeconds")
    shown, more = page(items, query, "limit", "continue")
    meta: Obj = {"resourceVersion": store.resource_version}
    if more:
        meta["continue"] = more
    api = "argoproj.io/v1alpha1" if kind == "WorkflowList" else "v1"
    return 200, {"kind": kind, "apiVersion": api, "metadata": meta, "items": shown}


def _crd_invalid(name: str, exc: ShapeError) -> ApiError:
    """The CRD schema's 422 for a wrongly typed field of a Workflow."""
    field = exc.field.lstrip(".")
    expected = _OPENAPI.get(exc.expected, "array" if exc.expected.startswith("[]") else "object")
    actual = {"number": "integer", "bool": "boolean"}.get(exc.actual, exc.actual)
    return invalid(
        "Workflow",
        name,
        [
            (
                field,
                f'Invalid value: "{actual}": {field} in body must be of type {expected}: "{actual}"',
            )
        ],
        group="argoproj.io",
    )


def _patched_object(patched: Any, kind: str, name: str) -> Obj:
    """A patch result must still be an object (a patch that replaced it answers 422)."""
    if not isinstance(patched, dict):
        raise invalid(kind, name, [("", "Invalid value: the patch must leave an object")])
    return patched


class KubeApi:
    """Route handlers of the Kubernetes API."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        nodes: Nodes,
        wake: Callable[[], None],
        namespace: str,
        *,
        access: Access | None = None,
        kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
    ) -> None:
        self.store = store
        self.clock = clock
        self.nodes = nodes
        self.wake = wake
        self.namespace = namespace
        self.minor = kubernetes_minor(kubernetes_version)
        self.access = access or Access(store, clock, "")
        self.classes = PriorityClassApi(store, clock)
        seed_bootstrap(store, rfc3339(clock.now()))
        seed_storage_class(store, clock)
        seed_namespaces(store, clock.now(), namespace)
        self.objects = ObjectApi(
            store, clock, self.access.rbac, OBJECT_KINDS, after_store=self._after_store
        )
        self.reviews = ReviewApi(store, clock, self.access.rbac, self.access.tokens, self.minor)
        self.storage_classes = StorageClassApi(store)

    def _after_store(self, kind: Kind, doc: Obj) -> None:
        """A stored claim is bound at once (a dynamic provisioner of the default class)."""
        if kind is CLAIM:
            bind_claim(self.store, doc)

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)``; named groups become keyword arguments."""
        ns, name = r"(?P<ns>[^/]+)", r"(?P<name>[^/]+)"
        pods = f"/api/v1/namespaces/{ns}/pods"
        wfs = f"/apis/argoproj.io/v1alpha1/namespaces/{ns}/workflows"
        resize: list[tuple[str, str, Handler]] = [
            ("GET", f"{pods}/{name}/resize", self.get_pod),
            ("PATCH", f"{pods}/{name}/resize", self.resize),
        ]
        return [
            ("GET", r"/version", self.version),
            ("GET", r"/api/v1/nodes", self.list_nodes),
            ("GET", f"/api/v1/nodes/{name}", self.get_node),
            ("GET", r"/api/v1/pods", self.list_pods),
            ("GET", pods, self.list_pods),
            ("GET", f"{pods}/{name}", self.get_pod),
            *(resize if self.minor >= RESIZE_MINOR else []),
            ("GET", f"{pods}/{name}/log", self.pod_log),
            ("PATCH", f"{pods}/{name}", self.patch_pod),
            ("GET", wfs, self.list_workflows),
            ("GET", f"{wfs}/{name}", self.get_workflow),
            ("PATCH", f"{wfs}/{name}", self.patch_workflow),
            *self.classes.routes(),
            *self.objects.routes(),
            *self.storage_classes.routes(),
            *self.reviews.routes(),
        ]

    def version(self, **_: Any) -> tuple[int, Any]:
        """``GET /version``: the configured version."""
        return 200, version_info(self.minor)

    # -- nodes ---------------------------------------------------------------------------------
    def list_nodes(self, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/nodes``: every node with its allocatable resources."""
        version = self.store.resource_version
        return 200, {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": version},
            "items": [node_document(n, version) for n in self.nodes.nodes],
        }

    def get_node(self, name: str, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/nodes/{name}``."""
        node = self.nodes.by_name.get(name)
        if node is None:
            raise not_found("nodes", name)
        return 200, node_document(node, self.store.resource_version)

    # -- pods ----------------------------------------------------------------------------------
    def _pod_or_404(self, ns: str, name: str) -> Obj:
        pod = self.store.get("Pod", ns, name)
        if pod is None:
            raise not_found("pods", name)
        return pod

    def list_pods(self, query: Query, ns: str | None = None, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/[namespaces/{ns}/]pods`` with label and field selectors."""
        match_labels = label_selector(_q(query, "labelSelector"))
        match_fields = field_selector(_q(query, "fieldSelector"), _POD_FIELDS)
        items = [
            snapshot(p) for p in self.store.items("Pod", ns) if match_labels(p) and match_fields(p)
        ]
        return _list("PodList", query, items, self.store)

    def get_pod(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/namespaces/{ns}/pods/{name}`` (and ``/resize``), serialised under the lock."""
        return 200, json.dumps(self._pod_or_404(ns, name), separators=(",", ":")).encode()

    def pod_log(self, ns: str, name: str, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/namespaces/{ns}/pods/{name}/log``: the ``main`` container's output.

        Supports ``container`` (only ``main`` exists), ``tailLines`` and ``limitBytes`` (the
        last bytes), as the kubelet does; a pod whose container never started answers 400.
        """
        pod = self._pod_or_404(ns, name)
        container = _q(query, "container") or "main"
        if container != "main":
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        limits: dict[str, int] = {}
        for field in ("tailLines", "limitBytes", "sinceSeconds"):
            value = int_param(query, field)
            if value is not None:
                limits[field] = value
        try:
            data = (pod_dir(self.store.state_dir, ns, name) / "main.log").read_bytes()
        except (OSError, LocalClusterError):
            phase = pod.get("status", {}).get("phase", "Pending")
            raise ApiError(
                400, f'container "main" in pod "{name}" is waiting to start ({phase})'
            ) from None
        if "tailLines" in limits:
            lines = data.splitlines(keepends=True)
            data = (
                b"".join(lines[len(lines) - limits["tailLines"] :]) if limits["tailLines"] else b""
            )
        if "limitBytes" in limits:
            data = data[: limits["limitBytes"]]
        return 200, Text(data)

    def patch_pod(
        self, ns: str, name: str, body: Any, content_type: str, **_: Any
    ) -> tuple[int, Any]:
        """``PATCH`` a pod: only labels and annotations may change (resources need ``/resize``)."""
        pod = self._pod_or_404(ns, name)
        patched = _patched_object(
            apply_patch(pod, body, content_type, strategic_ok=True), "Pod", name
        )
        check(patched.get("metadata"), POD_PATCH["metadata"], "Pod.metadata")
        if patched.get("spec") != pod["spec"]:
            raise invalid(
                "Pod",
                name,
                [
                    (
                        "spec",
                        "Forbidden: pod updates may not change fields other than "
                        "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                        "`spec.tolerations` (only additions to existing tolerations),"
                        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                    )
                ],
            )
        meta = pod["metadata"]
        for key in ("labels", "annotations"):
            if key in patched.get("metadata", {}):
                meta[key] = patched["metadata"][key]
        self.store.touch(pod)
        return 200, snapshot(pod)

    def resize(self, ns: str, name: str, body: Any, content_type: str, **_: Any) -> tuple[int, Any]:
        """``PATCH .../pods/{name}/resize``: validate, store the desired resources, bump generation."""
        pod = self._pod_or_404(ns, name)
        if isinstance(body, dict):
            check(body, POD_PATCH, "Pod")
        patched = _patched_object(
            apply_patch(pod, body, content_type, strategic_ok=True), "Pod", name
        )
        check(patched, POD_PATCH, "Pod")
        new = (patched.get("spec") or {}).get("containers") or []
        if not all(isinstance(c, dict) for c in new):
            raise invalid("Pod", name, [("spec.containers", "Invalid value: null")])
        old = pod["spec"]["containers"]
        check_resize(name, old, new)
        if [c.get("resources") for c in new] != [c.get("resources") for c in old]:
            pod["spec"]["containers"] = new
            pod["metadata"]["generation"] = int(pod["metadata"].get("generation", 1)) + 1
            self.store.touch(pod)
            self.wake()
        return 200, snapshot(pod)

    # -- workflow custom resources -------------------------------------------------------------
    def _workflow_or_404(self, ns: str, name: str) -> Obj:
        wf = self.store.get("Workflow", ns, name)
        if wf is None:
            raise not_found("workflows", name, group="argoproj.io")
        return wf

    def list_workflows(self, ns: str, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /apis/argoproj.io/v1alpha1/namespaces/{ns}/workflows``."""
        match = label_selector(_q(query, "labelSelector"))
        items = [snapshot(w) for w in self.store.items("Workflow", ns) if match(w)]
        return _list("WorkflowList", query, items, self.store)

    def get_workflow(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``GET`` the Workflow custom resource."""
        return 200, snapshot(self._workflow_or_404(ns, name))

    def patch_workflow(
        self, ns: str, name: str, body: Any, content_type: str, **_: Any
    ) -> tuple[int, Any]:
        """``PATCH`` the Workflow CR (merge or JSON patch; strategic merge answers 415)."""
        wf = self._workflow_or_404(ns, name)
        patched = apply_patch(wf, body, content_type, strategic_ok=False)
        patched = _patched_object(patched, "Workflow", name)
        try:
            check(patched, STORED_WORKFLOW, "")
        except ShapeError as exc:
            raise _crd_invalid(name, exc) from None
        version = (patched.get("metadata") or {}).get("resourceVersion")
        if version and str(version) != wf["metadata"]["resourceVersion"]:
            raise conflict("workflows.argoproj.io", name)
        if not isinstance(patched.get("spec"), dict):
            raise invalid("Workflow", name, [("spec", "Required value")], group="argoproj.io")
        if "status" in patched and not isinstance(patched["status"], dict):
            patched["status"] = {}
        spec_changed = patched["spec"] != wf["spec"]
        for key in ("metadata", "spec", "status"):
            if key in patched:
                wf[key] = patched[key]
        for key in ("name", "namespace", "uid"):
            wf["metadata"][key] = {"name": name, "namespace": ns}.get(key, wf["metadata"].get(key))
        if spec_changed:
            wf["metadata"]["generation"] = int(wf["metadata"].get("generation", 1)) + 1
        self.store.touch(wf)
        self.wake()
        return 200, snapshot(wf)
