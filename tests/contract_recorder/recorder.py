"""Recording every HTTP exchange qosflow's client code makes.

Two transports are wrapped for the whole session:

* the Argo Server side at ``requests.adapters.HTTPAdapter.send`` (the real wire transport: a test
  that mounts a canned adapter on a session is not a server and is not recorded);
* the Kubernetes side at ``urllib3.PoolManager.urlopen``, which the ``kubernetes`` client's REST layer
  calls for every request in both generations of the client (36 and 37).

**Attribution.** An exchange is recorded only when the calling thread's stack holds a frame of
qosflow's client code (a file under the ``qosflow_argo`` or ``qosflow_airflow`` package). Tests
that send raw requests (``requests``, ``urllib``, the ``kubernetes`` client on its own, the
local cluster's robustness tests) have no such frame and are never counted. The base URL of the
client object found on the stack (``ArgoServer.url``, the ``ApiClient`` host of ``KubeApi``)
is cut off the path, so a ``--base-href`` prefix or a proxied API server still maps.

**Injected faults.** The local cluster's :class:`~qosflow.local.FaultPlan` answers some requests
itself (a 503, a 429). Those answers are the test's, not the emulated server's: while a fault
rule fires, the listener thread marks its answer with a header, and such exchanges have their
request checked and their response left out (counted as ``injected``).

Response bodies are teed as the client reads them (``read``/``read1``/``read_chunked`` of the
urllib3 response), so streams are captured as far as the client consumed them.
"""

from __future__ import annotations

import collections
import functools
import http.server
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from contract_recorder.tracking import CLIENT_DIRS, Instrumenter, Path_

INJECTED_HEADER = "X-Qosflow-Contract-Injected"


@dataclass(eq=False)
class Exchange:
    """One request the client sent and what came back."""

    transport: str  # "argo" (requests) | "kube" (kubernetes client)
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    request: bytes
    test: str
    status: int | None = None
    response_type: str = ""
    body: bytearray = field(default_factory=bytearray)
    error: str = ""
    injected: str = ""
    reads: set[Path_] = field(default_factory=set)
    exempt: str = ""

    @property
    def label(self) -> str:
        status = self.status if self.status is not None else (self.error or "no answer")
        return f"{self.method} {self.path} -> {status}"

    def respond(self, status: int, headers: Any, raw: Any) -> None:
        """Note the status and tee the body as the client reads it."""
        self.status = int(status)
        self.response_type = str(headers.get("Content-Type") or "")
        self.injected = str(headers.get(INJECTED_HEADER) or "")
        preloaded = getattr(raw, "_body", None)  # a body read before it reached us
        if isinstance(preloaded, bytes | bytearray):
            self.body.extend(preloaded)
        _tee(raw, self.body)


def _tee(raw: Any, sink: bytearray) -> None:
    for name in ("read", "read1"):
        original = getattr(raw, name, None)
        if original is not None:
            setattr(raw, name, _teed_read(original, sink))
    chunked = getattr(raw, "read_chunked", None)
    if chunked is not None:

        def read_chunked(*args: Any, **kwargs: Any) -> Any:
            for chunk in chunked(*args, **kwargs):
                sink.extend(chunk)
                yield chunk

        raw.read_chunked = read_chunked


def _teed_read(original: Callable[..., Any], sink: bytearray) -> Callable[..., Any]:
    @functools.wraps(original)
    def read(*args: Any, **kwargs: Any) -> Any:
        data = original(*args, **kwargs)
        if data:
            sink.extend(data)
        return data

    return read


def _base_path(frame: FrameType | None, transport: str) -> str:
    """Path prefix of the client object on the stack (``ArgoServer.url`` / the kube host)."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        kind = type(owner).__name__
        if transport == "argo" and kind == "ArgoServer":
            return urlsplit(str(owner.url)).path.rstrip("/")
        if transport == "kube" and kind == "KubeApi":
            configuration = getattr(getattr(owner, "_api_client", None), "configuration", None)
            return urlsplit(str(getattr(configuration, "host", ""))).path.rstrip("/")
        frame = frame.f_back
    return ""


class Recorder:
    """The session's exchanges, the current test and the client-code attribution."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self.test = "(outside a test)"
        self.exempt = ""  # the reason of the current test's contract_exempt marker
        self._lock = threading.Lock()
        self._local = threading.local()
        self._dirs = CLIENT_DIRS
        self.instrumenter = Instrumenter(self.claim)

    def client_frame(self) -> FrameType | None:
        """The innermost frame of qosflow's client code on this thread's stack, if any."""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(self._dirs):
                return frame
            frame = frame.f_back
        return None

    def open(
        self, transport: str, method: str, url: str, body: Any, headers: Any, frame: FrameType
    ) -> Exchange:
        """Record a request the client is about to send."""
        split = urlsplit(url)
        base = _base_path(frame, transport)
        path = split.path[len(base) :] if base and split.path.startswith(base) else split.path
        if isinstance(body, str):
            body = body.encode("utf-8")
        exchange = Exchange(
            transport=transport,
            method=method.upper(),
            path=path.rstrip("/") or "/",
            query=parse_qs(split.query, keep_blank_values=True),
            content_type=str((headers or {}).get("Content-Type") or ""),
            request=bytes(body or b""),
            test=self.test,
            exempt=self.exempt,
        )
        self.instrumenter.refresh()
        with self._lock:
            self.exchanges.append(exchange)
        recent = getattr(self._local, "recent", None)
        if recent is None:
            recent = self._local.recent = collections.deque(maxlen=8)
        recent.append(exchange)
        return exchange

    def claim(self, text: Any) -> set[Path_] | None:
        """The read set of this thread's exchange whose response body is ``text`` (once)."""
        recent = getattr(self._local, "recent", None)
        if not recent:
            return None
        data = text.encode("utf-8") if isinstance(text, str) else text
        if not isinstance(data, bytes | bytearray):
            return None
        for exchange in reversed(recent):
            if len(exchange.body) == len(data) and exchange.body == data:
                recent.remove(exchange)
                return exchange.reads
        return None


# ---------------------------------------------------------------------------------- transports
class Patches:
    """The wrapped transports and fault marker; :meth:`undo` restores them."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._undo: list[tuple[Any, str, Any]] = []

    def _swap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        import requests.adapters
        import urllib3

        self._swap(requests.adapters.HTTPAdapter, "send", self._requests_send)
        self._swap(urllib3.PoolManager, "urlopen", self._urllib3_urlopen)
        self._mark_faults()

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        self.recorder.instrumenter.undo()

    def _requests_send(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self.recorder

        @functools.wraps(original)
        def send(adapter: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            frame = recorder.client_frame()
            if frame is None:
                return original(adapter, request, *args, **kwargs)
            exchange = recorder.open(
                "argo", str(request.method), str(request.url), request.body, request.headers, frame
            )
            del frame
            try:
                response = original(adapter, request, *args, **kwargs)
            except Exception as exc:
                exchange.error = type(exc).__name__
                raise
            exchange.respond(response.status_code, response.headers, response.raw)
            return response

        return send

    def _urllib3_urlopen(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self.recorder

        @functools.wraps(original)
        def urlopen(manager: Any, method: str, url: str, *args: Any, **kw: Any) -> Any:
            frame = recorder.client_frame()
            if frame is None:
                return original(manager, method, url, *args, **kw)
            exchange = recorder.open("kube", method, url, kw.get("body"), kw.get("headers"), frame)
            del frame
            try:
                response = original(manager, method, url, *args, **kw)
            except Exception as exc:
                exchange.error = type(exc).__name__
                raise
            exchange.respond(response.status, response.headers, response)
            return response

        return urlopen

    def _mark_faults(self) -> None:
        """Mark answers the local cluster's fault plan makes up (when it is importable)."""
        try:
            from qosflow.local.faults import FaultPlan
        except ImportError:  # pragma: no cover - the local cluster is part of the project
            return
        firing = threading.local()

        def take(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapped(plan: Any, *args: Any, **kwargs: Any) -> Any:
                rule = original(plan, *args, **kwargs)
                firing.action = getattr(rule, "action", None)
                return rule

            return wrapped

        def send_response(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapped(handler: Any, *args: Any, **kwargs: Any) -> Any:
                original(handler, *args, **kwargs)
                if getattr(firing, "action", None) == "status":
                    handler.send_header(INJECTED_HEADER, "status")
                firing.action = None

            return wrapped

        self._swap(FaultPlan, "take", take)
        self._swap(http.server.BaseHTTPRequestHandler, "send_response", send_response)
