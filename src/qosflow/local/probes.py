"""Container probes as the kubelet runs them: ``tcpSocket``, ``httpGet`` and ``exec``.

A probe's handler comes from the container spec (:func:`probe_action`): the host defaults to the
pod's own address (``status.podIP``), a named port is looked up in the container's ``ports``, and
``timeoutSeconds`` (default 1) bounds it. :func:`network_probe` runs the first two from the host,
as the kubelet does: ``tcpSocket`` passes when a connection opens; ``httpGet`` when the answer's
status is 200-399 (HTTPS without certificate checks, as the kubelet does). ``exec`` runs a
command in the container's own view (the runner knows how: :meth:`PodProcess.probe
<qosflow.local.runner.PodProcess.probe>`) and passes on exit code 0. A ``grpc`` probe (or any
other handler) never passes: the local cluster cannot run it.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
from dataclasses import dataclass
from typing import Any

TCP = "tcpSocket"
HTTP = "httpGet"
EXEC = "exec"
KINDS = (TCP, HTTP, EXEC)


@dataclass(frozen=True, slots=True)
class ProbeAction:
    """One run of a probe's handler.

    Attributes:
        kind: ``tcpSocket``, ``httpGet``, ``exec``, or another handler (never passes).
        host: Address to connect to (the pod's own, unless the probe names one).
        port: Port (0 when it cannot be resolved: the probe fails).
        path: ``httpGet`` path.
        scheme: ``HTTP`` or ``HTTPS``.
        headers: ``httpGet`` headers.
        command: ``exec`` command.
        timeout_s: ``timeoutSeconds``.
    """

    kind: str
    host: str = ""
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    timeout_s: float = 1.0


def _port(value: Any, container: dict[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ``ports`` (0: unknown)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value or "")
    if text.isdigit():
        return int(text)
    for port in container.get("ports") or []:
        if isinstance(port, dict) and port.get("name") == text:
            return int(port.get("containerPort") or 0)
    return 0


def probe_action(probe: dict[str, Any], container: dict[str, Any], pod_ip: str) -> ProbeAction:
    """The handler of ``probe`` (a container's ``readinessProbe``) for a pod at ``pod_ip``."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    kind = next((k for k in KINDS if isinstance(probe.get(k), dict)), "unsupported")
    handler: dict[str, Any] = probe.get(kind) or {}
    if kind == EXEC:
        command = tuple(str(w) for w in handler.get("command") or [])
        return ProbeAction(EXEC, command=command, timeout_s=timeout)
    headers = tuple(
        (str(h.get("name", "")), str(h.get("value", "")))
        for h in handler.get("httpHeaders") or []
        if isinstance(h, dict)
    )
    return ProbeAction(
        kind,
        host=str(handler.get("host") or pod_ip),
        port=_port(handler.get("port"), container),
        path=str(handler.get("path") or "/"),
        scheme=str(handler.get("scheme") or "HTTP").upper(),
        headers=headers,
        timeout_s=timeout,
    )


def _tcp(action: ProbeAction) -> bool:
    with contextlib.suppress(OSError):
        socket.create_connection((action.host, action.port), timeout=action.timeout_s).close()
        return True
    return False


def _http(action: ProbeAction) -> bool:
    connection: http.client.HTTPConnection
    if action.scheme == "HTTPS":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection(
            action.host, action.port, timeout=action.timeout_s, context=context
        )
    else:
        connection = http.client.HTTPConnection(action.host, action.port, timeout=action.timeout_s)
    try:
        connection.request("GET", action.path, headers=dict(action.headers))
        return 200 <= connection.getresponse().status < 400
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def network_probe(action: ProbeAction) -> bool:
    """Run a ``tcpSocket`` or ``httpGet`` handler from the host (other kinds fail)."""
    if action.port <= 0 or not action.host:
        return False
    if action.kind == TCP:
        return _tcp(action)
    if action.kind == HTTP:
        return _http(action)
    return False
