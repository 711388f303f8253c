"""The Kubernetes API calls qosflow needs, through the official ``kubernetes`` client.

Works with client 36 (classic) and 37 (pydantic): every call passes ints as ints and asks for the
raw response (``_preload_content=False``), which is parsed as plain JSON here, so no code depends on
either generation's model classes. The ``ApiClient`` is built from a URL + token (+ CA / verify) or
from a kubeconfig; urllib3's own retries are switched off so the :class:`Retrier` owns the budget.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from qosflow.core.errors import ClusterError, NotFoundError
from qosflow_argo.argo_server import redact
from qosflow_argo.retry import TRANSIENT_STATUS, Retrier, TransientError, parse_retry_after

GROUP, VERSION = "argoproj.io", "v1alpha1"


def api_client_from_url(
    url: str, *, token: str | None, verify: bool = True, ca_cert: str | None = None
) -> Any:
    """An ``ApiClient`` for a kube-apiserver URL with a bearer token."""
    cfg = k8s.Configuration()
    cfg.host = url.rstrip("/")
    if token:  # client 36/37 look the prefix up under "BearerToken"; older ones "authorization"
        cfg.api_key = {"BearerToken": token, "authorization": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
    cfg.verify_ssl = bool(verify)
    if ca_cert:
        cfg.ssl_ca_cert = ca_cert
    cfg.retries = 0
    return k8s.ApiClient(configuration=cfg)


def api_client_from_kubeconfig(path: str | None = None, context: str | None = None) -> Any:
    """An ``ApiClient`` from a kubeconfig file (``$KUBECONFIG`` / ``~/.kube/config`` by default)."""
    cfg = k8s.Configuration()
    cfg.retries = 0
    return k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=path, context=context, client_configuration=cfg
    )


def _secret(api_client: Any) -> str | None:
    key = getattr(api_client.configuration, "api_key", None) or {}
    value = key.get("BearerToken") or key.get("authorization")
    return str(value).removeprefix("Bearer ").strip() if value else None


class KubeApi:
    """Pods, nodes, resize, PriorityClasses and the Workflow custom resource of one namespace."""

    def __init__(self, api_client: Any, *, namespace: str, retrier: Retrier | None = None) -> None:
        """Wrap an ``ApiClient``; no request is sent."""
        self.namespace = namespace
        self._retrier = retrier or Retrier()
        self._core = k8s.CoreV1Api(api_client)
        self._scheduling = k8s.SchedulingV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._version = k8s.VersionApi(api_client)
        self._rbac = k8s.RbacAuthorizationV1Api(api_client)
        self._authz = k8s.AuthorizationV1Api(api_client)
        self._api_client = api_client

    def __repr__(self) -> str:
        """No credentials."""
        return (
            f"KubeApi(host={self._api_client.configuration.host!r}, namespace={self.namespace!r})"
        )

    def close(self) -> None:
        """Release the connection pool."""
        self._api_client.close()

    # ------------------------------------------------------------------ transport

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one client method with retries and return its JSON body as a dict."""

        def parse(payload: bytes) -> dict[str, Any]:
            try:
                data = json.loads(payload) if payload else {}
            except ValueError:
                raise TransientError(f"{what}: truncated or non-JSON response") from None
            return data if isinstance(data, dict) else {"items": data}

        return self._retrier.call(what, lambda: parse(self._raw(what, fn, *args, **kwargs)))

    def _raw(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """One attempt of a client method: the raw response body."""
        timeout = float(self._retrier.policy.timeout_s)
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=(timeout, timeout), **kwargs)
            return bytes(resp.data or b"")
        except ApiException as exc:
            raise self._error(what, exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientError(f"{what}: {type(exc).__name__}") from None

    def _error(self, what: str, exc: ApiException) -> Exception:
        status = int(exc.status or 0)
        try:
            message = str(json.loads(exc.body or "{}").get("message") or exc.reason or "")
        except (ValueError, AttributeError):
            message = str(exc.reason or "")
        message = redact(message, _secret(self._api_client))
        if status in TRANSIENT_STATUS or status == 0:
            headers = exc.headers or {}
            retry_after = parse_retry_after(headers.get("Retry-After"), time.time())
            return TransientError(
                f"HTTP {status}: {message}", status=status, retry_after=retry_after
            )
        if status == 404:
            return NotFoundError(f"{what}: {message}", status=404)
        return ClusterError(f"{what}: HTTP {status}: {message}", status=status)

    # ------------------------------------------------------------------ reads

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server."""
        data = self.call("GET /version", self._version.get_code)
        minor = "".join(ch for ch in str(data.get("minor", "0")) if ch.isdigit()) or "0"
        return int(str(data.get("major", "0")).strip("+") or 0), int(minor)

    def get_pod(self, name: str) -> dict[str, Any]:
        """One pod of the namespace."""
        return self.call(f"GET pod {name}", self._core.read_namespaced_pod, name, self.namespace)

    def list_pods(self, label_selector: str = "") -> list[dict[str, Any]]:
        """Pods of the namespace matching a label selector."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        data = self.call("LIST pods", self._core.list_namespaced_pod, self.namespace, **kwargs)
        return list(data.get("items") or [])

    def list_active_pods(self) -> list[dict[str, Any]]:
        """Non-terminal pods of every namespace (they hold node capacity).

        The one cluster-wide pod read qosflow makes: ``list pods`` in all namespaces, granted
        read-only by the ``qosflow-capacity`` ClusterRole (:mod:`qosflow_argo.rbac`).
        """
        data = self.call(
            "LIST pods (all namespaces)",
            self._core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        return list(data.get("items") or [])

    def pod_log(self, name: str, *, container: str = "main", tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of a pod container's log (``pods/log``)."""
        what = f"GET pod {name}/log"
        payload = self._retrier.call(
            what,
            lambda: self._raw(
                what,
                self._core.read_namespaced_pod_log,
                name,
                self.namespace,
                container=container,
                tail_lines=tail_lines,
            ),
        )
        return payload.decode("utf-8", errors="replace")

    def list_nodes(self) -> list[dict[str, Any]]:
        """All nodes."""
        return list(self.call("LIST nodes", self._core.list_node).get("items") or [])

    # ------------------------------------------------------------------ writes

    def resize_pod(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PATCH ``pods/{name}/resize`` (strategic merge: containers merge by name)."""
        return self.call(
            f"PATCH pod {name}/resize",
            self._core.patch_namespaced_pod_resize,
            name,
            self.namespace,
            dict(body),
        )

    def patch_workflow(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch the Workflow custom resource (the Argo Server cannot change its spec)."""
        return self.call(
            f"PATCH workflow {name}",
            self._custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "workflows",
            name,
            dict(body),
        )

    def read_priority_class(self, name: str) -> dict[str, Any]:
        """One PriorityClass (cluster-scoped)."""
        return self.call(f"GET priorityclass {name}", self._scheduling.read_priority_class, name)

    def create_priority_class(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a PriorityClass."""
        name = body["metadata"]["name"]
        return self.call(
            f"POST priorityclass {name}", self._scheduling.create_priority_class, dict(body)
        )

    def replace_priority_class(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a PriorityClass (``value``/``preemptionPolicy`` must not change: 422)."""
        name = body["metadata"]["name"]
        return self.call(
            f"PUT priorityclass {name}", self._scheduling.replace_priority_class, name, dict(body)
        )

    # ------------------------------------------------------------------ install objects

    def _method(self, verb: str, kind: str) -> tuple[Callable[..., Any], bool]:
        """The client method ``<verb>_[namespaced_]<kind>`` and whether the kind is namespaced."""
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
        api = self._rbac if kind in RBAC_KINDS else self._core
        namespaced = kind not in CLUSTER_KINDS
        name = f"{verb}_{'namespaced_' if namespaced else ''}{snake}"
        return getattr(api, name), namespaced

    def read_object(self, kind: str, name: str) -> dict[str, Any]:
        """One object of an install kind (:data:`INSTALL_KINDS`); ``NotFoundError`` when absent."""
        method, namespaced = self._method("read", kind)
        args = (name, self.namespace) if namespaced else (name,)
        return self.call(f"GET {kind} {name}", method, *args)

    def create_object(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object of an install kind (409 when it exists)."""
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        method, namespaced = self._method("create", kind)
        args = (self.namespace, dict(body)) if namespaced else (dict(body),)
        return self.call(f"POST {kind} {name}", method, *args)

    def replace_object(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace an object of an install kind (its ``resourceVersion`` guards the update)."""
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        method, namespaced = self._method("replace", kind)
        args = (name, self.namespace, dict(body)) if namespaced else (name, dict(body))
        return self.call(f"PUT {kind} {name}", method, *args)

    def access_review(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        subresource: str = "",
        name: str = "",
        namespaced: bool = True,
    ) -> dict[str, Any]:
        """A SelfSubjectAccessReview: may this token ``verb`` the resource? (``status.allowed``)."""
        attributes: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
        if namespaced:
            attributes["namespace"] = self.namespace
        if subresource:
            attributes["subresource"] = subresource
        if name:
            attributes["name"] = name
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        what = f"POST selfsubjectaccessreview {verb} {resource}"
        return self.call(what, self._authz.create_self_subject_access_review, body)


RBAC_KINDS = frozenset({"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})
CLUSTER_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding"})
INSTALL_KINDS = RBAC_KINDS | {"ServiceAccount", "PersistentVolumeClaim"}
"""Kinds :meth:`KubeApi.read_object` and friends handle (PriorityClasses have their own calls)."""
