"""A failed validation in qosflow's words: one field path and the rule it broke.

pydantic reports every problem of an input at once, in the order of the model's fields; a user
needs the one that explains the rest. A misspelt field (``total_step:``) also makes the real one
(``total_steps``) missing, so an unknown field is always the message, with the known field it
most resembles (:mod:`difflib`): ``total_step: is not a known field; did you mean total_steps?``.
The values a message quotes are cut short, so a megabyte string is not printed back whole.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from qosflow.core.errors import SpecError


class StrictModel(BaseModel):
    """Base of every boundary model: unknown fields refused, frozen, numbers from text allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


_QUOTE_LIMIT = 60
"""Characters of a value a message quotes at most."""


def quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`_QUOTE_LIMIT` characters (``'aaaa...' (2000 characters)``)."""
    text = repr(value)
    if len(text) <= _QUOTE_LIMIT:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return f"{text[: _QUOTE_LIMIT - 3]}... ({size})"


def field_path(loc: Sequence[int | str]) -> str:
    """``resources.levels[2]`` from pydantic's location tuple."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (``X | None``, ``list[X]``, ``Annotated[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    if origin is typing.Union or origin is types.UnionType or origin is list:
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    return []


def _model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model whose fields the last element of ``loc`` is looked up in (``None``: not a model)."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list of models keeps the model
            continue
        if model is None or part not in model.model_fields:
            return None
        found = _models(model.model_fields[part].annotation)
        model = found[0] if found else None
    return model


def unknown_field(root: type[BaseModel], loc: Sequence[int | str]) -> SpecError:
    """``name: is not a known field; did you mean ...?`` for an extra key at ``loc``."""
    path, name = field_path(loc), str(loc[-1])
    model = _model_at(root, loc)
    known = sorted(model.model_fields) if model is not None else []
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    if close:
        return SpecError(path, f"is not a known field; did you mean {lowered[close[0]]}?")
    if known:
        return SpecError(path, f"is not a known field; the fields here are {', '.join(known)}")
    return SpecError(path, "is not a known field (check the spelling)")


def _rules(ctx: dict[str, Any], got: Any) -> dict[str, Callable[[], str]]:
    shown = quote(got)
    return {
        "greater_than_equal": lambda: f"must be >= {ctx.get('ge')} (got {shown})",
        "greater_than": lambda: f"must be > {ctx.get('gt')} (got {shown})",
        "less_than_equal": lambda: f"must be <= {ctx.get('le')} (got {shown})",
        "missing": lambda: "is required",
        "string_too_long": lambda: (
            f"must be at most {ctx.get('max_length')} characters (got {len(str(got))})"
        ),
        "string_too_short": lambda: f"must be at least {ctx.get('min_length')} character(s)",
        "literal_error": lambda: f"must be one of {ctx.get('expected')} (got {shown})",
        "int_parsing": lambda: f"must be an integer (got {shown})",
        "int_parsing_size": lambda: f"is too large a number (got {shown})",
        "int_from_float": lambda: f"must be a whole number (got {shown})",
        "int_type": lambda: f"must be an integer (got {shown})",
        "float_parsing": lambda: f"must be a number (got {shown})",
        "float_type": lambda: f"must be a number (got {shown})",
        "finite_number": lambda: f"must be a finite number (got {shown})",
        "string_type": lambda: f"must be a string (got {shown})",
        "bool_parsing": lambda: f"must be true or false (got {shown})",
        "bool_type": lambda: f"must be true or false (got {shown})",
        "list_type": lambda: f"must be a list (got {shown})",
        "model_type": lambda: f"must be a mapping (got {shown})",
        "model_attributes_type": lambda: f"must be a mapping (got {shown})",
        "dict_type": lambda: f"must be a mapping (got {shown})",
        "datetime_type": lambda: f"must be a date and time (got {shown})",
        "recursion_loop": lambda: "is nested too deeply",
    }


def spec_error(exc: ValidationError, root: type[BaseModel]) -> SpecError:
    """The one :class:`SpecError` that explains ``exc`` best (an unknown field first).

    Args:
        exc: What pydantic found wrong with an input of ``root``.
        root: The model the input was validated against (for the known field names).
    """
    errors = exc.errors()
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        return unknown_field(root, extra[0]["loc"])
    err = errors[0]
    loc = list(err["loc"])
    kind, ctx, got = err["type"], dict(err.get("ctx", {})), err.get("input")
    if kind == "invalid_key":
        name = f"{loc[-1]}" if not loc[:-1] else f"{field_path(loc[:-1])}.{loc[-1]}"
        return SpecError(name, f"is not a known field: field names are text (got {quote(got)})")
    if "[key]" in loc:  # a mapping's key broke the rule, not its value
        at = loc.index("[key]")
        rule = f"must be one of {ctx.get('expected')}" if kind == "literal_error" else err["msg"]
        return SpecError(field_path(loc[: at - 1]), f"key {quote(loc[at - 1])}: {rule}")
    make = _rules(ctx, got).get(kind)
    if make is not None:
        return SpecError(field_path(loc), make())
    return SpecError(field_path(loc), str(err["msg"]).removeprefix("Value error, "))


def as_mapping(data: Any, what: str) -> dict[str, Any]:
    """``data`` when it is a mapping of fields, else a :class:`SpecError` saying what it is.

    Raises:
        SpecError: With the empty field path: the whole input is wrong.
    """
    if isinstance(data, dict):
        return data
    if data is None:
        raise SpecError("", f"the {what} is empty: it must be a mapping of fields like name: ...")
    kind = {list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(data), f"a {type(data).__name__}"
    )
    raise SpecError(
        "", f"a {what} must be a mapping of fields like name: ... (got {kind}: {quote(data)})"
    )
