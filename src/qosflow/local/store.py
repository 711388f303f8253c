"""The object store of the local cluster: API objects as JSON documents, persisted atomically.

One store serves both listeners (the Argo Server and the Kubernetes API share it, as they share
etcd in a real cluster). Objects are kept by ``(kind, namespace, name)``; every write bumps one
global ``resourceVersion``. Each change is written to ``<state_dir>/state.json`` through a temporary
file and ``os.replace``, so a crash leaves either the old or the new state, never a torn file.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]

STATE_FILE = "state.json"
STATE_VERSION = 1


class Store:
    """Thread-safe store of API objects and per-pod runtime records.

    Args:
        state_dir: Directory of ``state.json``; created when missing.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every write (watch streams)
        self._objects: dict[Key, Obj] = {}
        self._order: dict[Key, int] = {}
        self._seq = 0
        self._rv = 0
        self.runtime: dict[str, dict[str, Any]] = {}
        self._dirty = False
        self._save_lock = threading.Lock()
        state_dir.mkdir(parents=True, exist_ok=True)
        self._load()

    # -- objects -------------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The stored object (not a copy; callers hold :attr:`lock` while using it)."""
        return self._objects.get((kind, namespace, name))

    def items(self, kind: str, namespace: str | None = None) -> Iterator[Obj]:
        """Objects of a kind (in one namespace, or all), in creation order."""
        keys = sorted(
            (k for k in self._objects if k[0] == kind and namespace in (None, k[1])),
            key=self._order.__getitem__,
        )
        for key in keys:
            yield self._objects[key]

    def creation_seq(self, obj: Obj) -> int:
        """The insertion counter of an object (ties in priority order are broken by it)."""
        meta = obj["metadata"]
        return self._order.get((obj["kind"], meta.get("namespace", ""), meta["name"]), 0)

    def put(self, obj: Obj) -> Obj:
        """Insert or replace ``obj`` (by kind, namespace, name) and bump its resourceVersion."""
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        if key not in self._order:
            self._seq += 1
            self._order[key] = self._seq
            meta.setdefault("uid", str(uuid.uuid4()))
        self.touch(obj)
        self._objects[key] = obj
        return obj

    def touch(self, obj: Obj) -> None:
        """Mark ``obj`` as changed: new resourceVersion, state to be saved, watchers woken."""
        with self.lock:
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._dirty = True
            self.changed.notify_all()

    def delete(self, kind: str, namespace: str, name: str) -> Obj | None:
        """Remove an object; returns it, or ``None`` when it did not exist."""
        key = (kind, namespace, name)
        self._order.pop(key, None)
        obj = self._objects.pop(key, None)
        if obj is not None:
            self._rv += 1
            self._dirty = True
            with self.lock:
                self.changed.notify_all()
        return obj

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion (for list metadata)."""
        return str(self._rv)

    def mark_dirty(self) -> None:
        """Ask for the next :meth:`save` to write (runtime records changed)."""
        self._dirty = True

    # -- persistence ---------------------------------------------------------------------------
    def save(self, *, force: bool = False) -> None:
        """Write the state atomically when something changed (or when ``force``)."""
        with self._save_lock:
            self._save_locked(force=force)

    def _save_locked(self, *, force: bool) -> None:
        """Body of :meth:`save`; the save lock keeps concurrent saves in order."""
        with self.lock:
            if not (self._dirty or force):
                return
            state = {
                "version": STATE_VERSION,
                "resourceVersion": self._rv,
                "seq": self._seq,
                "objects": [
                    {"order": self._order[k], "object": o} for k, o in self._objects.items()
                ],
                "runtime": self.runtime,
            }
            text = json.dumps(state, separators=(",", ":"))
            self._dirty = False
        path = self.state_dir / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def _load(self) -> None:
        """Read ``state.json`` when present (a missing file is an empty cluster)."""
        path = self.state_dir / STATE_FILE
        if not path.exists():
            return
        state = json.loads(path.read_text(encoding="utf-8"))
        self._rv = int(state["resourceVersion"])
        self._seq = int(state["seq"])
        for row in state["objects"]:
            obj = row["object"]
            meta = obj["metadata"]
            key = (obj["kind"], meta.get("namespace", ""), meta["name"])
            self._objects[key] = obj
            self._order[key] = int(row["order"])
        self.runtime = dict(state.get("runtime", {}))


def snapshot(obj: Obj) -> Obj:
    """A deep copy, safe to serialise outside the store lock."""
    return copy.deepcopy(obj)
