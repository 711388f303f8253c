"""The emulated Argo Server (v4.1.2): workflows and workflow templates over REST.

Handlers take the parsed request and return ``(status, body)``; errors are raised as
:class:`~qosflow.local.status.ApiError` and rendered as ``{code, message}`` by the server. Every
handler runs under the store lock and returns deep copies, never live store objects. A create
checks everything the controller will need (the request's types, the namespace and name as
RFC 1123, and a full plan of the workflow), so nothing it accepts can fail the controller later.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.controller import Controller, workflow_finished
from qosflow.local.names import name_problem, namespace_problem
from qosflow.local.namespaces import ensure_namespace
from qosflow.local.pods import LABEL_WORKFLOW
from qosflow.local.query import apply_fields, field_selector, label_selector, page
from qosflow.local.shapes import CREATE_REQUEST, SUBMIT_REQUEST, TEMPLATE_REQUEST, check
from qosflow.local.status import (
    ARGO_VERSION,
    ApiError,
    already_exists,
    conflict,
    invalid,
    not_found,
)
from qosflow.local.store import Obj, Store, snapshot
from qosflow.local.watch import WatchHub
from qosflow.local.workflow import effective_spec, lint, plan

GROUP = "argoproj.io"
API_VERSION = "argoproj.io/v1alpha1"
_WF_FIELDS = frozenset({"metadata.name", "metadata.namespace", "status.phase"})
Query = dict[str, list[str]]


def _q(query: Query, name: str) -> str | None:
    """First value of a query parameter."""
    values = query.get(name)
    return values[0] if values else None


def _name_and_fill(obj: Obj, kind: str, namespace: str, now: float) -> None:
    """Resolve ``generateName``, check the name, fill the server-side metadata."""
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise ApiError(
            400, "json: cannot unmarshal into Go struct field metadata of type v1.ObjectMeta"
        )
    if not meta.get("name") and meta.get("generateName"):
        alphabet = string.ascii_lowercase + string.digits
        meta["name"] = str(meta["generateName"]) + "".join(
            secrets.choice(alphabet) for _ in range(5)
        )
    name = str(meta.get("name") or "")
    if not name:
        raise invalid(
            kind,
            "",
            [("metadata.name", "Required value: name or generateName is required")],
            group=GROUP,
        )
    causes = [("metadata.name", p) for p in [name_problem(name)] if p]
    causes += [("metadata.namespace", p) for p in [namespace_problem(namespace)] if p]
    if causes:
        raise invalid(kind, name, causes, group=GROUP)
    meta["namespace"] = namespace
    meta["creationTimestamp"] = rfc3339(now)
    meta["generation"] = 1
    for key in ("uid", "resourceVersion", "deletionTimestamp"):
        meta.pop(key, None)


def list_order(wf: Obj) -> tuple[int, str]:
    """Upstream list order: unfinished first (newest first), then newest finished first."""
    status = wf.get("status") or {}
    if not workflow_finished(wf):
        return (0, _invert(wf["metadata"].get("creationTimestamp") or ""))
    return (1, _invert(status.get("finishedAt") or ""))


def _invert(stamp: str) -> str:
    """A string that sorts in the reverse order of ``stamp`` (same length digits)."""
    return "".join(chr(0x10FFFF - ord(c)) for c in stamp)


class ArgoApi:
    """Route handlers of the Argo Server."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        controller: Controller,
        wake: Callable[[], None],
        hub: WatchHub | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.controller = controller
        self.wake = wake
        self.hub = hub or WatchHub(store)

    def routes(self) -> list[tuple[str, str, Callable[..., tuple[int, Any]]]]:
        """``(method, path regex, handler)``; named groups become keyword arguments."""
        ns, name = r"(?P<ns>[^/]+)", r"(?P<name>[^/]+)"
        wf, tmpl = "/api/v1/workflows", "/api/v1/workflow-templates"
        return [
            ("GET", r"/api/v1/version", self.version),
            ("GET", r"/api/v1/info", self.info),
            ("GET", r"/api/v1/userinfo", lambda **_: (200, {})),
            ("POST", f"{wf}/{ns}", self.create),
            ("POST", f"{wf}/{ns}/submit", self.submit),
            ("POST", f"{wf}/{ns}/lint", self.lint),
            ("GET", f"{wf}/{ns}", self.list),
            ("GET", f"/api/v1/workflow-events/{ns}", self.watch),
            ("GET", f"{wf}/{ns}/{name}", self.get),
            ("DELETE", f"{wf}/{ns}/{name}", self.delete),
            ("PUT", f"{wf}/{ns}/{name}/stop", lambda **kw: self.shutdown("Stop", **kw)),
            ("PUT", f"{wf}/{ns}/{name}/terminate", lambda **kw: self.shutdown("Terminate", **kw)),
            ("POST", f"{tmpl}/{ns}", self.create_template),
            ("GET", f"{tmpl}/{ns}", self.list_templates),
            ("GET", f"{tmpl}/{ns}/{name}", self.get_template),
            ("PUT", f"{tmpl}/{ns}/{name}", self.update_template),
            ("DELETE", f"{tmpl}/{ns}/{name}", self.delete_template),
        ]

    # -- identity ------------------------------------------------------------------------------
    def version(self, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/version``."""
        return 200, {
            "version": ARGO_VERSION,
            "buildDate": "2026-08-21T00:00:00Z",
            "gitCommit": "16a52d67daf2f4a8a76fa8bec02a76a46aa46257",
            "gitTag": ARGO_VERSION,
            "gitTreeState": "clean",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def info(self, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/info``."""
        return 200, {}

    # -- workflows -----------------------------------------------------------------------------
    def _workflow_or_404(self, ns: str, name: str) -> Obj:
        wf = self.store.get("Workflow", ns, name)
        if wf is None:
            raise not_found("workflows", name, group=GROUP)
        return wf

    def create(self, ns: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``POST /api/v1/workflows/{ns}`` (WorkflowCreateRequest)."""
        if not isinstance(body, dict) or body.get("workflow") is None:
            raise ApiError(400, "workflow body not specified")
        check(body, CREATE_REQUEST, "WorkflowCreateRequest")
        return self._create(ns, body["workflow"], body)

    def _create(self, ns: str, source: Obj, body: Obj) -> tuple[int, Any]:
        """Validate and store a workflow (or echo it for a dry run)."""
        wf: Obj = {
            "apiVersion": API_VERSION,
            "kind": "Workflow",
            "metadata": snapshot(source.get("metadata") or {}),
            "spec": snapshot(source.get("spec") or {}),
        }
        if not isinstance(wf["spec"], dict):
            raise ApiError(
                400,
                "json: cannot unmarshal into Go struct field Workflow.spec of type v1alpha1.WorkflowSpec",
            )
        dry = "All" in ((body.get("createOptions") or {}).get("dryRun") or [])
        now = self.clock.now()
        _name_and_fill(wf, "Workflow", ns, now)
        plan(wf, effective_spec(wf, self.controller.lookup_template(ns)))
        if dry:
            return 200, wf
        if self.store.get("Workflow", ns, wf["metadata"]["name"]) is not None:
            raise already_exists("workflows", wf["metadata"]["name"], group=GROUP)
        wf["status"] = {"startedAt": None, "finishedAt": None}
        if not body.get("serverDryRun"):
            ensure_namespace(self.store, now, ns)
            self.store.put(wf)
            self.wake()
        return 200, snapshot(wf)

    def submit(self, ns: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``POST /api/v1/workflows/{ns}/submit`` from a WorkflowTemplate."""
        body = body if isinstance(body, dict) else {}
        check(body, SUBMIT_REQUEST, "WorkflowSubmitRequest")
        if body.get("resourceKind") not in ("WorkflowTemplate", "workflowtemplate"):
            raise ApiError(400, f"resourceKind '{body.get('resourceKind')}' is not supported")
        name = str(body.get("resourceName") or "")
        if self.store.get("WorkflowTemplate", ns, name) is None:
            raise not_found("workflowtemplates", name, group=GROUP)
        opts = body.get("submitOptions") or {}
        params = []
        for item in (str(i or "") for i in opts.get("parameters") or []):
            if "=" not in item:
                raise ApiError(500, f"expected parameter of the form: NAME=VALUE. Received: {item}")
            key, value = item.split("=", 1)
            params.append({"name": key, "value": value})
        labels = dict(
            kv.split("=", 1) for kv in str(opts.get("labels") or "").split(",") if "=" in kv
        )
        spec: Obj = {"workflowTemplateRef": {"name": name}, "arguments": {"parameters": params}}
        for key, target in (
            ("entryPoint", "entrypoint"),
            ("priority", "priority"),
            ("podPriorityClassName", "podPriorityClassName"),
            ("serviceAccount", "serviceAccountName"),
        ):
            if opts.get(key) not in (None, ""):
                spec[target] = opts[key]
        meta: Obj = {"labels": {**labels, "workflows.argoproj.io/workflow-template": name}}
        if opts.get("name"):
            meta["name"] = opts["name"]
        else:
            meta["generateName"] = opts.get("generateName") or f"{name}-"
        dry = {"createOptions": {"dryRun": ["All"]}} if opts.get("dryRun") else {}
        return self._create(
            ns, {"metadata": meta, "spec": spec}, {**dry, "serverDryRun": opts.get("serverDryRun")}
        )

    def lint(self, ns: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``POST /api/v1/workflows/{ns}/lint``: validation only."""
        if not isinstance(body, dict) or body.get("workflow") is None:
            raise ApiError(400, "workflow body not specified")
        check(body, CREATE_REQUEST, "WorkflowLintRequest")
        return self._create(ns, body["workflow"], {"createOptions": {"dryRun": ["All"]}})

    def list(self, ns: str, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/workflows/{ns}`` with selectors, limit/continue and ``fields``."""
        match_labels = label_selector(_q(query, "listOptions.labelSelector"))
        match_fields = field_selector(_q(query, "listOptions.fieldSelector"), _WF_FIELDS)
        items = [w for w in self.store.items("Workflow", ns) if match_labels(w) and match_fields(w)]
        items.sort(key=list_order)
        shown, more = page(items, query, "listOptions.limit", "listOptions.continue")
        meta: Obj = {"resourceVersion": self.store.resource_version}
        if more:
            meta["continue"] = more
        result = {"metadata": meta, "items": [snapshot(w) for w in shown] or None}
        return 200, apply_fields(result, _q(query, "fields"))

    def watch(self, ns: str, query: Query, accept: str = "", **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/workflow-events/{ns}``: SSE or NDJSON stream of workflow events."""
        match_labels = label_selector(_q(query, "listOptions.labelSelector"))
        selector = _q(query, "listOptions.fieldSelector") or ""
        match_fields = field_selector(selector, _WF_FIELDS)
        named = re.fullmatch(r"metadata\.name=([^,]+)", selector)
        if named and self.store.get("Workflow", ns, named.group(1)) is None:
            raise not_found("workflows", named.group(1), group=GROUP)
        stream = self.hub.workflows(
            ns,
            lambda wf: match_labels(wf) and match_fields(wf),
            _q(query, "fields"),
            "text/event-stream" in accept,
        )
        return 200, stream

    def get(self, ns: str, name: str, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/workflows/{ns}/{name}`` (``fields`` supported).

        Without ``fields`` the document is serialised under the lock (no deep copy): the hot path
        of status polling.
        """
        wf = self._workflow_or_404(ns, name)
        fields = _q(query, "fields")
        if not fields:
            return 200, json.dumps(wf, separators=(",", ":")).encode()
        return 200, apply_fields(snapshot(wf), fields)

    def delete(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``DELETE /api/v1/workflows/{ns}/{name}``: the workflow and its pods go."""
        self._workflow_or_404(ns, name)
        for pod in list(self.store.items("Pod", ns)):
            if pod["metadata"]["labels"].get(LABEL_WORKFLOW) == name:
                self.controller.nodes.delete(pod)
                self.store.delete("Pod", ns, pod["metadata"]["name"])
        self.store.delete("Workflow", ns, name)
        self.wake()
        return 200, {}

    def shutdown(self, strategy: str, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``PUT .../stop`` and ``.../terminate``: set ``spec.shutdown``."""
        wf = self._workflow_or_404(ns, name)
        if workflow_finished(wf):
            raise ApiError(
                500, f'cannot shutdown a completed workflow: workflow: "{name}", namespace: "{ns}"'
            )
        if wf["spec"].get("shutdown") != strategy:
            wf["spec"]["shutdown"] = strategy
            wf["metadata"]["generation"] = int(wf["metadata"].get("generation", 1)) + 1
            self.store.touch(wf)
        self.wake()
        return 200, snapshot(wf)

    # -- workflow templates --------------------------------------------------------------------
    def _template_or_404(self, ns: str, name: str) -> Obj:
        tmpl = self.store.get("WorkflowTemplate", ns, name)
        if tmpl is None:
            raise not_found("workflowtemplates", name, group=GROUP)
        return tmpl

    @staticmethod
    def _template_doc(body: Any) -> Obj:
        if not isinstance(body, dict) or body.get("template") is None:
            raise ApiError(400, "workflow template was not found in the request body")
        check(body, TEMPLATE_REQUEST, "WorkflowTemplateCreateRequest")
        source = body["template"]
        doc: Obj = {
            "apiVersion": API_VERSION,
            "kind": "WorkflowTemplate",
            "metadata": snapshot(source.get("metadata") or {}),
            "spec": snapshot(source.get("spec") or {}),
        }
        lint(doc["spec"], entrypoint_required=False)
        return doc

    def create_template(self, ns: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``POST /api/v1/workflow-templates/{ns}``."""
        doc = self._template_doc(body)
        _name_and_fill(doc, "WorkflowTemplate", ns, self.clock.now())
        if "All" in (((body or {}).get("createOptions") or {}).get("dryRun") or []):
            return 200, doc
        if self.store.get("WorkflowTemplate", ns, doc["metadata"]["name"]) is not None:
            raise already_exists("workflowtemplates", doc["metadata"]["name"], group=GROUP)
        ensure_namespace(self.store, self.clock.now(), ns)
        self.store.put(doc)
        return 200, snapshot(doc)

    def list_templates(self, ns: str, query: Query, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/workflow-templates/{ns}``."""
        match = label_selector(_q(query, "listOptions.labelSelector"))
        items = [snapshot(t) for t in self.store.items("WorkflowTemplate", ns) if match(t)]
        return 200, {
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": items or None,
        }

    def get_template(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``GET /api/v1/workflow-templates/{ns}/{name}``."""
        return 200, snapshot(self._template_or_404(ns, name))

    def update_template(self, ns: str, name: str, body: Any, **_: Any) -> tuple[int, Any]:
        """``PUT /api/v1/workflow-templates/{ns}/{name}`` (needs the current resourceVersion)."""
        current = self._template_or_404(ns, name)
        doc = self._template_doc(body)
        version = doc["metadata"].get("resourceVersion")
        if not version:
            raise invalid(
                "WorkflowTemplate",
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
                group=GROUP,
            )
        if str(version) != current["metadata"]["resourceVersion"]:
            raise conflict("workflowtemplates.argoproj.io", name)
        meta = current["metadata"]
        doc["metadata"].update(
            {k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp") if k in meta}
        )
        doc["metadata"]["generation"] = int(meta.get("generation", 1)) + (
            doc["spec"] != current["spec"]
        )
        self.store.put(doc)
        return 200, snapshot(doc)

    def delete_template(self, ns: str, name: str, **_: Any) -> tuple[int, Any]:
        """``DELETE /api/v1/workflow-templates/{ns}/{name}``."""
        self._template_or_404(ns, name)
        self.store.delete("WorkflowTemplate", ns, name)
        return 200, {}
