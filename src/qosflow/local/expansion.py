"""Fan-out of steps and tasks (``withItems``, ``withSequence``) and the variables of earlier steps.

As Argo's ``expandStep`` / ``processItem`` / ``expandSequence`` do it:

* ``withSequence`` (``count``, or ``start`` / ``end``, counting down when ``end < start``;
  ``format`` is a printf format, ``%d`` by default) and ``withItems`` (strings, numbers, booleans)
  turn one step into one step per item, named ``<name>(<index>:<item>)`` (``worker(0:0)``;
  parentheses in the item are dropped from the name), with ``{{item}}`` replaced in the step;
  an empty list or a count of 0 gives a ``Skipped`` node (``Skipped, empty params``);
* ``{{steps.<name>.ip|id|status|hostNodeName|startedAt|finishedAt}}`` (``tasks.`` in a DAG) are
  the values of an earlier step's node, known only at run time: the pods of a later group are
  made once they resolve (:func:`fill`); ``ip`` is the pod address of a daemon step. At create,
  a reference to a step that does not come earlier (or, for ``ip``, is not a daemon) is a 400
  ``failed to resolve {{steps.x.ip}}``, as Argo's validation answers it.

``withParam`` (a JSON list from an earlier step's output) is not supported: the local cluster has
no outputs; a workflow using it is refused at create with a 400 that says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from qosflow.local.status import ApiError

Obj = dict[str, Any]
LOOPS = ("withItems", "withParam", "withSequence")
NODE_FIELDS = ("id", "status", "hostNodeName", "startedAt", "finishedAt")
"""Node variables every earlier step has (``ip`` is a daemon's only)."""
EMPTY = "Skipped, empty params"
_VAR = re.compile(r"\{\{\s*([A-Za-z0-9_.\-]+)\s*\}\}")
_RUNTIME = re.compile(r"\{\{\s*((?:steps|tasks)\.[A-Za-z0-9_.\-]+)\s*\}\}")


def item_text(item: Any) -> str:
    """An item as ``{{item}}`` reads (numbers and booleans as Go prints them)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    return str(item)


def _number(value: Any, field: str) -> int:
    """A ``withSequence`` bound (an int or a string of one), as ``strconv.Atoi`` reads it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ApiError(400, f'{field}: strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def sequence(spec: Obj, where: str) -> list[str]:
    """The items of a ``withSequence`` (Argo's ``expandSequence``)."""
    if spec.get("count") is not None and spec.get("end") is not None:
        raise ApiError(400, f"{where} only one of count or end can be defined in withSequence")
    start = _number(spec["start"], f"{where}.withSequence.start") if spec.get("start") else 0
    if spec.get("end") is not None:
        end = _number(spec["end"], f"{where}.withSequence.end")
    elif spec.get("count") is not None:
        count = _number(spec["count"], f"{where}.withSequence.count")
        if count <= 0:
            return []
        end = start + count - 1
    else:
        raise ApiError(400, f"{where} neither end nor count was specified in withSequence")
    step = 1 if start <= end else -1
    form = str(spec.get("format") or "%d")
    try:
        return [form % i for i in range(start, end + step, step)]
    except (TypeError, ValueError):
        raise ApiError(400, f"{where}.withSequence.format: bad format {form!r}") from None


def items_of(step: Obj, where: str) -> list[str] | None:
    """The items a step fans out over, or ``None`` when it runs once."""
    loops = [k for k in LOOPS if step.get(k) not in (None, "", [])]
    if not loops:
        return None
    if len(loops) > 1:
        raise ApiError(
            400, f"{where} only one of withItems, withParam, withSequence can be specified"
        )
    if loops[0] == "withParam":
        raise ApiError(
            400,
            f"{where}: the local cluster runs withItems and withSequence, not withParam "
            "(it has no step outputs)",
        )
    if loops[0] == "withSequence":
        if not isinstance(step["withSequence"], dict):
            raise ApiError(400, f"{where}.withSequence must be an object")
        return sequence(step["withSequence"], where)
    values = step["withItems"] if isinstance(step["withItems"], list) else [step["withItems"]]
    for value in values:
        if isinstance(value, dict | list) or value is None:
            raise ApiError(
                400,
                f"{where}.withItems: the local cluster runs items that are strings, numbers or "
                f"booleans (got {json.dumps(value)})",
            )
    return [item_text(v) for v in values]


def expand(step: Obj, where: str) -> list[tuple[str, Obj]] | None:
    """``(name, step)`` per item, ``{{item}}`` replaced; ``None`` when the step does not fan out."""
    items = items_of(step, where)
    if items is None:
        return None
    base = {k: v for k, v in step.items() if k not in LOOPS}
    name = str(step.get("name", ""))
    expanded = []
    for index, item in enumerate(items):
        clean = item.replace("(", "").replace(")", "")
        expanded.append((f"{name}({index}:{clean})", fill(base, {"item": item})))
    return expanded


def fill(value: Any, variables: Mapping[str, str]) -> Any:
    """``{{name}}`` replaced in every string of ``value`` where ``name`` is in ``variables``."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [fill(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, variables) for k, v in value.items()}
    return value


def unresolved(value: Any) -> list[str]:
    """The ``steps.*`` / ``tasks.*`` variables still in ``value`` (to be known at run time)."""
    return _RUNTIME.findall(json.dumps(value))


def scope_names(prefix: str, name: str, *, daemon: bool) -> list[str]:
    """The variables a step named ``name`` gives the steps after it."""
    fields = [*NODE_FIELDS, "ip"] if daemon else list(NODE_FIELDS)
    return [f"{prefix}.{name}.{field}" for field in fields]


def check_references(step: Obj, known: Iterable[str], where: str) -> None:
    """Every ``steps.*`` / ``tasks.*`` variable in a step must come from an earlier step (400)."""
    allowed = set(known)
    for name in unresolved({k: v for k, v in step.items() if k not in LOOPS}):
        if name not in allowed:
            raise ApiError(400, f"{where} failed to resolve {{{{{name}}}}}")


def node_variables(prefix: str, name: str, node: Obj) -> dict[str, str]:
    """The run-time variables of an earlier step from its node (the last attempt of a retry)."""
    keys = {
        "id": node.get("id"),
        "status": node.get("phase"),
        "hostNodeName": node.get("hostNodeName"),
        "startedAt": node.get("startedAt"),
        "finishedAt": node.get("finishedAt"),
        "ip": node.get("podIP"),
    }
    return {f"{prefix}.{name}.{k}": str(v) for k, v in keys.items() if v}
