"""Type checks of request bodies, as Go's ``encoding/json`` does them in the real servers.

The real servers decode requests into typed Go structs: a string where a list belongs is a 400
``json: cannot unmarshal string into Go struct field ... of type ...``; unknown fields are ignored.
This module checks the fields the local cluster reads, with the same kind of message, so a bad
body is answered like upstream instead of failing deep inside.
"""

from __future__ import annotations

from typing import Any

from qosflow.local.status import ApiError

Desc = Any  # "string" | "int" | "bool" | "scalar" | "quantity" | "intstr" | dict | ("list"|"map", Desc)

_GO = {
    "string": "string",
    "int": "int64",
    "bool": "bool",
    "scalar": "v1alpha1.AnyString",
    "quantity": "resource.Quantity",
    "intstr": "intstr.IntOrString",
}
_STRINGS = ("map", "string")
META: Desc = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "labels": _STRINGS,
    "annotations": _STRINGS,
    "resourceVersion": "string",
}
PARAMETERS: Desc = ("list", {"name": "string", "value": "scalar", "default": "scalar"})
RESOURCES: Desc = {"requests": ("map", "quantity"), "limits": ("map", "quantity")}
CONTAINER: Desc = {
    "name": "string",
    "image": "string",
    "command": ("list", "string"),
    "args": ("list", "string"),
    "env": ("list", {"name": "string", "value": "string"}),
    "resources": RESOURCES,
    "resizePolicy": ("list", {"resourceName": "string", "restartPolicy": "string"}),
}
ARGUMENTS: Desc = {"parameters": PARAMETERS}
STEP: Desc = {"name": "string", "template": "string", "arguments": ARGUMENTS}
TEMPLATE: Desc = {
    "name": "string",
    "container": CONTAINER,
    "inputs": ARGUMENTS,
    "metadata": {"labels": _STRINGS, "annotations": _STRINGS},
    "steps": ("list", ("list", STEP)),
    "dag": {"tasks": ("list", {**STEP, "dependencies": ("list", "string")})},
    "retryStrategy": {
        "limit": "intstr",
        "retryPolicy": "string",
        "backoff": {"duration": "string", "factor": "intstr", "maxDuration": "string"},
    },
    "priorityClassName": "string",
    "podSpecPatch": "string",
}
SPEC: Desc = {
    "entrypoint": "string",
    "templates": ("list", TEMPLATE),
    "arguments": ARGUMENTS,
    "workflowTemplateRef": {"name": "string"},
    "priority": "int",
    "podPriorityClassName": "string",
    "serviceAccountName": "string",
    "activeDeadlineSeconds": "int",
    "shutdown": "string",
    "podSpecPatch": "string",
}
WORKFLOW: Desc = {"metadata": META, "spec": SPEC}
POD_PATCH: Desc = {"metadata": META, "spec": {"containers": ("list", CONTAINER)}}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _go_type(desc: Desc) -> str:
    if isinstance(desc, str):
        return _GO[desc]
    if isinstance(desc, dict):
        return "struct"
    kind, inner = desc
    return f"[]{_go_type(inner)}" if kind == "list" else f"map[string]{_go_type(inner)}"


def _ok(value: Any, desc: str) -> bool:
    kind = _json_type(value)
    allowed = {
        "string": ("string",),
        "int": ("number",),
        "bool": ("bool",),
        "scalar": ("string", "number", "bool"),
        "quantity": ("string", "number"),
        "intstr": ("string", "number"),
    }[desc]
    if desc == "int" and isinstance(value, float) and not value.is_integer():
        return False
    return kind in allowed


def _children(value: Any, desc: Desc, path: str) -> list[tuple[Any, Desc, str]] | None:
    """The nested values to check, or ``None`` when ``value`` has the wrong container type."""
    if isinstance(desc, dict):
        if not isinstance(value, dict):
            return None
        return [(value.get(key), inner, f"{path}.{key}") for key, inner in desc.items()]
    kind, inner = desc
    if kind == "list":
        return [(item, inner, path) for item in value] if isinstance(value, list) else None
    return [(item, inner, path) for item in value.values()] if isinstance(value, dict) else None


def check(value: Any, desc: Desc, path: str) -> None:
    """Raise a 400 like Go's decoder when ``value`` does not fit ``desc`` (``null`` always fits)."""
    if value is None:
        return
    children = None if isinstance(desc, str) else _children(value, desc, path)
    if (isinstance(desc, str) and not _ok(value, desc)) or (
        not isinstance(desc, str) and children is None
    ):
        raise ApiError(
            400,
            f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} "
            f"of type {_go_type(desc)}",
        )
    for item, inner, where in children or []:
        check(item, inner, where)
