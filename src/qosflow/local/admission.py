"""What may enter the store: the values the controller and the node will use, checked up front.

The controller parses quantities, retry settings and ``podSpecPatch`` on every tick; a value it
cannot parse must be refused where it comes in, naming the field, never met later (where it would
stop every tick). So:

* :func:`check_spec_literals` checks a workflow's or template's values at create. A container's
  resource quantities must be literal quantities, as Argo's server decodes them into
  ``resource.Quantity`` (``{{...}}`` is refused with Go's message: parameterise resources with a
  ``podSpecPatch``); other values with ``{{...}}`` are checked after substitution, by
  :func:`check_step` when the plan is made; the fields the pods get (volumes, mounts, env
  sources, node selection) must have their Go types (:func:`check_pod_fields`);
* :func:`check_pod` is the API server's validation of the pods the controller creates (a failure is
  a pod-creation error: the node goes Error, as upstream);
* :func:`stored_problem` checks every object of ``state.json`` at start-up (the store quarantines
  the ones it refuses).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from qosflow.local.body import SafeYamlLoader
from qosflow.local.names import name_problem, namespace_problem
from qosflow.local.pod_validation import pod_causes
from qosflow.local.quantity import parse as parse_quantity
from qosflow.local.shapes import POD, PRIORITY_CLASS, STORED_WORKFLOW, ShapeError, check
from qosflow.local.status import ApiError, invalid

Obj = dict[str, Any]
_STRINGS = ("map", "string")
_KEY_REF = {"name": "string", "key": "string", "optional": "bool"}
_ENV_SOURCE = {"name": "string", "optional": "bool"}
_CONTAINER_FIELDS = {
    "env": (
        "list",
        {
            "name": "string",
            "value": "string",
            "valueFrom": {
                "configMapKeyRef": _KEY_REF,
                "secretKeyRef": _KEY_REF,
                "fieldRef": {"apiVersion": "string", "fieldPath": "string"},
                "resourceFieldRef": {
                    "containerName": "string",
                    "resource": "string",
                    "divisor": "quantity",
                },
            },
        },
    ),
    "envFrom": (
        "list",
        {"prefix": "string", "configMapRef": _ENV_SOURCE, "secretRef": _ENV_SOURCE},
    ),
    "volumeMounts": (
        "list",
        {"name": "string", "mountPath": "string", "subPath": "string", "readOnly": "bool"},
    ),
    "workingDir": "string",
}
_POD_FIELDS = {
    "volumes": ("list", {"name": "string"}),
    "nodeSelector": _STRINGS,
    "affinity": {},
    "tolerations": ("list", {"key": "string", "operator": "string", "value": "string"}),
    "serviceAccountName": "string",
    "container": _CONTAINER_FIELDS,
}
_SPEC_FIELDS = {
    **_POD_FIELDS,
    "imagePullSecrets": ("list", {"name": "string"}),
    "podMetadata": {"labels": _STRINGS, "annotations": _STRINGS},
    "templateDefaults": _POD_FIELDS,
    "templates": ("list", _POD_FIELDS),
}
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_INTEGER = re.compile(r"^[+-]?\d+$")
NAMESPACED = ("Workflow", "WorkflowTemplate", "Pod")


def templated(value: Any) -> bool:
    """Whether ``value`` is a string with a ``{{...}}`` expression (checked after substitution)."""
    return isinstance(value, str) and "{{" in value


def duration_s(value: Any) -> float:
    """A Go duration (``10s``, ``1m30s``) or a number of seconds, in seconds.

    Raises:
        ValueError: ``not a duration like 10s or 1m30s (got ...)``.
    """
    if value is None or value == "":
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration like 10s or 1m30s (got {value!r})")
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _integer(value: Any) -> bool:
    """Whether an IntOrString holds an integer (``3`` or ``"3"``)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and _INTEGER.match(value.strip()) is not None


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, f"{field}: {message}")


def check_quantities(resources: Any, field: str, *, literal_only: bool = False) -> None:
    """Every request and limit of a container's ``resources`` parses as a quantity (400)."""
    for kind in ("requests", "limits"):
        for res, value in ((resources or {}).get(kind) or {}).items():
            if value is None or (literal_only and templated(value)):
                continue
            try:
                parse_quantity(value)
            except ValueError as exc:
                raise _bad(f"{field}.{kind}.{res}", str(exc)) from None


def check_retry(strategy: Any, field: str, *, literal_only: bool = False) -> None:
    """``retryStrategy.limit`` and ``backoff.factor`` are integers, durations parse (400)."""
    if not strategy:
        return
    backoff = strategy.get("backoff") or {}
    for where, value in (
        ("limit", strategy.get("limit")),
        ("backoff.factor", backoff.get("factor")),
    ):
        if value is None or (literal_only and templated(value)):
            continue
        if not _integer(value):
            raise _bad(f"{field}.{where}", f"must be an integer (got {value!r})")
    for key in ("duration", "maxDuration"):
        value = backoff.get(key)
        if literal_only and templated(value):
            continue
        try:
            duration_s(value)
        except ValueError as exc:
            raise _bad(f"{field}.backoff.{key}", str(exc)) from None


def pod_spec_patch(patch: Any, field: str, *, literal_only: bool = False) -> Obj:
    """A ``podSpecPatch`` (JSON or YAML) as a mapping; 400 when it is not one or is malformed."""
    if patch is None or patch == "" or (literal_only and templated(patch)):
        return {}
    try:
        doc = yaml.load(patch, Loader=SafeYamlLoader) if isinstance(patch, str) else patch
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _bad(field, f"not valid JSON or YAML: {first}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _bad(field, f"must be a mapping (a PodSpec), got {type(doc).__name__}")
    grace = doc.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool) or grace < 0):
        raise _bad(
            f"{field}.terminationGracePeriodSeconds",
            f"must be a non-negative integer (got {grace!r})",
        )
    return doc


def check_step(template: Obj, where: str) -> None:
    """The substituted template of one pod step: quantities, retry settings, ``podSpecPatch``."""
    check_quantities(
        (template.get("container") or {}).get("resources"), f"{where}.container.resources"
    )
    check_retry(template.get("retryStrategy"), f"{where}.retryStrategy")
    pod_spec_patch(template.get("podSpecPatch"), f"{where}.podSpecPatch")


def check_spec_literals(spec: Obj) -> None:
    """The values of a workflow or template spec that must parse as sent (400)."""
    pod_spec_patch(spec.get("podSpecPatch"), "spec.podSpecPatch", literal_only=True)
    check_pod_fields(spec)
    defaults = spec.get("templateDefaults")
    named = [(f"templates.{t.get('name', '')}", t) for t in spec.get("templates") or []]
    for where, template in [*named, *([("templateDefaults", defaults)] if defaults else [])]:
        resources = (template.get("container") or {}).get("resources")
        check_quantities(resources, f"{where}.container.resources")
        check_retry(template.get("retryStrategy"), f"{where}.retryStrategy", literal_only=True)
        pod_spec_patch(template.get("podSpecPatch"), f"{where}.podSpecPatch", literal_only=True)


def check_pod_fields(spec: Obj) -> None:
    """The Go types of the fields the pods get (400 like Go's decoder)."""
    check(spec, _SPEC_FIELDS, "WorkflowSpec")


def container_causes(index: int, container: Any) -> list[tuple[str, str]]:
    """The API server's rules for one container: env names, quantities >= 0, request <= limit."""
    path = f"spec.containers[{index}]"
    if not isinstance(container, dict):
        return [(path, "Required value")]
    causes = [
        (f"{path}.env[{i}].name", "Required value")
        for i, env in enumerate(container.get("env") or [])
        if not isinstance(env, dict) or not env.get("name")
    ]
    resources = container.get("resources") or {}
    values: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        for res, raw in (resources.get(kind) or {}).items():
            field = f"{path}.resources.{kind}[{res}]"
            try:
                number = parse_quantity(raw)
            except ValueError as exc:
                causes.append((field, f'Invalid value: "{raw}": {exc}'))
                continue
            values.setdefault(kind, {})[res] = number
            if number < 0:
                causes.append(
                    (field, f'Invalid value: "{raw}": must be greater than or equal to 0')
                )
    requests, limits = values.get("requests", {}), values.get("limits", {})
    for res in sorted(set(requests) & set(limits)):
        if requests[res] > limits[res]:
            causes.append(
                (
                    f"{path}.resources.requests",
                    f'Invalid value: "{resources["requests"][res]}": must be less than or equal '
                    f"to {res} limit of {resources['limits'][res]}",
                )
            )
    return causes


def check_pod(pod: Obj) -> None:
    """The API server's validation of a pod the controller creates (422 Invalid)."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    causes = [("metadata.name", p) for p in [name_problem(name)] if p]
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        causes.append(("spec.containers", "Required value"))
    for index, container in enumerate(containers):
        causes.extend(container_causes(index, container))
    causes.extend(pod_causes(pod.get("spec") or {}))
    if causes:
        raise invalid("Pod", name, causes)


def _meta_problem(obj: Obj) -> str | None:
    """Name and namespace rules of a stored object (they become paths)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "metadata is not an object"
    problem = name_problem(meta.get("name"))
    if problem is not None:
        return f"metadata.name: {problem}"
    namespace = meta.get("namespace", "")
    if obj.get("kind") in NAMESPACED:
        problem = namespace_problem(namespace)
        return f"metadata.namespace: {problem}" if problem else None
    return None if namespace in ("", None) else "metadata.namespace: must be empty"


_STORED = {"Workflow": STORED_WORKFLOW, "WorkflowTemplate": STORED_WORKFLOW, "Pod": POD}


def stored_problem(obj: Any) -> str | None:
    """Why an object read from ``state.json`` cannot be served, or ``None`` when it is sound."""
    if not isinstance(obj, dict):
        return "not an object"
    kind = obj.get("kind")
    desc = PRIORITY_CLASS if kind == "PriorityClass" else _STORED.get(str(kind))
    if desc is None:
        return f"unknown kind {kind!r}"
    problem = _meta_problem(obj)
    if problem is not None:
        return problem
    try:
        check(obj, desc, str(kind))
        if kind == "Pod":
            check_pod(obj)
            if not isinstance(obj.get("status"), dict):
                return "status is not an object"
            for status in obj["status"].get("containerStatuses") or []:
                for value in (status.get("allocatedResources") or {}).values():
                    parse_quantity(value)
        if kind == "PriorityClass" and not isinstance(obj.get("value"), int):
            return "value: Required value"
    except (ShapeError, ApiError, ValueError) as exc:
        return str(exc)
    return None
