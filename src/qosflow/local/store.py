"""The object store of the local cluster: API objects as JSON documents, persisted atomically.

One store serves both listeners (the Argo Server and the Kubernetes API share it, as they share
etcd in a real cluster). Objects are kept by ``(kind, namespace, name)``; every write bumps one
global ``resourceVersion``. Beside the objects it keeps the runtime records of pods and the hashes
of the service-account tokens issued (:mod:`qosflow.local.tokens`), and a few counters that
must never go back (the pod addresses handed out, :mod:`qosflow.local.addresses`). Each change is written to
``<state_dir>/state.json`` through a temporary file and ``os.replace``, so a crash leaves either the
old or the new state, never a torn file.

Loading never stops the cluster from starting: an object the ``validate`` hook refuses (a name
that would escape the state directory, a value the controller cannot parse) is moved to
``<state_dir>/quarantine.json`` with the reason, and logged; a ``state.json`` that is not a state
document at all is renamed ``state.json.unreadable-<time>`` and the cluster starts empty.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]
Validator = Callable[[Any], str | None]

STATE_FILE = "state.json"
QUARANTINE_FILE = "quarantine.json"
STATE_VERSION = 1
_LOG = logging.getLogger(__name__)


def _basic_problem(obj: Any) -> str | None:
    """What every stored object needs: a kind and a metadata object with a string name."""
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        return "not an object with a kind"
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return "metadata.name is missing"
    if not isinstance(meta.get("namespace", ""), str):
        return "metadata.namespace is not a string"
    return None


class Store:
    """Thread-safe store of API objects and per-pod runtime records.

    Args:
        state_dir: Directory of ``state.json``; created when missing.
        validate: ``object -> reason`` for stored objects that cannot be served (``None`` when
            sound); they are quarantined at load.
    """

    def __init__(self, state_dir: Path, validate: Validator | None = None) -> None:
        self.state_dir = state_dir
        self.validate = validate
        self.quarantined: list[Obj] = []
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every write (watch streams)
        self._objects: dict[Key, Obj] = {}
        self._order: dict[Key, int] = {}
        self._seq = 0
        self._rv = 0
        self.runtime: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, dict[str, Any]] = {}  # service-account token hash -> its record
        self.counters: dict[str, int] = {}  # monotonic counters (pod addresses handed out)
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

    def namespaces(self) -> set[str]:
        """The namespaces objects live in."""
        return {key[1] for key in self._objects if key[1]}

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
                "tokens": self.tokens,
                "counters": self.counters,
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
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(state, dict) or not isinstance(state.get("objects"), list):
                raise ValueError("not a state document")
        except (OSError, ValueError, RecursionError) as exc:
            aside = path.with_name(f"{STATE_FILE}.unreadable-{int(time.time())}")
            os.replace(path, aside)
            _LOG.error("%s is unreadable (%s); moved to %s, starting empty", path, exc, aside)
            return
        for row in state["objects"]:
            self._load_row(row)
        self._rv = max(_int(state.get("resourceVersion")), self._max_rv())
        self._seq = max([_int(state.get("seq")), *self._order.values()])
        runtime = state.get("runtime")
        self.runtime = {
            str(k): v
            for k, v in (runtime if isinstance(runtime, dict) else {}).items()
            if isinstance(v, dict)
        }
        tokens = state.get("tokens")
        self.tokens = {
            str(k): v
            for k, v in (tokens if isinstance(tokens, dict) else {}).items()
            if isinstance(v, dict)
        }
        counters = state.get("counters")
        self.counters = {
            str(k): _int(v) for k, v in (counters if isinstance(counters, dict) else {}).items()
        }
        if self.quarantined:
            self._write_quarantine()
            self._dirty = True

    def _load_row(self, row: Any) -> None:
        """Keep one stored object, or quarantine it with the reason."""
        obj = row.get("object") if isinstance(row, dict) else row
        problem = _basic_problem(obj)
        if problem is None and self.validate is not None:
            try:
                problem = self.validate(obj)
            except Exception as exc:  # a validator bug must not stop the start either
                problem = f"could not be checked: {exc!r}"
        if problem is not None or not isinstance(obj, dict) or not isinstance(row, dict):
            problem = problem or "a row without its object"
            _LOG.error("state.json: quarantined an object (%s)", problem)
            self.quarantined.append({"reason": problem, "row": row})
            return
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        self._objects[key] = obj
        self._order[key] = _int(row.get("order")) or len(self._order) + 1

    def _max_rv(self) -> int:
        """The highest resourceVersion among the loaded objects."""
        return max(
            (_int(o["metadata"].get("resourceVersion")) for o in self._objects.values()), default=0
        )

    def _write_quarantine(self) -> None:
        """Append the quarantined rows to ``quarantine.json`` (for a human to look at)."""
        path = self.state_dir / QUARANTINE_FILE
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            previous = []
        rows = (previous if isinstance(previous, list) else []) + [
            {**q, "at": time.time()} for q in self.quarantined
        ]
        tmp = path.with_name(f".{QUARANTINE_FILE}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
        os.replace(tmp, path)


def _int(value: Any) -> int:
    """A stored counter as an int (0 when missing or unreadable)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


def snapshot(obj: Obj) -> Obj:
    """A deep copy, safe to serialise outside the store lock."""
    return copy.deepcopy(obj)
