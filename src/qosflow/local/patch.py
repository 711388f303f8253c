"""The three patch formats of the Kubernetes API: JSON merge, strategic merge and JSON patch.

* JSON merge patch (RFC 7386): objects merge, ``null`` deletes, lists are replaced.
* Strategic merge patch: like a merge patch, but lists of objects with a merge key are merged
  item by item (``containers``, ``env``, ``resizePolicy``... by ``name`` / ``resourceName``).
* JSON patch (RFC 6902): ``add``, ``remove``, ``replace``, ``test`` (``move``/``copy`` too).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from qosflow.local.status import ApiError

POD_MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "volumes": "name",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "resizePolicy": "resourceName",
}
"""The ``patchMergeKey`` of the pod's lists (``k8s.io/api/core/v1``); other lists are replaced."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge of ``patch`` into a copy of ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(
    target: Any, patch: Any, key: str = "", keys: Mapping[str, str] = POD_MERGE_KEYS
) -> Any:
    """Strategic merge of ``patch`` into a copy of ``target``.

    Args:
        target: The original document.
        patch: The patch; ``null`` deletes a field, maps merge, lists named in ``keys`` merge
            item by item on their merge key, other lists are replaced.
        key: The field name of ``target`` (for its merge key).
        keys: Field name -> merge key of the document's type (a pod's by default).
    """
    if isinstance(patch, list) and key in keys and isinstance(target, list):
        field = keys[key]
        merged = [copy.deepcopy(item) for item in target]
        for item in patch:
            if not isinstance(item, dict) or field not in item:
                raise ApiError(400, f"map: {item!r} does not contain declared merge key: {field}")
            index = next(
                (
                    i
                    for i, t in enumerate(merged)
                    if isinstance(t, dict) and t.get(field) == item[field]
                ),
                None,
            )
            if index is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[index] = strategic_merge(merged[index], item, "", keys)
        return merged
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge(result.get(name), value, name, keys)
    return result


def _pointer(path: str) -> list[str]:
    """RFC 6901 pointer -> tokens."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(
            422,
            f"the server rejected our request due to an error in our request: invalid path {path!r}",
        )
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> tuple[Any, str]:
    """The container of the pointer's last token."""
    for token in tokens[:-1]:
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc, tokens[-1]


def _get(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent, last = _parent(doc, tokens)
    return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)


def _add(doc: Any, tokens: list[str], value: Any) -> None:
    parent, last = _parent(doc, tokens)
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value


def json_patch(target: Any, ops: Any) -> Any:
    """Apply an RFC 6902 patch to a copy of ``target`` (422 on a failed op or test)."""
    if not isinstance(ops, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict):
            raise ApiError(
                400,
                f"json: cannot unmarshal {type(op).__name__} into Go value of type jsonpatch.Operation",
            )
        kind, tokens = op.get("op"), _pointer(str(op.get("path", "")))
        try:
            if kind == "test" and _get(doc, tokens) != op.get("value"):
                raise ApiError(
                    422,
                    f"the server rejected our request due to an error in our request: testing value {op.get('path')} failed",
                )
            if kind in ("remove", "replace"):
                _remove(doc, tokens)
            if kind in ("add", "replace"):
                _add(doc, tokens, copy.deepcopy(op.get("value")))
            if kind in ("move", "copy"):
                source = _pointer(str(op.get("from", "")))
                value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
                _add(doc, tokens, value)
            if kind not in ("add", "remove", "replace", "test", "move", "copy"):
                raise ApiError(422, f"Unexpected kind: {kind}")
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
            raise ApiError(
                422,
                "the server rejected our request due to an error in our request: "
                f"{kind} operation does not apply: doc is missing path: {op.get('path')}: {exc}",
            ) from exc
    return doc


MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def apply_patch(target: Any, body: Any, content_type: str, *, strategic_ok: bool) -> Any:
    """Apply a patch by content type; 415 for an unknown type (or strategic on a custom resource)."""
    media = content_type.split(";")[0].strip().lower()
    if media == JSON_PATCH:
        return json_patch(target, body)
    if media in (MERGE, APPLY):
        return merge_patch(target, body)
    if media == STRATEGIC and strategic_ok:
        return strategic_merge(target, body)
    accepted = [JSON_PATCH, MERGE, APPLY] + ([STRATEGIC] if strategic_ok else [])
    raise ApiError(
        415,
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )
