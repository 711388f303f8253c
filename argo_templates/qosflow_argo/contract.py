"""The published contracts every manifest and every Argo Server exchange is checked against.

* Argo kinds (``Workflow``, ``WorkflowTemplate``) against Argo v4.1.2's ``schema.json``, patched as
  the upstream README says (IntOrString and Quantity accept numbers), in a *strict* variant that
  sets ``additionalProperties: false`` on every object definition, so typos and fields removed in
  v4 (``spec.podPriority``) are caught.
* Core kinds (PriorityClass, ServiceAccount, Role, ...) with
  ``kubernetes_validate.validate(doc, "1.33.0", strict=True)``.
* Argo Server requests and responses against ``swagger.json`` (:class:`SwaggerContract`), with
  ``Time`` nullable because Go writes a zero time as ``null``.

:func:`check_manifest` raises :class:`~qosflow.core.errors.SpecError` naming the kind, object and field,
so a bad manifest never leaves the client.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
from jsonschema import Draft4Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError

from qosflow.core.errors import SpecError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
KUBERNETES_VERSION = "1.33.0"
ARGO_KINDS = frozenset({"Workflow", "WorkflowTemplate", "CronWorkflow", "ClusterWorkflowTemplate"})
_DEF = "io.argoproj.workflow.v1alpha1."
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    return data


def _patch(definitions: dict[str, Any], *, strict: bool, nullable_times: bool) -> None:
    definitions[_INT_OR_STRING] = {"type": ["string", "integer"]}
    definitions[_QUANTITY] = {"type": ["string", "number"]}
    if nullable_times:  # server responses: Go writes zero times and nil list items as null
        definitions[_TIME] = {"type": ["string", "null"], "format": "date-time"}
        for name, definition in definitions.items():
            items = definition.get("properties", {}).get("items")
            if name.endswith("List") and items and items.get("type") == "array":
                definition["properties"]["items"] = {"anyOf": [items, {"type": "null"}]}
    if strict:
        for definition in definitions.values():
            if (
                definition.get("type") == "object"
                and "properties" in definition
                and "additionalProperties" not in definition
            ):
                definition["additionalProperties"] = False


@functools.cache
def argo_validator(kind: str, *, strict: bool = True, nullable_times: bool = False) -> Any:
    """A cached ``Draft202012Validator`` for one Argo kind of ``schema.json``.

    Args:
        kind: ``Workflow``, ``WorkflowTemplate``, ... (a definition under ``v1alpha1``).
        strict: Reject unknown fields (catches typos and fields removed in Argo v4).
        nullable_times: Accept ``null`` times, as the server writes them.
    """
    root = _load("schema.json")
    schema = {k: v for k, v in root.items() if k != "oneOf"}
    schema["definitions"] = copy.deepcopy(root["definitions"])
    _patch(schema["definitions"], strict=strict, nullable_times=nullable_times)
    schema["$ref"] = f"#/definitions/{_DEF}{kind}"
    return Draft202012Validator(schema)


def _first_error(validator: Any, doc: Mapping[str, Any]) -> ValidationError | None:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return errors[0] if errors else None


def _where(doc: Mapping[str, Any], path: Any) -> str:
    meta = doc.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "?"
    dotted = ".".join(str(p) for p in path)
    return f"{doc.get('kind', '?')}/{name}" + (f": {dotted}" if dotted else "")


def manifest_error(doc: Mapping[str, Any]) -> ValidationError | None:
    """The first schema error of an Argo manifest (strict, patched ``schema.json``), or ``None``."""
    kind = doc.get("kind")
    if kind not in ARGO_KINDS:
        raise SpecError("kind", f"not an Argo kind (got {kind!r})")
    return _first_error(argo_validator(str(kind)), doc)


def check_manifest(doc: Mapping[str, Any]) -> None:
    """Validate one manifest; raise ``SpecError`` naming the kind, name and field when it is bad.

    Argo kinds go through the strict, patched ``schema.json`` plus the semantic rules the schema
    cannot express (an entrypoint or a template reference, containers with images); every other
    kind goes through ``kubernetes_validate`` (strict, Kubernetes 1.33).
    """
    kind = doc.get("kind")
    if not isinstance(kind, str):
        raise SpecError("kind", "every manifest needs a kind")
    if kind in ARGO_KINDS:
        error = _first_error(argo_validator(kind), doc)
        if error is not None:
            raise SpecError(_where(doc, error.absolute_path), error.message)
        _check_argo_semantics(doc)
        return
    try:
        kubernetes_validate.validate(dict(doc), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise SpecError(_where(doc, exc.path), exc.message) from None
    except kubernetes_validate.SchemaNotFoundError:
        raise SpecError(_where(doc, []), f"unknown kind {kind!r}") from None


def _check_argo_semantics(doc: Mapping[str, Any]) -> None:
    spec = doc.get("spec") or {}
    if doc["kind"] == "Workflow" and spec.get("workflowTemplateRef"):
        return
    templates = {t.get("name"): t for t in spec.get("templates") or []}
    entry = spec.get("entrypoint")
    if not entry:
        raise SpecError(_where(doc, ["spec", "entrypoint"]), "is required")
    if entry not in templates:
        raise SpecError(_where(doc, ["spec", "entrypoint"]), f"template name {entry!r} undefined")
    for name, template in templates.items():
        container = template.get("container")
        if container is not None and not container.get("image"):
            raise SpecError(
                _where(doc, ["spec", "templates", name, "container", "image"]), "is required"
            )


class SwaggerContract:
    """The Argo Server REST contract (``swagger.json``).

    Matches a request to its operation and validates the request body and the response body
    against the declared definitions.
    """

    def __init__(self) -> None:
        """Load ``swagger.json`` and compile the path templates."""
        swagger = _load("swagger.json")
        definitions = copy.deepcopy(swagger["definitions"])
        _patch(definitions, strict=False, nullable_times=True)
        self._definitions = definitions
        self._routes: list[tuple[re.Pattern[str], dict[str, Any]]] = []
        for template, operations in swagger["paths"].items():
            pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
            self._routes.append((re.compile(f"^{pattern}$"), operations))
        # literal segments first: `/workflows/{ns}/submit` beats `/workflows/{ns}/{name}`
        self._routes.sort(key=lambda r: r[0].pattern.count("[^/]+"))

    def operation(self, method: str, path: str) -> dict[str, Any]:
        """The swagger operation of ``method path``; ``KeyError`` when the server has none."""
        for pattern, operations in self._routes:
            if pattern.match(path) and method.lower() in operations:
                op: dict[str, Any] = operations[method.lower()]
                return op
        raise KeyError(f"{method} {path} is not an Argo Server endpoint")

    def _validate(self, schema: Mapping[str, Any], body: Any, what: str) -> None:
        validator = Draft4Validator({**schema, "definitions": self._definitions})
        error = _first_error(validator, body)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise AssertionError(f"{what}: {where}: {error.message}")

    def check_request(self, method: str, path: str, body: Any) -> None:
        """Raise ``AssertionError`` when the body does not match the operation's body schema."""
        op = self.operation(method, path)
        params = [p for p in op.get("parameters", []) if p.get("in") == "body"]
        if not params:
            if body not in (None, {}, b"", ""):
                raise AssertionError(f"{method} {path}: takes no body")
            return
        self._validate(params[0]["schema"], body, f"request {method} {path}")

    def check_response(self, method: str, path: str, status: int, body: Any) -> None:
        """Raise ``AssertionError`` when a response body does not match the declared schema."""
        op = self.operation(method, path)
        responses = op.get("responses", {})
        spec = responses.get(str(status)) if status < 400 else responses.get("default")
        if spec is None:
            spec = responses.get("default")
        if spec is None or "schema" not in spec:
            return
        self._validate(spec["schema"], body, f"response {status} {method} {path}")
        if status >= 400 and not isinstance(body.get("message"), str):
            raise AssertionError(f"response {status} {method} {path}: error without a message")
