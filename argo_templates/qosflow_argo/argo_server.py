"""A small client of the Argo Server REST API (v4.x) over a ``requests`` Session.

Only what qosflow uses: workflows create/get/list/stop and workflow templates get/create/update.
Errors come back as ``{"code": <gRPC code>, "message": ...}``; 404 becomes
:class:`~qosflow.core.errors.NotFoundError`, other 4xx :class:`~qosflow.core.errors.ClusterError` carrying the
server's message, and 429/5xx, resets and timeouts are retried by the :class:`Retrier`. The bearer
token lives only in the session's headers: it is never logged, never in a repr or an error.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from qosflow.core.errors import ClusterError, NotFoundError
from qosflow_argo.retry import TRANSIENT_STATUS, Retrier, TransientError, parse_retry_after

log = logging.getLogger(__name__)
Permanent = Callable[[int, str], bool]
_TRANSIENT = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``."""
    return text.replace(secret, "***") if secret else text


class ArgoServer:
    """The Argo Server REST API of one namespace.

    Args:
        url: Base URL (``https://argo.example:2746`` or with a ``--base-href`` prefix).
        token: Bearer token (a Kubernetes token in ``--auth-mode=client``), or ``None``.
        namespace: Namespace of every call.
        verify: TLS verification: ``True``, ``False`` or a CA bundle path.
        retrier: Retry policy with its injected clock and sleep.
        session: A ``requests.Session`` to use (tests add hooks to it).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        namespace: str,
        verify: bool | str = True,
        retrier: Retrier | None = None,
        session: requests.Session | None = None,
    ) -> None:
        """Prepare the session; no request is sent."""
        self.url = url.rstrip("/")
        self.namespace = namespace
        self._token = token
        self._retrier = retrier or Retrier()
        self._session = session or requests.Session()
        self._session.verify = verify
        self._session.headers["Accept"] = "application/json"
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:
        """No credentials."""
        return f"ArgoServer(url={self.url!r}, namespace={self.namespace!r})"

    # ------------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        permanent: Permanent | None = None,
    ) -> dict[str, Any]:
        """Send one call with retries and return the JSON body.

        Args:
            method: HTTP method.
            path: Path under the base URL, starting with ``/api/v1``.
            body: JSON body.
            params: Query parameters.
            permanent: ``(status, message) -> bool``; True marks a 5xx as not worth retrying.
        """
        what = f"{method} {path}"
        return self._retrier.call(what, lambda: self._once(method, path, body, params, permanent))

    def _once(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        params: Mapping[str, str] | None,
        permanent: Permanent | None,
    ) -> dict[str, Any]:
        what = f"{method} {path}"
        timeout = self._retrier.policy.timeout_s
        started = time.perf_counter()
        try:
            resp = self._session.request(
                method, self.url + path, json=body, params=params, timeout=(timeout, timeout)
            )
            payload = resp.content
        except requests.exceptions.SSLError:
            raise ClusterError(
                f"{what}: TLS verification failed (pass ca_cert=, or verify=False for a test "
                "server)"
            ) from None
        except _TRANSIENT as exc:
            raise TransientError(f"{what}: {type(exc).__name__}") from None
        except requests.RequestException as exc:  # bad URL, TLS setup, ...: retrying cannot help
            raise ClusterError(f"{what}: {type(exc).__name__}: {exc}") from None
        log.debug(
            "%s -> %d in %.1f ms", what, resp.status_code, 1e3 * (time.perf_counter() - started)
        )
        data = self._decode(what, resp.status_code, payload)
        if resp.status_code < 400:
            return data
        message = redact(str(data.get("message") or resp.reason or ""), self._token)
        status = resp.status_code
        if status in TRANSIENT_STATUS and not (permanent and permanent(status, message)):
            retry_after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
            raise TransientError(
                f"HTTP {status}: {message}", status=status, retry_after=retry_after
            )
        if status == 404:
            raise NotFoundError(f"{what}: {message}", status=status)
        raise ClusterError(f"{what}: HTTP {status}: {message}", status=status)

    def _decode(self, what: str, status: int, payload: bytes) -> dict[str, Any]:
        if not payload:
            return {}
        try:
            data = json.loads(payload)
        except ValueError:
            if status >= 400:
                return {"message": payload[:200].decode("utf-8", "replace")}
            raise TransientError(f"{what}: truncated or non-JSON response") from None
        if not isinstance(data, dict):
            raise ClusterError(f"{what}: expected a JSON object, got {type(data).__name__}")
        return data

    # ------------------------------------------------------------------ workflows

    def _wf(self, name: str = "") -> str:
        return f"/api/v1/workflows/{self.namespace}" + (f"/{name}" if name else "")

    def create_workflow(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """POST a Workflow; 409 (already exists) surfaces as ``ClusterError(status=409)``."""
        return self.request("POST", self._wf(), body={"workflow": manifest})

    def get_workflow(self, name: str) -> dict[str, Any]:
        """GET one Workflow."""
        return self.request("GET", self._wf(name))

    def list_workflows(self, label_selector: str) -> list[dict[str, Any]]:
        """Workflows matching a label selector (the server sends ``items: null`` for none)."""
        data = self.request("GET", self._wf(), params={"listOptions.labelSelector": label_selector})
        return list(data.get("items") or [])

    def stop_workflow(self, name: str, message: str = "") -> dict[str, Any]:
        """PUT stop; a completed workflow answers 500 ``cannot shutdown a completed workflow``."""
        body = {"message": message} if message else {}
        return self.request(
            "PUT",
            self._wf(name) + "/stop",
            body=body,
            permanent=lambda status, text: "completed workflow" in text,
        )

    # ------------------------------------------------------------------ templates

    def _tpl(self, name: str = "") -> str:
        return f"/api/v1/workflow-templates/{self.namespace}" + (f"/{name}" if name else "")

    def get_template(self, name: str) -> dict[str, Any]:
        """GET a WorkflowTemplate."""
        return self.request("GET", self._tpl(name))

    def create_template(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """POST a WorkflowTemplate."""
        return self.request("POST", self._tpl(), body={"template": manifest})

    def update_template(self, name: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """PUT a WorkflowTemplate (``manifest`` carries the current ``resourceVersion``)."""
        return self.request("PUT", self._tpl(name), body={"template": manifest})

    # ------------------------------------------------------------------ server

    def version(self) -> dict[str, Any]:
        """``GET /api/v1/version``: the server's ``{version, gitCommit, platform, ...}``."""
        return self.request("GET", "/api/v1/version")
