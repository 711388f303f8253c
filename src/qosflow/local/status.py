"""Error answers of the emulated servers, in the exact body formats of the real ones.

The Argo Server answers ``{"code": <gRPC code>, "message": "..."}`` (grpc-gateway v1); the
Kubernetes API answers a ``Status`` object. Handlers raise :class:`ApiError` with the HTTP status
and the upstream message; the listener that caught it renders the body its real counterpart sends.
"""

from __future__ import annotations

from typing import Any

from qosflow.local.errors import LocalClusterError

ARGO_VERSION = "v4.1.2"
ARGO_UNAUTHENTICATED = "token not valid. see https://argo-workflows.readthedocs.io/en/latest/faq/"

# HTTP status -> gRPC code, as grpc-gateway v1 maps them back (server/utils/errors.go).
_GRPC_BY_HTTP = {
    400: 3,
    401: 16,
    403: 7,
    404: 5,
    405: 12,
    408: 1,
    409: 6,
    413: 8,
    415: 3,
    422: 3,
    429: 8,
    500: 13,
    501: 12,
    503: 14,
    504: 4,
}
_HTTP_BY_ARGO = {422: 400, 415: 400}  # Kubernetes 422/415 reach Argo clients as InvalidArgument
_REASON_BY_HTTP = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "Timeout",
    409: "AlreadyExists",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    501: "NotImplemented",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(LocalClusterError):
    """An error answer of the emulated Argo Server or Kubernetes API.

    Attributes:
        http: HTTP status code.
        reason: Kubernetes ``Status.reason`` (derived from the status when empty).
        details: Kubernetes ``Status.details`` (``name``, ``kind``, ``causes``), or ``None``.
        retry_after: Seconds for a ``Retry-After`` header, or ``None``.
    """

    def __init__(
        self,
        http: int,
        message: str,
        *,
        reason: str = "",
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=http, retryable=http in (429, 500, 503, 504))
        self.http = http
        self.message = message
        self.reason = reason or _REASON_BY_HTTP.get(http, "InternalError")
        self.details = details
        self.retry_after = retry_after

    def argo_status(self) -> int:
        """The HTTP status the Argo Server would send for this error."""
        return _HTTP_BY_ARGO.get(self.http, self.http)

    def argo_body(self) -> dict[str, Any]:
        """The grpc-gateway error body ``{code, message}``."""
        return {"code": _GRPC_BY_HTTP.get(self.http, 2), "message": self.message}

    def kube_body(self) -> dict[str, Any]:
        """The Kubernetes ``Status`` body."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.http,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(kind: str, name: str, *, group: str = "") -> ApiError:
    """``<kind>[.<group>] "<name>" not found`` (404)."""
    resource = f"{kind}.{group}" if group else kind
    return ApiError(
        404, f'{resource} "{name}" not found', details={"name": name, "group": group, "kind": kind}
    )


def already_exists(kind: str, name: str, *, group: str = "") -> ApiError:
    """``<kind>[.<group>] "<name>" already exists`` (409)."""
    resource = f"{kind}.{group}" if group else kind
    return ApiError(
        409,
        f'{resource} "{name}" already exists',
        details={"name": name, "group": group, "kind": kind},
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]], *, group: str = "") -> ApiError:
    """A Kubernetes 422 ``Invalid`` with ``details.causes`` (``field: message`` pairs)."""
    resource = f"{kind}.{group}" if group else kind
    text = "; ".join(f"{field}: {msg}" for field, msg in causes)
    if len(causes) > 1:
        text = f"[{text}]"
    return ApiError(
        422,
        f'{resource} "{name}" is invalid: {text}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes
            ],
        },
    )


def conflict(resource: str, name: str) -> ApiError:
    """A 409 ``Conflict`` for a stale ``resourceVersion`` (``resource`` like ``pods``)."""
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        reason="Conflict",
        details={"name": name, "kind": resource.split(".")[0]},
    )
