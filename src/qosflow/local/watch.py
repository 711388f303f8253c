"""Watch streams of the emulated Argo Server: ``GET /api/v1/workflow-events/{ns}``.

With ``Accept: text/event-stream`` the stream is Server-Sent Events (``data: {"result":{...}} ``
then a blank line, a ``:`` keep-alive line every ``keepalive_s``); otherwise newline-delimited
JSON (``{"result":{...}}``). It starts with ``ADDED`` for every matching workflow, then sends
``MODIFIED`` / ``DELETED`` as the store changes (consecutive changes between two wake-ups collapse
into one event). :meth:`WatchHub.break_all` ends every open stream with the in-band error upstream
sends when its Kubernetes watch closes (gRPC code 8, ``EOF``), so clients' reconnect logic can be
tested.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from qosflow.local.query import apply_fields
from qosflow.local.store import Obj, Store, snapshot

EOF_ERROR = {
    "error": {
        "grpc_code": 8,
        "http_code": 429,
        "message": "EOF",
        "http_status": "Too Many Requests",
        "details": [],
    }
}


@dataclass(frozen=True, slots=True)
class Stream:
    """A streamed answer: ``chunks`` yields encoded pieces until the stream ends."""

    content_type: str
    chunks: Iterator[bytes]


class WatchHub:
    """Open watch streams over one store."""

    def __init__(self, store: Store, keepalive_s: float = 15.0) -> None:
        self.store = store
        self.keepalive_s = keepalive_s
        self._generation = 0
        self._closed = threading.Event()

    def break_all(self) -> None:
        """End every open stream with the in-band ``EOF`` error (test hook, not an endpoint)."""
        with self.store.lock:
            self._generation += 1
            self.store.changed.notify_all()

    def close(self) -> None:
        """End every stream for good (server shutdown)."""
        self._closed.set()
        with self.store.lock:
            self.store.changed.notify_all()

    def workflows(
        self, ns: str, match: Callable[[Obj], bool], fields: str | None, sse: bool
    ) -> Stream:
        """A stream of workflow events in namespace ``ns`` for objects that ``match``."""

        def encode(payload: dict[str, Any]) -> bytes:
            text = json.dumps(apply_fields(payload, fields) if "result" in payload else payload)
            return f"data: {text} \n\n".encode() if sse else f"{text}\n".encode()

        def events() -> Iterator[bytes]:
            last: dict[str, Obj] = {}
            generation, seen_rv = self._generation, ""
            while not self._closed.is_set():
                with self.store.lock:
                    woke = True
                    if seen_rv == self.store.resource_version and generation == self._generation:
                        woke = self.store.changed.wait(self.keepalive_s)
                    broken = generation != self._generation
                    seen_rv = self.store.resource_version
                    batch = [] if broken else self._diff(ns, match, last)
                if broken:
                    yield encode(EOF_ERROR)
                    return
                if not batch and not woke and sse:
                    yield b":\n\n"
                for kind, obj in batch:
                    yield encode({"result": {"type": kind, "object": obj}})

        return Stream("text/event-stream" if sse else "application/json", events())

    def _diff(
        self, ns: str, match: Callable[[Obj], bool], last: dict[str, Obj]
    ) -> list[tuple[str, Obj]]:
        """Events since ``last`` (updated in place); callers hold the store lock."""
        current = {w["metadata"]["name"]: w for w in self.store.items("Workflow", ns) if match(w)}
        batch: list[tuple[str, Obj]] = []
        for name, wf in current.items():
            old = last.get(name)
            if (
                old is None
                or old["metadata"]["resourceVersion"] != wf["metadata"]["resourceVersion"]
            ):
                copy = snapshot(wf)
                batch.append(("ADDED" if old is None else "MODIFIED", copy))
                last[name] = copy
        for name in [n for n in last if n not in current]:
            batch.append(("DELETED", last.pop(name)))
        return batch
