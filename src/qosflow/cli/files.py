"""Spec files: YAML or JSON on disk, read into the mappings the core validates.

Whatever the file holds, reading it ends in the document or in one
:class:`~qosflow.core.errors.SpecError`: a file that cannot be read, is not UTF-8 text, or is not
YAML/JSON is named with the line and column where the parser stopped (``job.yaml:7:3: not valid
YAML: mapping values are not allowed here``), and so is a key given twice in one mapping (YAML
would quietly keep the last one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from qosflow.core.errors import SpecError

MAX_SPEC_BYTES = 2**20
"""A spec file larger than this is not a spec (a job spec with its pod settings is a few KiB)."""


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping of ``node``; a repeated key is an error at the repeat."""
        seen: set[str] = set()
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            if key.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key.value} is given twice in this mapping", key.start_mark
                )
            seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _code_point(character: int | str) -> str:
    return f"U+{character if isinstance(character, int) else ord(character):04X}"


def _where(file: Path, mark: yaml.Mark | None) -> str:
    return str(file) if mark is None else f"{file}:{mark.line + 1}:{mark.column + 1}"


def _problem(exc: yaml.MarkedYAMLError) -> str:
    """What the YAML parser found, and what it was reading when that began elsewhere."""
    problem = exc.problem or exc.context or "unreadable"
    start, end = exc.context_mark, exc.problem_mark
    elsewhere = (
        start is not None
        and end is not None
        and (start.line, start.column) != (end.line, end.column)
    )
    if exc.problem and exc.context and elsewhere and start is not None:
        problem += f" ({exc.context} at {start.line + 1}:{start.column + 1})"
    return problem


def _parse(file: Path, text: str) -> Any:
    """The document in ``text`` (JSON for ``.json``, else YAML).

    Raises:
        SpecError: At the file, line and column where the parser stopped.
    """
    try:
        if file.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no Python objects
    except json.JSONDecodeError as exc:
        raise SpecError(f"{file}:{exc.lineno}:{exc.colno}", f"not valid JSON: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:
        raise SpecError(
            _where(file, exc.problem_mark), f"not valid YAML: {_problem(exc)}"
        ) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        raise SpecError(
            f"{file}:{line}:{column}",
            f"not valid YAML: the character {_code_point(exc.character)} is not allowed in YAML",
        ) from None
    except ValueError as exc:  # a number too long for Python to read (4300 digits)
        kind = "JSON" if file.suffix == ".json" else "YAML"
        reason = str(exc).split("; use sys.", 1)[0]
        raise SpecError(str(file), f"not valid {kind}: {reason}") from None
    except RecursionError:
        raise SpecError(str(file), "is nested too deeply to be a spec") from None


def read_spec(path: str | Path, what: str = "job spec") -> Any:
    """The document in a ``.yaml``/``.yml``/``.json`` file (validated by the caller).

    Raises:
        SpecError: Naming the file (and the line and column, for a syntax error) when it cannot
            be read, is not UTF-8 text, or is not YAML/JSON.
    """
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SpecError("", f"cannot read {what} file {str(file)!r}: {reason}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(
            str(file), f"is larger than a {what} can be ({MAX_SPEC_BYTES // 2**20} MiB)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            str(file),
            f"is not a text file: a {what} is YAML or JSON in UTF-8 "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8)",
        ) from None
    if "\x00" in text:
        raise SpecError(
            str(file), f"is not a text file: a {what} is YAML or JSON (it has NUL bytes)"
        )
    return _parse(file, text)


def spec_or_file(value: str, what: str) -> Any:
    """``value`` itself when it is an inline form (``16x8``), else the document in that file."""
    return value if what == "cluster spec" and _inline_cluster(value) else read_spec(value, what)


def _inline_cluster(value: str) -> bool:
    nodes, sep, per = value.partition("x")
    return bool(sep) and nodes.isdigit() and per.isdigit()
