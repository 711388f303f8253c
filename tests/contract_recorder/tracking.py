"""Which response fields the client reads: parsed JSON that records every key looked up.

The client parses response bodies with ``json.loads`` in its transport modules. The plugin puts a
:class:`TrackingJson` in place of the ``json`` name of every client module (``qosflow_argo.*``,
``qosflow_airflow.*``); when the text it parses is the body of an exchange this thread just
recorded, the parsed objects are :class:`TrackedDict` trees that add the path of every key read
(``[]``, ``get``, ``in``, ``setdefault``, ``pop``) to that exchange's read set. Lists stay plain
lists (their elements are tracked dicts, path segment ``[]``), scalars stay plain scalars.

A tracked dict *is* a dict (``isinstance``, ``==``, ``json.dumps``, iteration and ``**`` unpacking
use the C fast paths and record nothing). Copies stay tracked: ``copy.copy``/``copy.deepcopy``/
``.copy()`` return tracked copies with the same path, and in client modules that call ``dict(...)``
the name ``dict`` is a :class:`DictType` stand-in whose call keeps a tracked argument tracked
(``main_container`` returns ``dict(container)`` and the caller reads ``name`` from the copy).
"""

from __future__ import annotations

import builtins
import copy
import json
import re
import sys
import types
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

Path_ = tuple[str, ...]
ITEM = "[]"
_MISSING = object()


def client_dirs() -> tuple[str, ...]:
    """The source folders of the client packages (``.../qosflow_argo/``, ...)."""
    dirs = []
    for package in CLIENT_PACKAGES:
        spec = find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs += {str(Path(location)) + "/", str(Path(location).resolve()) + "/"}
    return tuple(dirs)


CLIENT_PACKAGES = ("qosflow_argo", "qosflow_airflow")
CLIENT_DIRS = client_dirs()


class TrackedDict(dict):  # type: ignore[type-arg]
    """A dict that adds ``path + (key,)`` to ``sink`` whenever client code looks a key up.

    Only lookups made by client code count (the caller's frame is in a client package): a test
    that inspects what the client returned, or ``jsonschema`` validating it, reads nothing.
    """

    __slots__ = ("_path", "_sink")

    _sink: set[Path_]
    _path: Path_

    def __getitem__(self, key: Any) -> Any:
        if sys._getframe(1).f_code.co_filename.startswith(CLIENT_DIRS):
            self._sink.add((*self._path, str(key)))
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        if sys._getframe(1).f_code.co_filename.startswith(CLIENT_DIRS):
            self._sink.add((*self._path, str(key)))
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        if sys._getframe(1).f_code.co_filename.startswith(CLIENT_DIRS):
            self._sink.add((*self._path, str(key)))
        return dict.__contains__(self, key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if sys._getframe(1).f_code.co_filename.startswith(CLIENT_DIRS):
            self._sink.add((*self._path, str(key)))
        return dict.setdefault(self, key, default)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if sys._getframe(1).f_code.co_filename.startswith(CLIENT_DIRS):
            self._sink.add((*self._path, str(key)))
        if default is _MISSING:
            return dict.pop(self, key)
        return dict.pop(self, key, default)

    def copy(self) -> TrackedDict:
        return retrack(dict(self.items()), self)

    def __copy__(self) -> TrackedDict:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> TrackedDict:
        plain = copy.deepcopy(plain_copy(self), memo)
        return wrap(plain, self._sink, self._path)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickling (an XCom, a process boundary) carries the data only, never the sink
        return (dict, (plain_copy(self),))


def new_tracked(items: dict[Any, Any], sink: set[Path_], path: Path_) -> TrackedDict:
    made = TrackedDict(items)
    made._sink = sink
    made._path = path
    return made


def retrack(items: dict[Any, Any], like: TrackedDict) -> TrackedDict:
    """A tracked dict of ``items`` (children already tracked) at ``like``'s path."""
    return new_tracked(items, like._sink, like._path)


def wrap(value: Any, sink: set[Path_], path: Path_ = ()) -> Any:
    """``value`` with every dict in it tracked (lists stay lists, their items at ``[]``)."""
    if isinstance(value, dict):
        items = {k: wrap(v, sink, (*path, str(k))) for k, v in dict.items(value)}
        return new_tracked(items, sink, path)
    if isinstance(value, list):
        return [wrap(v, sink, (*path, ITEM)) for v in value]
    return value


def plain_copy(value: Any) -> Any:
    """A deep copy made of plain dicts and lists (for pickling and reports)."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    return value


class DictType(type):
    """Metaclass of the ``dict`` stand-in: behaves like the builtin, keeps copies tracked."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        made = builtins.dict(*args, **kwargs)
        if len(args) == 1 and isinstance(args[0], TrackedDict):
            return retrack(made, args[0])
        return made

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, builtins.dict)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, builtins.dict)

    def __getitem__(cls, item: Any) -> Any:
        return builtins.dict[item]

    def __getattr__(cls, name: str) -> Any:
        return getattr(builtins.dict, name)


class TrackedDictName(metaclass=DictType):
    """What the name ``dict`` means in a client module while the plugin runs."""


class TrackingJson(types.ModuleType):
    """The ``json`` module, with a ``loads`` that tracks the bodies of recorded exchanges.

    Args:
        claim: ``claim(text) -> sink | None``: the read set of the exchange of this thread whose
            response body is ``text``, or ``None`` when ``text`` is no recorded body.
    """

    def __init__(self, claim: Callable[[Any], set[Path_] | None]) -> None:
        super().__init__("json")
        self._claim = claim

    def loads(self, s: Any, *args: Any, **kwargs: Any) -> Any:
        data = json.loads(s, *args, **kwargs)
        sink = self._claim(s)
        return data if sink is None else wrap(data, sink)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


_CALLS_DICT = re.compile(r"(?<![\w.])dict\(")


class Instrumenter:
    """Swaps ``json`` (and ``dict`` where it is called) in client modules; undoes it at the end."""

    def __init__(self, claim: Callable[[Any], set[Path_] | None]) -> None:
        self.json = TrackingJson(claim)
        self._done: dict[str, list[tuple[str, Any]]] = {}
        self._seen_modules = -1

    def refresh(self) -> None:
        """Instrument client modules imported since the last call (cheap when none were)."""
        if len(sys.modules) == self._seen_modules:
            return
        self._seen_modules = len(sys.modules)
        for name, module in list(sys.modules.items()):
            if name in self._done or name.split(".")[0] not in CLIENT_PACKAGES or module is None:
                continue
            self._done[name] = self._instrument(module)

    def _instrument(self, module: types.ModuleType) -> list[tuple[str, Any]]:
        undo: list[tuple[str, Any]] = []
        names = vars(module)
        if names.get("json") is json:
            undo.append(("json", json))
            module.json = self.json  # type: ignore[attr-defined]
        if "dict" not in names and _calls_dict(module):
            undo.append(("dict", _MISSING))
            module.dict = TrackedDictName  # type: ignore[attr-defined]
        return undo

    def undo(self) -> None:
        """Put every swapped name back."""
        for name, undo in self._done.items():
            module = sys.modules.get(name)
            for attr, old in undo if module is not None else ():
                if old is _MISSING:
                    vars(module).pop(attr, None)
                else:
                    setattr(module, attr, old)
        self._done.clear()
        self._seen_modules = -1


def _calls_dict(module: types.ModuleType) -> bool:
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return False
    try:
        return _CALLS_DICT.search(Path(path).read_text(encoding="utf-8")) is not None
    except OSError:
        return False
