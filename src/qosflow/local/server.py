"""HTTP listeners of the emulated servers (stdlib ``ThreadingHTTPServer`` on loopback).

Each listener (``argo`` or ``kube``) checks the bearer token, applies the fault plan, parses the
JSON body, dispatches to a route handler under the store lock, saves the state after writes, and
renders errors in its own format: ``{code, message}`` with ``Grpc-Metadata-Argo-Version`` (but not
on 401) for Argo, a ``Status`` object for Kubernetes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from qosflow.local.faults import FaultPlan, FaultRule
from qosflow.local.status import ARGO_UNAUTHENTICATED, ARGO_VERSION, ApiError
from qosflow.local.store import Store
from qosflow.local.watch import Stream

_LOG = logging.getLogger(__name__)
Handler = Callable[..., tuple[int, Any]]
Route = tuple[str, re.Pattern[str], Handler]


@dataclass(frozen=True, slots=True)
class Text:
    """A plain-text answer (a pod's log), sent as ``text/plain``."""

    data: bytes


def _json_error(exc: Exception, text: str) -> str:
    """A Go-like message for a body that is not JSON."""
    if not text.strip():
        return "unexpected EOF"
    pos = getattr(exc, "pos", 0) or 0
    char = text[pos] if pos < len(text) else ""
    return (
        f"invalid character '{char}' looking for beginning of value" if char else "unexpected EOF"
    )


class _Server(ThreadingHTTPServer):
    """A threading HTTP server with a listen backlog for many concurrent clients."""

    request_queue_size = 128
    daemon_threads = True


class Listener:
    """One emulated API server.

    Args:
        kind: ``"argo"`` or ``"kube"``.
        routes: ``(method, path regex, handler)`` triples.
        store: The shared store (its lock serialises handlers; saved after writes).
        token: The bearer token accepted.
        faults: Optional fault plan.
        port: TCP port on 127.0.0.1 (0 = any free port).
    """

    def __init__(
        self,
        kind: str,
        routes: list[tuple[str, str, Handler]],
        store: Store,
        token: str,
        faults: FaultPlan | None,
        port: int = 0,
    ) -> None:
        self.kind = kind
        self.routes: list[Route] = [(m, re.compile(p), h) for m, p, h in routes]
        self.store = store
        self.token = token
        self.faults = faults
        self.sleep = faults.sleep if faults else time.sleep
        listener = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = (
                True  # headers and body are two writes: avoid the 40 ms ACK wait
            )
            server_version = "qosflow-local"

            def log_message(self, format: str, *args: Any) -> None:
                """Silence per-request logging."""

            def do_GET(self) -> None:
                listener.handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        self.httpd = _Server(("127.0.0.1", port), _Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"qosflow-{kind}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:2746``."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    # -- one request ---------------------------------------------------------------------------
    def handle(self, req: BaseHTTPRequestHandler) -> None:
        """Serve one request (faults, auth, body, route, answer)."""
        split = urlsplit(req.path)
        path, query = split.path.rstrip("/") or "/", parse_qs(split.query, keep_blank_values=True)
        method = req.command
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        rule = self.faults.take(self.kind, method, path) if self.faults else None
        if rule is not None and self._fault_before(req, rule):
            return
        try:
            self._authenticate(req)
            status, body = self._dispatch(method, path, query, raw, req.headers)
        except ApiError as exc:
            self._send_error(req, exc)
            return
        except Exception as exc:  # a bug here must still answer like a server, never drop
            _LOG.exception("%s %s failed", method, path)
            self._send_error(req, ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))
            return
        if rule is not None and rule.action == "drop_after":
            self._drop(req)
            return
        if isinstance(body, Stream):
            self._stream(req, body)
            return
        self._send(req, status, body)

    def _fault_before(self, req: BaseHTTPRequestHandler, rule: FaultRule) -> bool:
        """Apply a fault; True when the request is answered (or dropped) by it."""
        if rule.action == "delay":
            self.sleep(rule.delay_s)
            return False
        if rule.action == "drop":
            self._drop(req)
            return True
        if rule.action == "status":
            messages = {
                429: "the request was rejected by grpc_ratelimit middleware, please retry later.",
                503: "the server is currently unable to handle the request",
            }
            message = messages.get(rule.status, "injected fault: internal error")
            self._send_error(req, ApiError(rule.status, message, retry_after=rule.retry_after))
            return True
        return False

    def _authenticate(self, req: BaseHTTPRequestHandler) -> None:
        """Bearer token check (401 like the real servers)."""
        header = req.headers.get("Authorization") or ""
        if header == f"Bearer {self.token}":
            return
        if self.kind == "argo":
            raise ApiError(401, ARGO_UNAUTHENTICATED)
        raise ApiError(401, "Unauthorized")

    def _dispatch(
        self, method: str, path: str, query: dict[str, list[str]], raw: bytes, headers: Any
    ) -> tuple[int, Any]:
        """Find the route, parse the body, call the handler under the store lock."""
        allowed = False
        for route_method, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            allowed = True
            if route_method != method:
                continue
            ctype = headers.get("Content-Type") or ""
            body = self._parse(raw, ctype)
            with self.store.lock:
                result = handler(
                    body=body,
                    query=query,
                    content_type=ctype,
                    accept=headers.get("Accept") or "",
                    **match.groupdict(),
                )
            if method != "GET":
                self.store.save()
            return result
        if allowed:
            raise ApiError(405, "Method Not Allowed")
        if self.kind == "argo":
            raise ApiError(404, "Not Found")
        raise ApiError(404, "the server could not find the requested resource", details={})

    def _parse(self, raw: bytes, ctype: str) -> Any:
        """The JSON (or apply-patch YAML) body; ``None`` when empty."""
        if not raw:
            return None
        text = raw.decode("utf-8", errors="replace")
        try:
            if "yaml" in ctype:
                return yaml.safe_load(text)
            return json.loads(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ApiError(400, _json_error(exc, text)) from exc

    # -- answers -------------------------------------------------------------------------------
    def _send(
        self,
        req: BaseHTTPRequestHandler,
        status: int,
        body: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        ctype = "text/plain" if isinstance(body, Text) else "application/json"
        if isinstance(body, Text):
            data = body.data
        else:
            data = (
                body
                if isinstance(body, bytes)
                else json.dumps(body, separators=(",", ":")).encode()
            )
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(data)))
        if self.kind == "argo" and status != 401:
            req.send_header("Grpc-Metadata-Argo-Version", ARGO_VERSION)
        for key, value in (headers or {}).items():
            req.send_header(key, value)
        req.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            req.wfile.write(data)

    def _stream(self, req: BaseHTTPRequestHandler, stream: Stream) -> None:
        """Send a chunked stream until it ends or the client goes away."""
        req.send_response(200)
        req.send_header("Content-Type", stream.content_type)
        req.send_header("Transfer-Encoding", "chunked")
        if self.kind == "argo":
            req.send_header("Grpc-Metadata-Argo-Version", ARGO_VERSION)
        req.end_headers()
        req.close_connection = True
        try:
            for chunk in stream.chunks:
                req.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                req.wfile.flush()
            req.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            close = getattr(stream.chunks, "close", None)
            if close is not None:
                close()

    def _send_error(self, req: BaseHTTPRequestHandler, exc: ApiError) -> None:
        headers = {}
        if exc.retry_after is not None:
            headers["Retry-After"] = str(max(0, round(exc.retry_after)))
        if self.kind == "argo":
            self._send(req, exc.argo_status(), exc.argo_body(), headers)
        else:
            self._send(req, exc.http, exc.kube_body(), headers)

    @staticmethod
    def _drop(req: BaseHTTPRequestHandler) -> None:
        """Close the connection without an answer (the client sees a reset / empty reply)."""
        req.close_connection = True
        with contextlib.suppress(OSError):
            req.connection.shutdown(socket.SHUT_RDWR)
