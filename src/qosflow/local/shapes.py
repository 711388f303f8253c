"""Type checks of request bodies, as Go's ``encoding/json`` does them in the real servers.

The real servers decode requests into typed Go structs: a string where a list belongs is a 400
``json: cannot unmarshal string into Go struct field ... of type ...``; unknown fields are ignored.
This module checks the fields the local cluster reads, with the same kind of message, so a bad
body is answered like upstream instead of failing deep inside.
"""

from __future__ import annotations

from typing import Any

from qosflow.local.status import ApiError

Desc = Any  # "string" | "int" | "int32" | "bool" | "scalar" | "quantity" | "intstr" | dict | ("list"|"map", Desc)

_GO = {
    "string": "string",
    "int": "int64",
    "int32": "int32",
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
    "uid": "string",
    "creationTimestamp": "string",
    "generation": "int",
}
PARAMETERS: Desc = ("list", {"name": "string", "value": "scalar", "default": "scalar"})
RESOURCES: Desc = {"requests": ("map", "quantity"), "limits": ("map", "quantity")}
PROBE: Desc = {
    "exec": {"command": ("list", "string")},
    "tcpSocket": {"port": "intstr", "host": "string"},
    "httpGet": {
        "path": "string",
        "port": "intstr",
        "host": "string",
        "scheme": "string",
        "httpHeaders": ("list", {"name": "string", "value": "string"}),
    },
    "initialDelaySeconds": "int32",
    "timeoutSeconds": "int32",
    "periodSeconds": "int32",
    "successThreshold": "int32",
    "failureThreshold": "int32",
}
CONTAINER: Desc = {
    "name": "string",
    "image": "string",
    "command": ("list", "string"),
    "args": ("list", "string"),
    "env": ("list", {"name": "string", "value": "string"}),
    "resources": RESOURCES,
    "resizePolicy": ("list", {"resourceName": "string", "restartPolicy": "string"}),
    "ports": ("list", {"name": "string", "containerPort": "int32", "protocol": "string"}),
    "readinessProbe": PROBE,
}
ARGUMENTS: Desc = {"parameters": PARAMETERS}
STEP: Desc = {
    "name": "string",
    "template": "string",
    "arguments": ARGUMENTS,
    "withParam": "string",
    "withSequence": {"count": "intstr", "start": "intstr", "end": "intstr", "format": "string"},
}
TEMPLATE: Desc = {
    "name": "string",
    "daemon": "bool",
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
    "priority": "int32",
    "podPriorityClassName": "string",
    "serviceAccountName": "string",
    "activeDeadlineSeconds": "int",
    "shutdown": "string",
    "podSpecPatch": "string",
}
WORKFLOW: Desc = {"metadata": META, "spec": SPEC}
POD_PATCH: Desc = {"metadata": META, "spec": {"containers": ("list", CONTAINER)}}
CREATE_REQUEST: Desc = {
    "workflow": WORKFLOW,
    "namespace": "string",
    "serverDryRun": "bool",
    "createOptions": {"dryRun": ("list", "string")},
}
SUBMIT_REQUEST: Desc = {
    "resourceKind": "string",
    "resourceName": "string",
    "submitOptions": {
        "name": "string",
        "generateName": "string",
        "entryPoint": "string",
        "parameters": ("list", "string"),
        "labels": "string",
        "priority": "int32",
        "podPriorityClassName": "string",
        "serviceAccount": "string",
        "dryRun": "bool",
        "serverDryRun": "bool",
    },
}
TEMPLATE_REQUEST: Desc = {"template": WORKFLOW, "createOptions": {"dryRun": ("list", "string")}}
NODE_STATUS: Desc = {
    "id": "string",
    "name": "string",
    "type": "string",
    "phase": "string",
    "message": "string",
    "progress": "string",
    "startedAt": "string",
    "finishedAt": "string",
    "children": ("list", "string"),
}
WORKFLOW_STATUS: Desc = {
    "phase": "string",
    "message": "string",
    "progress": "string",
    "startedAt": "string",
    "finishedAt": "string",
    "nodes": ("map", NODE_STATUS),
    "storedWorkflowTemplateSpec": SPEC,
}
STORED_WORKFLOW: Desc = {**WORKFLOW, "status": WORKFLOW_STATUS}
POD: Desc = {
    "metadata": META,
    "spec": {
        "containers": ("list", CONTAINER),
        "priority": "int32",
        "priorityClassName": "string",
        "preemptionPolicy": "string",
        "nodeName": "string",
        "terminationGracePeriodSeconds": "int",
    },
    "status": {
        "phase": "string",
        "message": "string",
        "startTime": "string",
        "nominatedNodeName": "string",
        "conditions": ("list", {"type": "string", "status": "string", "message": "string"}),
        "containerStatuses": (
            "list",
            {"allocatedResources": ("map", "quantity"), "resources": RESOURCES},
        ),
    },
}
PRIORITY_CLASS: Desc = {
    "metadata": META,
    "value": "int32",
    "description": "string",
    "globalDefault": "bool",
    "preemptionPolicy": "string",
}


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


_RANGE = {"int": 2**63, "int32": 2**31}


class ShapeError(ApiError):
    """A body that Go's decoder would refuse: 400 with its message.

    Attributes:
        field: Dotted path of the offending value (list items do not add an index, as in Go).
        expected: The Go type the field has.
        actual: The JSON type found (``string``, ``number``, ...).
    """

    def __init__(self, field: str, expected: str, actual: str) -> None:
        super().__init__(
            400, f"json: cannot unmarshal {actual} into Go struct field {field} of type {expected}"
        )
        self.field = field
        self.expected = expected
        self.actual = actual


def _ok(value: Any, desc: str) -> bool:
    kind = _json_type(value)
    if desc in _RANGE and kind == "number":
        if isinstance(value, float) and not value.is_integer():
            return False
        return bool(-_RANGE[desc] <= value < _RANGE[desc])
    allowed = {
        "string": ("string",),
        "int": ("number",),
        "int32": ("number",),
        "bool": ("bool",),
        "scalar": ("string", "number", "bool"),
        "quantity": ("string", "number"),
        "intstr": ("string", "number"),
    }[desc]
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
    """Raise a 400 like Go's decoder when ``value`` does not fit ``desc`` (``null`` always fits).

    Iterative, so a deeply nested value cannot exhaust the interpreter's stack.

    Raises:
        ShapeError: The first value of the wrong type.
    """
    stack: list[tuple[Any, Desc, str]] = [(value, desc, path)]
    while stack:
        item, inner, where = stack.pop()
        if item is None:
            continue
        children = None if isinstance(inner, str) else _children(item, inner, where)
        if (isinstance(inner, str) and not _ok(item, inner)) or (
            not isinstance(inner, str) and children is None
        ):
            raise ShapeError(where, _go_type(inner), _json_type(item))
        stack.extend(reversed(children or []))
