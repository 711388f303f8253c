"""Field errors and ``ObjectMeta`` validation with the API server's messages.

A validation failure is a list of :data:`Cause` (``field``, ``message``) turned into the 422
``Invalid`` :class:`~qosflow.local.status.ApiError` by :func:`invalid_error`, with upstream's
``details.causes`` reasons (``FieldValueRequired``, ``FieldValueNotSupported``...) and upstream's
aggregate message (``[a, b]`` for several causes). A body Go's decoder would refuse is a 400
``<Kind> in version "v1" cannot be handled as a <Kind>: ...`` (:func:`decode_error`).
"""

from __future__ import annotations

import re
from typing import Any

from qosflow.local.names import LABEL_MESSAGE, LABEL_RE, SUBDOMAIN_MESSAGE, SUBDOMAIN_RE
from qosflow.local.status import ApiError

Cause = tuple[str, str]
_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Forbidden", "FieldValueForbidden"),
    ("Too long", "FieldValueTooLong"),
    ("Duplicate value", "FieldValueDuplicate"),
)
_QNAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QNAME_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
    "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
MAX_ANNOTATION_BYTES = 256 * 1024


def quote(value: Any) -> str:
    """A value as Go's ``%q`` shows a string (a list as ``[]string{"a"}``)."""
    if isinstance(value, list):
        return "[]string{" + ", ".join(quote(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def bad(field: str, value: Any, detail: str) -> Cause:
    """``field.Invalid``."""
    return field, f"Invalid value: {quote(value)}: {detail}"


def required(field: str, detail: str = "") -> Cause:
    """``field.Required``."""
    return field, "Required value" + (f": {detail}" if detail else "")


def unsupported(field: str, value: Any, allowed: list[str]) -> Cause:
    """``field.NotSupported`` (the supported values sorted, as upstream prints them)."""
    listed = ", ".join(quote(v) for v in sorted(allowed))
    return field, f"Unsupported value: {quote(value)}: supported values: {listed}"


def forbidden(field: str, detail: str) -> Cause:
    """``field.Forbidden``."""
    return field, f"Forbidden: {detail}"


def invalid_error(kind: str, name: str, causes: list[Cause], *, group: str = "") -> ApiError:
    """The 422 ``Invalid`` answer (``apierrors.NewInvalid``)."""
    qualified = f"{kind}.{group}" if group else kind
    texts = [f"{field}: {message}" if field else message for field, message in causes]
    aggregate = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [
        {
            "reason": next((r for p, r in _REASONS if m.startswith(p)), "FieldValueInvalid"),
            "message": m,
            "field": f,
        }
        for f, m in causes
    ]
    return ApiError(422, f'{qualified} "{name}" is invalid: {aggregate}', details=details)


def decode_error(kind: str, version: str, message: str) -> ApiError:
    """The 400 of a body the decoder refuses."""
    return ApiError(400, f'{kind} in version "{version}" cannot be handled as a {kind}: {message}')


def subdomain_problem(name: str) -> str | None:
    """``IsDNS1123Subdomain`` (object names of most kinds)."""
    if len(name) > 253:
        return "must be no more than 253 characters"
    if not SUBDOMAIN_RE.match(name):
        return (
            f"{SUBDOMAIN_MESSAGE} (e.g. 'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return None


def label_problem(name: str) -> str | None:
    """``IsDNS1123Label`` (namespace names)."""
    if len(name) > 63:
        return "must be no more than 63 characters"
    return None if LABEL_RE.match(name) else LABEL_MESSAGE


def path_segment_problem(name: str) -> str | None:
    """``IsValidPathSegmentName`` (RBAC object names, which may contain ``:``)."""
    if name in (".", ".."):
        return f"may not be '{name}'"
    for char in "/%":
        if char in name:
            return f"may not contain '{char}'"
    return None


def qualified_name_problem(key: str) -> str | None:
    """``IsQualifiedName`` (label and annotation keys): ``[prefix/]name``."""
    parts = key.split("/")
    if len(parts) > 2:
        return (
            f"a qualified name {_QNAME_MESSAGE} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        )
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            return "prefix part must be non-empty"
        if subdomain_problem(parts[0]):
            return f"prefix part {subdomain_problem(parts[0])}"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    return None if _QNAME.match(name) else f"name part {_QNAME_MESSAGE}"


def meta_causes(meta: dict[str, Any]) -> list[Cause]:
    """Problems of labels and annotations (``ValidateObjectMeta`` beyond the name)."""
    causes: list[Cause] = []
    for key, value in (meta.get("labels") or {}).items():
        problem = qualified_name_problem(str(key))
        if problem:
            causes.append(bad("metadata.labels", key, problem))
        if len(str(value)) > 63:
            causes.append(bad("metadata.labels", value, "must be no more than 63 characters"))
        elif not _LABEL_VALUE.match(str(value)):
            causes.append(bad("metadata.labels", value, _VALUE_MESSAGE))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        problem = qualified_name_problem(str(key).lower())
        if problem:
            causes.append(bad("metadata.annotations", key, problem))
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        causes.append(
            ("metadata.annotations", f"Too long: may not be more than {MAX_ANNOTATION_BYTES} bytes")
        )
    return causes
