"""The schemas exchanges are checked against, built once and cached.

* Kubernetes objects: the ``$defs`` of ``kubernetes_validate``'s ``_definitions.json``. Requests use
  :data:`K8S_REQUEST` (1.33, the oldest API server the client supports), strict
  (``additionalProperties: false``, so a typo fails); patch bodies the same with every ``required``
  dropped (a patch is a partial object). Responses use :data:`K8S_RESPONSE`, strict too: the
  version the local cluster reports on ``GET /version`` (a real 1.35 server returns 1.35 fields),
  so a field the emulation invents, or misspells, fails. Reads are checked against the request
  version: a field only a newer server sends reads as ``None`` on 1.33.
* Argo kinds served by the Kubernetes API (the Workflow custom resource):
  :func:`qosflow_argo.contract.argo_validator` (strict, patched ``schema.json``; times nullable in
  responses; ``required`` dropped for merge patches).
* Argo Server bodies: ``swagger.json`` through :class:`qosflow_argo.contract.SwaggerContract`, plus a
  strict copy of its definitions (closed objects) for requests (the server silently drops unknown
  fields, so a typo would be lost) and for responses (a field the emulation invents fails).

:func:`declared` walks a read path through a schema (``$ref``, ``allOf``/``anyOf``/``oneOf``,
``properties``, ``items``, ``additionalProperties`` maps) and says whether it is declared.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

from jsonschema import Draft4Validator, Draft202012Validator
from jsonschema.exceptions import best_match

from contract_recorder.tracking import ITEM, Path_
from qosflow_argo.contract import SCHEMA_DIR, SwaggerContract, argo_validator

K8S_REQUEST = "1.33.0"
K8S_RESPONSE = "1.35.0"
_K8S = "#/$defs/"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"


def first_error(validator: Any, doc: Any) -> str | None:
    """The most relevant schema error as ``path: message`` (shortened), or ``None``."""
    error = best_match(validator.iter_errors(doc))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    message = error.message if len(error.message) <= 240 else error.message[:237] + "..."
    return f"{where}: {message}"


def drop_required(schema: Any) -> Any:
    """A copy of ``schema`` without ``required`` keywords (``properties`` names are kept)."""
    if isinstance(schema, list):
        return [drop_required(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "required" and isinstance(value, list):
            continue
        if key in ("properties", "definitions", "$defs", "patternProperties"):
            out[key] = {name: drop_required(sub) for name, sub in value.items()}
        else:
            out[key] = drop_required(value)
    return out


# ---------------------------------------------------------------------------------- Kubernetes
@functools.cache
def k8s_defs(version: str, *, strict: bool = True, partial: bool = False) -> dict[str, Any]:
    """The ``$defs`` of one Kubernetes version and flavour."""
    flavour = f"v{version}-local" + ("-strict" if strict else "")
    base = files("kubernetes_validate") / "kubernetes-json-schema" / flavour
    defs: dict[str, Any] = json.loads((base / "_definitions.json").read_text())["$defs"]
    return drop_required(defs) if partial else defs


@functools.cache
def k8s_root(version: str, *, strict: bool = True, partial: bool = False) -> dict[str, Any]:
    """A root document holding the definitions (what ``$ref: #/$defs/...`` resolves in)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": k8s_defs(version, strict=strict, partial=partial),
    }


@functools.cache
def k8s_validator(name: str, version: str, *, partial: bool = False) -> Any:
    """A cached strict validator of one Kubernetes definition (``io.k8s.api.core.v1.Pod``)."""
    root = dict(k8s_root(version, partial=partial))
    if name not in root["$defs"]:
        raise KeyError(f"no Kubernetes {version} definition {name}")
    root["$ref"] = _K8S + name
    return Draft202012Validator(root)


# ---------------------------------------------------------------------------------- Argo kinds
@functools.cache
def crd_validator(kind: str, *, response: bool, partial: bool = False) -> Any:
    """An Argo kind as the Kubernetes API carries it (strict; nullable times in responses)."""
    full = argo_validator(kind, strict=True, nullable_times=response)
    if not partial:
        return full
    return Draft202012Validator(drop_required(copy.deepcopy(full.schema)))


# ---------------------------------------------------------------------------------- Argo Server
@functools.cache
def swagger_contract() -> SwaggerContract:
    """The project's Argo Server contract (one instance for the session)."""
    return SwaggerContract()


@functools.cache
def swagger(strict: bool = False) -> dict[str, Any]:
    """``swagger.json`` patched like ``SwaggerContract`` (and, when strict, closed objects)."""
    doc: dict[str, Any] = json.loads((SCHEMA_DIR / "swagger.json").read_text(encoding="utf-8"))
    defs = doc["definitions"]
    defs[_INT_OR_STRING] = {"type": ["string", "integer"]}
    defs[_QUANTITY] = {"type": ["string", "number"]}
    defs[_TIME] = {"type": ["string", "null"], "format": "date-time"}
    for name, definition in defs.items():  # Go writes an empty list as `items: null`
        items = definition.get("properties", {}).get("items")
        if name.endswith("List") and items and items.get("type") == "array":
            definition["properties"]["items"] = {"anyOf": [items, {"type": "null"}]}
    if strict:
        for definition in defs.values():
            if (
                definition.get("type") == "object"
                and "properties" in definition
                and "additionalProperties" not in definition
            ):
                definition["additionalProperties"] = False
    return doc


@functools.cache
def _swagger_strict_validator(ref: str) -> Any:
    return Draft4Validator({"$ref": ref, "definitions": swagger(strict=True)["definitions"]})


def swagger_strict_error(schema: dict[str, Any], body: Any) -> str | None:
    """The first error of ``body`` against a swagger body schema with closed objects."""
    ref = schema.get("$ref")
    if ref is None:
        validator = Draft4Validator({**schema, "definitions": swagger(strict=True)["definitions"]})
    else:
        validator = _swagger_strict_validator(ref)
    return first_error(validator, body)


# ---------------------------------------------------------------------------------- reads
def _deref(root: dict[str, Any], node: Any) -> Any:
    seen = 0
    while isinstance(node, dict) and "$ref" in node and seen < 50:
        ref = node["$ref"]
        target: Any = root
        for part in ref.split("#", 1)[1].strip("/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node, seen = target, seen + 1
    return node


def _expand(root: dict[str, Any], node: Any) -> Iterator[dict[str, Any]]:
    node = _deref(root, node)
    if not isinstance(node, dict):
        return
    yield node
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(key) or ():
            yield from _expand(root, branch)


def _free_form(node: dict[str, Any]) -> bool:
    types = node.get("type")
    types = [types] if isinstance(types, str) else types or ["object"]
    structural = ("properties", "items", "allOf", "anyOf", "oneOf", "enum", "$ref")
    if any(k in node for k in structural) or "object" not in types:
        return False
    return node.get("additionalProperties", True) is True or bool(
        node.get("x-kubernetes-preserve-unknown-fields")
    )


def _step(root: dict[str, Any], nodes: list[Any], segment: str) -> tuple[list[Any], str, bool]:
    """Next schema nodes for one segment, the segment as reported, and 'free-form from here'."""
    found: list[Any] = []
    shown = "*"
    for node in (n for start in nodes for n in _expand(root, start)):
        if segment == ITEM:
            if "items" in node:
                found.append(node["items"])
            continue
        properties = node.get("properties") or {}
        if segment in properties:
            found.append(properties[segment])
            shown = segment
        elif isinstance(node.get("additionalProperties"), dict):
            found.append(node["additionalProperties"])
        elif _free_form(node):
            return [], segment, True
    return found, ITEM if segment == ITEM else shown, False


def declared(root: dict[str, Any], schema: Any, path: Path_) -> tuple[str, str | None]:
    """``(normalised path, None)`` when ``path`` is declared, else ``(path, problem)``.

    Map keys (``additionalProperties``) are reported as ``*``, list items as ``[]``.
    """
    nodes, shown = [schema], []
    for index, segment in enumerate(path):
        nodes, name, free = _step(root, nodes, segment)
        if free:
            return render((*shown, *path[index:])), None
        if not nodes:
            where = render((*shown, segment))
            return where, f"{where} is not declared in the response schema"
        shown.append(name)
    return render(tuple(shown)), None


def render(path: Path_) -> str:
    """``("items", "[]", "metadata", "name")`` → ``items[].metadata.name``."""
    out = ""
    for segment in path:
        out += segment if segment == ITEM else (f".{segment}" if out else segment)
    return out
