"""Spec files: YAML or JSON on disk, read into the mappings the core validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from qosflow.core.errors import SpecError


def read_spec(path: str | Path, what: str = "job spec") -> Any:
    """The document in a ``.yaml``/``.yml``/``.json`` file (validated by the caller).

    Raises:
        SpecError: Naming the file when it cannot be read or is not YAML/JSON.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError("", f"cannot read {what} file {str(file)!r}: {exc.strerror}") from None
    try:
        return json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError("", f"{file}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None


def spec_or_file(value: str, what: str) -> Any:
    """``value`` itself when it is an inline form (``16x8``), else the document in that file."""
    return value if what == "cluster spec" and _inline_cluster(value) else read_spec(value, what)


def _inline_cluster(value: str) -> bool:
    nodes, sep, per = value.partition("x")
    return bool(sep) and nodes.isdigit() and per.isdigit()
