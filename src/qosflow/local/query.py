"""Kubernetes-style selectors and Argo's ``fields`` filter, for the list and get endpoints.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a`` and ``!a``,
comma-separated (all must hold). Field selectors: ``path=value`` / ``path!=value`` over dotted
paths such as ``metadata.name`` or ``status.phase``. The Argo ``fields`` parameter keeps the listed
dotted paths, or drops them when the list starts with ``-``. Numeric parameters (``limit``,
``tailLines``...) are checked by :func:`int_param`, and :func:`page` cuts a list at ``limit`` with
an offset as its ``continue`` token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from qosflow.local.status import ApiError

Predicate = Callable[[Mapping[str, Any]], bool]
Query = Mapping[str, list[str]]

_SET_EXPR = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_EXPR = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_EXPR = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Predicate:
    """Compile one label-selector term."""
    if match := _SET_EXPR.match(term):
        key, op, raw = match.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_EXPR.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_EXPR.match(term):
        negate, key = match.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ApiError(
        400, f"unable to parse requirement: found '{term.strip()}', expected: identifier"
    )


def label_selector(text: str | None) -> Predicate:
    """Compile a label selector into a predicate over an object's ``metadata.labels``."""
    terms = [_label_term(t) for t in _split_terms(text or "")]

    def match(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return match


def get_path(obj: Any, path: str) -> Any:
    """Value at a dotted path, or ``None`` when any step is missing."""
    for key in path.split("."):
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def field_selector(text: str | None, supported: frozenset[str]) -> Predicate:
    """Compile a field selector; only the ``supported`` dotted paths are accepted (400 otherwise)."""
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(text or ""):
        match = _EQ_EXPR.match(term)
        if match is None:
            raise ApiError(400, f"invalid selector: '{term.strip()}'; can't understand")
        path, op, value = match.groups()
        if path not in supported:
            raise ApiError(400, f'field label not supported: "{path}"')
        terms.append((path, op != "!=", value))

    def match_all(obj: Mapping[str, Any]) -> bool:
        return all((str(get_path(obj, p) or "") == v) is eq for p, eq, v in terms)

    return match_all


def _keep(obj: Any, parts: list[str]) -> Any:
    """The part of ``obj`` reachable by ``parts`` (lists are mapped element-wise)."""
    if not parts:
        return obj
    if isinstance(obj, list):
        return [_keep(item, parts) for item in obj]
    if not isinstance(obj, Mapping) or parts[0] not in obj:
        return {}
    return {parts[0]: _keep(obj[parts[0]], parts[1:])}


def _merge(into: dict[str, Any], part: Any) -> None:
    """Merge the tree ``part`` (from :func:`_keep`) into ``into``."""
    if not isinstance(part, dict):
        return
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            for mine, theirs in zip(into[key], value, strict=False):
                if isinstance(mine, dict):
                    _merge(mine, theirs)
        else:
            into[key] = value


def _drop(obj: Any, parts: list[str]) -> None:
    """Delete the path ``parts`` from ``obj`` in place (lists element-wise)."""
    if isinstance(obj, list):
        for item in obj:
            _drop(item, parts)
        return
    if not isinstance(obj, dict) or parts[0] not in obj:
        return
    if len(parts) == 1:
        del obj[parts[0]]
    else:
        _drop(obj[parts[0]], parts[1:])


def apply_fields(obj: dict[str, Any], fields: str | None) -> dict[str, Any]:
    """Apply Argo's ``fields`` parameter (``a.b,c`` keeps, ``-a.b,c`` drops) to a copy of ``obj``."""
    if not fields:
        return obj
    exclude = fields.startswith("-")
    paths = [p.strip().lstrip("-") for p in fields.split(",") if p.strip().lstrip("-")]
    if exclude:
        for path in paths:
            _drop(obj, path.split("."))
        return obj
    result: dict[str, Any] = {}
    for path in paths:
        _merge(result, _keep(obj, path.split(".")))
    return result


def int_param(query: Query, name: str, *, minimum: int = 0) -> int | None:
    """A non-negative integer query parameter, ``None`` when absent (400 naming it otherwise)."""
    values = query.get(name)
    if not values or values[0] == "":
        return None
    text = values[0].strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,18}", text):
        raise ApiError(
            400, f'{name}: Invalid value: "{values[0]}": strconv.ParseInt: invalid syntax'
        )
    if int(text) < minimum:
        raise ApiError(
            400, f'{name}: Invalid value: "{values[0]}": must be greater than or equal to {minimum}'
        )
    return int(text)


def page(
    items: list[Any], query: Query, limit_key: str, continue_key: str
) -> tuple[list[Any], str]:
    """``(the page, the continue token of the next one or "")`` for ``limit``/``continue``."""
    limit = int_param(query, limit_key) or 0
    token = (query.get(continue_key) or [""])[0]
    if token and not token.isdigit():
        raise ApiError(400, f'{continue_key}: Invalid value: "{token}": continue key is not valid')
    offset = int(token or 0)
    if limit <= 0:
        return items[offset:], ""
    more = offset + limit < len(items)
    return items[offset : offset + limit], str(offset + limit) if more else ""
