"""The Kubernetes API endpoints the client may call, with what each request and response must be.

Every Kubernetes exchange is looked up here by method and path; one that has no entry is an
"unmapped endpoint" error, so a new client call cannot slip through unchecked. The Argo Server side
needs no table of its own: its table is ``swagger.json`` (every operation, with its body, query
and response schemas).

A resource gives the usual REST family (list/create on the collection, get/replace/patch/delete on
an object, list across namespaces for namespaced kinds); subresources and non-resource paths are
listed one by one. Bodies are :class:`Spec` values, turned into validators by ``validate.py``:

* ``k8s``: a definition of the Kubernetes OpenAPI (``io.k8s.api.core.v1.Pod``);
* ``crd``: an Argo kind of ``schema.json`` (the Workflow custom resource);
* ``text``: plain text (pod logs);
* ``partial``: a patch body: the same definition with nothing required;
* DELETE answers the object or a ``Status`` (``either_status``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
DELETE_OPTIONS = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
BUILTIN_PATCHES = frozenset({JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH})
CRD_PATCHES = frozenset({JSON_PATCH, MERGE_PATCH, APPLY_PATCH})  # no strategic merge: 415

# query parameters of the Kubernetes API reference, per kind of operation
_PRETTY = frozenset({"pretty"})
LIST_QUERY = _PRETTY | {
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
}
WRITE_QUERY = _PRETTY | {"dryRun", "fieldManager", "fieldValidation"}
PATCH_QUERY = WRITE_QUERY | {"force"}
DELETE_QUERY = _PRETTY | {
    "dryRun",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "orphanDependents",
    "propagationPolicy",
}
LOG_QUERY = _PRETTY | {
    "container",
    "follow",
    "insecureSkipTLSVerifyBackend",
    "limitBytes",
    "previous",
    "sinceSeconds",
    "sinceTime",
    "stream",
    "tailLines",
    "timestamps",
}


@dataclass(frozen=True, slots=True)
class Spec:
    """What a body must be."""

    family: str  # "k8s" | "crd" | "text"
    name: str = ""
    partial: bool = False
    either_status: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One Kubernetes API operation."""

    method: str
    template: str
    response: Spec
    request: Spec | None = None
    query: frozenset[str] = _PRETTY
    patch_types: frozenset[str] = frozenset()
    watch_item: Spec | None = None
    optional_body: bool = False

    @property
    def name(self) -> str:
        return f"{self.method} {self.template}"

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.template)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(template: str) -> re.Pattern[str]:
    if template not in _PATTERNS:
        regex = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        _PATTERNS[template] = re.compile(f"^{regex}$")
    return _PATTERNS[template]


@dataclass(frozen=True, slots=True)
class Resource:
    """A Kubernetes resource: its path, its object and list definitions."""

    plural: str
    prefix: str  # /api/v1, /apis/<group>/<version>
    kind: str  # definition name, or the Argo kind for family "crd"
    namespaced: bool = True
    family: str = "k8s"

    def endpoints(self) -> list[Endpoint]:
        one, many = Spec(self.family, self.kind), Spec(self.family, self.kind + "List")
        patch = Spec(self.family, self.kind, partial=True)
        patches = CRD_PATCHES if self.family == "crd" else BUILTIN_PATCHES
        scope = f"{self.prefix}/namespaces/{{namespace}}" if self.namespaced else self.prefix
        items, item = f"{scope}/{self.plural}", f"{scope}/{self.plural}/{{name}}"
        out = [
            Endpoint("GET", items, many, query=LIST_QUERY, watch_item=one),
            Endpoint("POST", items, one, request=one, query=WRITE_QUERY),
            Endpoint("GET", item, one),
            Endpoint("PUT", item, one, request=one, query=WRITE_QUERY),
            Endpoint("PATCH", item, one, request=patch, query=PATCH_QUERY, patch_types=patches),
            Endpoint(
                "DELETE",
                item,
                Spec(self.family, self.kind, either_status=True),
                request=Spec("k8s", DELETE_OPTIONS),
                query=DELETE_QUERY,
                optional_body=True,
            ),
        ]
        if self.namespaced:
            every = f"{self.prefix}/{self.plural}"
            out.append(Endpoint("GET", every, many, query=LIST_QUERY, watch_item=one))
        return out


CORE = "io.k8s.api.core.v1."
RBAC = "io.k8s.api.rbac.v1."
RESOURCES = (
    Resource("pods", "/api/v1", CORE + "Pod"),
    Resource("nodes", "/api/v1", CORE + "Node", namespaced=False),
    Resource("namespaces", "/api/v1", CORE + "Namespace", namespaced=False),
    Resource("configmaps", "/api/v1", CORE + "ConfigMap"),
    Resource("secrets", "/api/v1", CORE + "Secret"),
    Resource("persistentvolumeclaims", "/api/v1", CORE + "PersistentVolumeClaim"),
    Resource("serviceaccounts", "/api/v1", CORE + "ServiceAccount"),
    Resource("roles", "/apis/rbac.authorization.k8s.io/v1", RBAC + "Role"),
    Resource("rolebindings", "/apis/rbac.authorization.k8s.io/v1", RBAC + "RoleBinding"),
    Resource("clusterroles", "/apis/rbac.authorization.k8s.io/v1", RBAC + "ClusterRole", False),
    Resource(
        "clusterrolebindings",
        "/apis/rbac.authorization.k8s.io/v1",
        RBAC + "ClusterRoleBinding",
        False,
    ),
    Resource(
        "storageclasses", "/apis/storage.k8s.io/v1", "io.k8s.api.storage.v1.StorageClass", False
    ),
    Resource(
        "priorityclasses",
        "/apis/scheduling.k8s.io/v1",
        "io.k8s.api.scheduling.v1.PriorityClass",
        False,
    ),
    Resource("workflows", "/apis/argoproj.io/v1alpha1", "Workflow", family="crd"),
    Resource("workflowtemplates", "/apis/argoproj.io/v1alpha1", "WorkflowTemplate", family="crd"),
)

_POD = "/api/v1/namespaces/{namespace}/pods/{name}"
_POD_SPEC, _POD_PATCH = Spec("k8s", CORE + "Pod"), Spec("k8s", CORE + "Pod", partial=True)
_TOKEN = Spec("k8s", "io.k8s.api.authentication.v1.TokenRequest")
_SSAR = Spec("k8s", "io.k8s.api.authorization.v1.SelfSubjectAccessReview")
SPECIAL = (
    Endpoint(
        "GET", "/version", Spec("k8s", "io.k8s.apimachinery.pkg.version.Info"), query=frozenset()
    ),
    Endpoint("GET", f"{_POD}/log", Spec("text"), query=LOG_QUERY),
    Endpoint("GET", f"{_POD}/resize", _POD_SPEC),
    Endpoint("PUT", f"{_POD}/resize", _POD_SPEC, request=_POD_SPEC, query=WRITE_QUERY),
    Endpoint(
        "PATCH",
        f"{_POD}/resize",
        _POD_SPEC,
        request=_POD_PATCH,
        query=PATCH_QUERY,
        patch_types=BUILTIN_PATCHES,
    ),
    Endpoint(
        "POST",
        "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        _TOKEN,
        request=_TOKEN,
        query=WRITE_QUERY,
    ),
    Endpoint(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        _SSAR,
        request=_SSAR,
        query=WRITE_QUERY,
    ),
)
TABLE: tuple[Endpoint, ...] = SPECIAL + tuple(e for r in RESOURCES for e in r.endpoints())


def kube_endpoint(method: str, path: str) -> Endpoint | None:
    """The table entry of ``method path`` (path without the base prefix and query), or None."""
    for endpoint in TABLE:
        if endpoint.method == method and endpoint.pattern.match(path):
            return endpoint
    return None


def endpoint_names() -> list[str]:
    """Every ``METHOD template`` of the table (for the report and the docs)."""
    return [e.name for e in TABLE]
