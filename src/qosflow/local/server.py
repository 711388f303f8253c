"""HTTP listeners of the emulated servers (stdlib ``ThreadingHTTPServer`` on loopback).

Each listener (``argo`` or ``kube``) checks the body's framing, applies the fault plan, checks the
bearer token (and for the Kubernetes API the caller's RBAC, :mod:`qosflow.local.access`) *before*
reading any body, reads the body (bounded in size and time, see
:mod:`qosflow.local.body`), parses it, dispatches to a route handler under the store lock, saves
the state after writes, and renders errors in its own format: ``{code, message}`` with
``Grpc-Metadata-Argo-Version`` (but not on 401) for Argo, a ``Status`` object for Kubernetes. An
answer sent before the body was read (401, 413, an injected fault) discards a small body to keep the
connection, else closes it gracefully, so the client still reads the answer.
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

from qosflow.local.access import ADMIN, Gate
from qosflow.local.body import (
    DRAIN_BYTES,
    MAX_BODY_BYTES,
    READ_TIMEOUT_S,
    BodyError,
    Framing,
    body_framing,
    parse_body,
    read_body,
)
from qosflow.local.faults import FaultPlan, FaultRule
from qosflow.local.rbac import User
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
        token: The admin bearer token (allowed everything); used when no ``gate`` is given.
        faults: Optional fault plan.
        port: TCP port on 127.0.0.1 (0 = any free port).
        read_timeout_s: Time a request body may take to arrive (408 after it).
        max_body_bytes: Largest request body accepted (413 above it).
        gate: Authentication and authorization (:mod:`qosflow.local.access`): who a token is,
            and whether RBAC lets it make the request (403 otherwise). Handlers get the caller as
            ``user``.
    """

    def __init__(
        self,
        kind: str,
        routes: list[tuple[str, str, Handler]],
        store: Store,
        token: str,
        faults: FaultPlan | None,
        port: int = 0,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_body_bytes: int = MAX_BODY_BYTES,
        gate: Gate | None = None,
    ) -> None:
        self.kind = kind
        self.gate = gate
        self.routes: list[Route] = [(m, re.compile(p), h) for m, p, h in routes]
        self.store = store
        self.token = token
        self.faults = faults
        self.read_timeout_s = read_timeout_s
        self.max_body_bytes = max_body_bytes
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

            def handle_expect_100(self) -> bool:
                """``100 Continue`` is sent only once the token is checked (see ``handle``)."""
                return True

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

    def __repr__(self) -> str:
        return f"Listener(kind={self.kind!r}, url={self.url!r})"  # never the token

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
        """Serve one request (framing, faults, auth, body, route, answer)."""
        split = urlsplit(req.path)
        path, query = split.path.rstrip("/") or "/", parse_qs(split.query, keep_blank_values=True)
        method = req.command
        try:
            framing = body_framing(req.headers, self.max_body_bytes)
        except ApiError as exc:
            self._send_error(req, exc, close=True)
            self._linger(req)
            return
        rule = self.faults.take(self.kind, method, path) if self.faults else None
        if rule is not None and self._fault_before(req, rule, framing):
            if rule.action != "drop":
                self._discard(req, framing)
            return
        unread = not framing.empty
        try:
            user = self._admit(req, method, path, query)
            raw = self._read(req, framing)
            unread = False
            status, body = self._dispatch(method, path, query, raw, req.headers, user)
        except BodyError as exc:  # the body is half read: answer, then close
            self._send_error(req, exc, close=True)
            self._linger(req)
            return
        except ApiError as exc:
            self._send_error(req, exc, close=unread and not self._drainable(req, framing))
            if unread:
                self._discard(req, framing)
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

    def _fault_before(self, req: BaseHTTPRequestHandler, rule: FaultRule, framing: Framing) -> bool:
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
            error = ApiError(rule.status, message, retry_after=rule.retry_after)
            self._send_error(req, error, close=not self._drainable(req, framing))
            return True
        return False

    def _read(self, req: BaseHTTPRequestHandler, framing: Framing) -> bytes:
        """The body (after ``100 Continue`` when the client waits for it)."""
        if framing.empty:
            return b""
        if (req.headers.get("Expect") or "").lower() == "100-continue":
            req.send_response_only(100)
            req.end_headers()
        return read_body(
            req.rfile, req.connection, framing, self.max_body_bytes, self.read_timeout_s
        )

    @staticmethod
    def _drainable(req: BaseHTTPRequestHandler, framing: Framing) -> bool:
        """Whether an unread body is small enough to discard and keep the connection."""
        if framing.empty:
            return True
        if (req.headers.get("Expect") or "").lower() == "100-continue":
            return False
        return framing.length is not None and framing.length <= DRAIN_BYTES

    def _discard(self, req: BaseHTTPRequestHandler, framing: Framing) -> None:
        """After an answer sent before the body was read: discard a small body, else close."""
        if framing.empty or (req.headers.get("Expect") or "").lower() == "100-continue":
            if not framing.empty:
                req.close_connection = True  # the client never sends it: do not wait for it
            return
        if framing.length is not None and framing.length <= DRAIN_BYTES:
            with contextlib.suppress(ApiError, OSError):
                read_body(req.rfile, req.connection, framing, DRAIN_BYTES, self.read_timeout_s)
                return
        self._linger(req)

    def _linger(self, req: BaseHTTPRequestHandler) -> None:
        """Close gracefully: FIN after the answer, then discard what the client still sends.

        Closing with unread data would send a reset, and the client could lose the answer.
        """
        req.close_connection = True
        sock = req.connection
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + min(self.read_timeout_s, 2.0)
            budget = 8 * self.max_body_bytes
            while budget > 0 and (remaining := deadline - time.monotonic()) > 0:
                sock.settimeout(remaining)
                data = req.rfile.read1(2**16)
                if not data:
                    break
                budget -= len(data)

    def _admit(
        self, req: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, list[str]]
    ) -> User:
        """The caller (401 like the real servers), refused (403) when its gate says so."""
        header = req.headers.get("Authorization") or ""
        if self.gate is not None:
            user = self.gate.authenticate(header)
            if user is not None:
                self.gate.before_body(user, method, path, query)
                return user
        elif header == f"Bearer {self.token}":
            return ADMIN
        if self.kind == "argo":
            raise ApiError(401, ARGO_UNAUTHENTICATED)
        raise ApiError(401, "Unauthorized")

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        raw: bytes,
        headers: Any,
        user: User,
    ) -> tuple[int, Any]:
        """Find the route, parse the body, check the caller, call the handler under the lock."""
        allowed = False
        for route_method, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            allowed = True
            if route_method != method:
                continue
            ctype = headers.get("Content-Type") or ""
            body = parse_body(raw, ctype, self.max_body_bytes)
            if self.gate is not None:
                self.gate.after_body(user, method, path, query, body)
            with self.store.lock:
                result = handler(
                    body=body,
                    query=query,
                    content_type=ctype,
                    accept=headers.get("Accept") or "",
                    user=user,
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

    def _send_error(
        self, req: BaseHTTPRequestHandler, exc: ApiError, *, close: bool = False
    ) -> None:
        """Answer an error; ``close`` says ``Connection: close`` (the connection ends after it).

        Without that header a client may pool the connection and send its next request into a
        socket the server is closing.
        """
        headers = {"Connection": "close"} if close else {}
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
