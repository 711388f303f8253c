"""The emulated Kubernetes API subset: nodes, pods (+ resize), PriorityClasses, Workflow CRs.

Only what qosflow's client touches, with the real status codes and ``Status`` bodies: pod resize
validation (cpu/memory only, no removal, request <= limit, QoS class fixed), PriorityClass rules
(``value`` / ``preemptionPolicy`` immutable, reserved ``system-`` names, one ``globalDefault``), and
the Workflow custom resource (merge or JSON patch only; strategic merge answers 415).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.node import NODE_NAME, Node
from qosflow.local.patch import apply_patch
from qosflow.local.pods import RESIZABLE, qos_class, quantity
from qosflow.local.query import field_selector, label_selector
from qosflow.local.shapes import POD_PATCH, check
from qosflow.local.status import ApiError, already_exists, invalid, not_found
from qosflow.local.store import Obj, Store, snapshot

SCHED = "scheduling.k8s.io"
MAX_USER_PRIORITY = 1_000_000_000
SYSTEM_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
_POD_FIELDS = frozenset({"metadata.name", "metadata.namespace", "status.phase", "spec.nodeName"})
Query = dict[str, list[str]]
Handler = Callable[..., tuple[int, Any]]


def _q(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _conflict(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        reason="Conflict",
        details={"name": name, "kind": resource.split(".")[0]},
    )


class KubeApi:
    """Route handlers of the Kubernetes API."""

    def __init__(
        self, store: Store, clock: Clock, node: Node, wake: Callable[[], None], namespace: str
    ) -> None:
        self.store = store
        self.clock = clock
        self.node = node
        self.wake = wake
        self.namespace = namespace
        for name, value in SYSTEM_CLASSES.items():
            if store.get("PriorityClass", "", name) is None:
                store.put(self._class_doc({"metadata": {"name": name}, "value": value}))

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)``; named groups become keyword arguments."""
        ns, name = r"(?P<ns>[^/]+)", r"(?P<name>[^/]+)"
        pods, pcs = f"/api/v1/namespaces/{ns}/pods", "/apis/scheduling.k8s.io/v1/priorityclasses"
        wfs = f"/apis/argoproj.io/v1alpha1/namespaces/{ns}/workflows"
        return [
            ("GET", r"/version", self.version),
            ("GET", r"/api/v1/nodes", self.list_nodes),
            ("GET", f"/api/v1/nodes/{name}", self.get_node),
            ("GET", r"/api/v1/pods", self.list_pods),
            ("GET", pods, self.list_pods),
            ("GET", f"{pods}/{name}", self.get_pod),
            ("GET", f"{pods}/{name}/resize", self.get_pod),
            ("PATCH", f"{pods}/{name}/resize", self.resize),
            ("PATCH", f"{pods}/{name}", self.patch_pod),
            ("GET", pcs, self.list_classes),
            ("POST", pcs, self.create_class),
            ("GET", f"{pcs}/{name}", self.get_class),
            ("PUT", f"{pcs}/{name}", self.replace_class),
            ("PATCH", f"{pcs}/{name}", self.patch_class),
            ("DELETE", f"{pcs}/{name}", self.delete_class),
            ("GET", wfs, self.list_workflows),
            ("GET", f"{wfs}/{name}", self.get_workflow),
            ("PATCH", f"{wfs}/{name}", self.patch_workflow),
        ]

    def version(self, **_: Any) -> tuple[int, Any]:
        """``GET /version``."""
        return 200, {
            "major": "1",
            "minor": "35",
            "gitVersion": "v1.35.0-qosflow-local",
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "2026-08-21T00:00:00Z",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    # -- nodes ---------------------------------------------------------------------------------
    def _node_doc(self) -> Obj:
        resources = {
            "cpu": str(self.node.cpus),
            "memory": f"{self.node.memory // 1024}Ki",
            "pods": "110",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "uid": "00000000-0000-4000-8000-000000000001",
                "resourceVersion": self.store.resource_version,
                "labels": {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"},
            },
            "spec": {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": NODE_NAME},
                ],
            },
        }

    def list_nodes(self, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/nodes``: the one node."""
        return 200, {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": [self._node_doc()],
        }

    def get_node(self, name: str, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/nodes/{name}``."""
        if name != NODE_NAME:
            raise not_found("nodes", name)
        return 200, self._node_doc()

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
        return 200, {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": items,
        }

    def get_pod(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/namespaces/{ns}/pods/{name}`` (and ``/resize``), serialised under the lock."""
        return 200, json.dumps(self._pod_or_404(ns, name), separators=(",", ":")).encode()

    def patch_pod(
        self, ns: str, name: str, body: Any, content_type: str, **_: Any
    ) -> tuple[int, Any]:
        """``PATCH`` a pod: only labels and annotations may change (resources need ``/resize``)."""
        pod = self._pod_or_404(ns, name)
        patched = apply_patch(pod, body, content_type, strategic_ok=True)
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
        patched = apply_patch(pod, body, content_type, strategic_ok=True)
        new = (patched.get("spec") or {}).get("containers") or []
        old = pod["spec"]["containers"]
        _check_resize(name, old, new)
        if [c.get("resources") for c in new] != [c.get("resources") for c in old]:
            pod["spec"]["containers"] = new
            pod["metadata"]["generation"] = int(pod["metadata"].get("generation", 1)) + 1
            self.store.touch(pod)
            self.wake()
        return 200, snapshot(pod)

    # -- priority classes ----------------------------------------------------------------------
    def _class_doc(self, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the object provided is unrecognized")
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
            raise _conflict("priorityclasses.scheduling.k8s.io", name)
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
        return 200, {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "WorkflowList",
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": items,
        }

    def get_workflow(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``GET`` the Workflow custom resource."""
        return 200, snapshot(self._workflow_or_404(ns, name))

    def patch_workflow(
        self, ns: str, name: str, body: Any, content_type: str, **_: Any
    ) -> tuple[int, Any]:
        """``PATCH`` the Workflow CR (merge or JSON patch; strategic merge answers 415)."""
        wf = self._workflow_or_404(ns, name)
        patched = apply_patch(wf, body, content_type, strategic_ok=False)
        version = (patched.get("metadata") or {}).get("resourceVersion")
        if version and str(version) != wf["metadata"]["resourceVersion"]:
            raise _conflict("workflows.argoproj.io", name)
        if not isinstance(patched.get("spec"), dict):
            raise invalid("Workflow", name, [("spec", "Required value")], group="argoproj.io")
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


def _resource_causes(index: int, before: Obj, after: Obj) -> list[tuple[str, str]]:
    """Resize rules of one container: cpu/memory only, nothing removed, request <= limit."""
    causes: list[tuple[str, str]] = []
    path = f"spec.containers[{index}].resources"
    res_old, res_new = before.get("resources") or {}, after.get("resources") or {}
    for kind in ("requests", "limits"):
        was, now = res_old.get(kind) or {}, res_new.get(kind) or {}
        for res in sorted(set(was) | set(now)):
            if res not in RESIZABLE and was.get(res) != now.get(res):
                causes.append(
                    (
                        f"{path}.{kind}[{res}]",
                        "Forbidden: only cpu and memory resources are mutable",
                    )
                )
            elif res in was and res not in now:
                causes.append((f"{path}.{kind}", f"Forbidden: resource {kind} cannot be removed"))
    requests, limits = res_new.get("requests") or {}, res_new.get("limits") or {}
    for res in RESIZABLE:
        if res in requests and res in limits and quantity(requests[res]) > quantity(limits[res]):
            causes.append(
                (
                    f"{path}.requests",
                    f'Invalid value: "{requests[res]}": must be less than or equal to {res} limit of {limits[res]}',
                )
            )
    return causes


def _check_resize(pod: str, old: list[Obj], new: list[Obj]) -> None:
    """The API server's validation of a ``/resize`` (422 Invalid with upstream messages)."""

    def rest(containers: list[Obj]) -> list[Obj]:
        return [{k: v for k, v in c.items() if k != "resources"} for c in containers]

    if len(new) != len(old) or rest(new) != rest(old):
        raise invalid(
            "Pod", pod, [("spec", "Forbidden: only cpu and memory resources are mutable")]
        )
    causes = [
        c for i, (b, a) in enumerate(zip(old, new, strict=True)) for c in _resource_causes(i, b, a)
    ]
    if causes:
        raise invalid("Pod", pod, causes)
    before_qos, after_qos = qos_class(old), qos_class(new)
    if before_qos != after_qos:
        raise invalid(
            "Pod",
            pod,
            [
                (
                    "spec",
                    f'Invalid value: "{after_qos}": Pod QOS Class may not change as a result of resizing',
                )
            ],
        )
