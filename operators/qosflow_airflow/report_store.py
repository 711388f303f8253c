"""Where reports are stored: a place the workers write and the api-server reads.

A worker's working directory is no such place (each worker has its own, and a
``.qosflow/reports`` relative to it is wherever the worker happened to start). The report's
root is, in order:

1. the ``report_dir`` of ``deadline_training`` (an override, templated);
2. the connection's ``report_url`` extra;
3. ``$AIRFLOW_HOME/qosflow/reports``.

Each may be a folder (a relative one counts from ``AIRFLOW_HOME``, never from the working
directory) or an object-storage URL that Airflow's ``ObjectStoragePath`` opens
(``s3://aws_default@bucket/qosflow``: the connection id before the ``@``). A report is
``<root>/<dag_id>/<run_id>/<job>.png`` (characters other than letters, digits, ``._=-`` become
``_``), so a run never overwrites another run's report. The api-server's view serves a report
only from below a root it knows (:func:`within`).
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any
from urllib.parse import urlsplit

DEFAULT_FOLDER = "qosflow/reports"
"""The reports' folder under ``AIRFLOW_HOME`` when nothing else is set."""
LOCAL = ("", "file", "local")
"""Protocols of the local file system."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")


def airflow_home() -> str:
    """``AIRFLOW_HOME`` as Airflow itself reads it (default ``~/airflow``)."""
    return os.path.expanduser(os.path.expandvars(os.environ.get("AIRFLOW_HOME", "~/airflow")))


def as_url(location: str) -> str:
    """A folder or URL as a URL: ``file://`` for folders, relative ones under ``AIRFLOW_HOME``."""
    text = location.strip()
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme not in LOCAL[1:]:
            return text.rstrip("/")
        text = rest
    path = text if os.path.isabs(text) else os.path.join(airflow_home(), text)
    return f"file://{os.path.normpath(path)}"


def report_root(override: str | None, configured: str | None) -> str:
    """The root URL reports go under: the override, the connection's, or the default."""
    for location in (override, configured):
        if location and location.strip():
            return as_url(location)
    return as_url(os.path.join(airflow_home(), DEFAULT_FOLDER))


def safe_part(text: str) -> str:
    """``text`` as one path segment (no separators, no ``..``)."""
    part = _UNSAFE.sub("_", text)
    return "_" if part in ("", ".", "..") else part


def report_url(root: str, job: str, dag_id: str = "", run_id: str = "") -> str:
    """``<root>/<dag_id>/<run_id>/<job>.png`` (without a run: ``<root>/<job>.png``)."""
    parts = [safe_part(p) for p in (dag_id, run_id) if p]
    return "/".join([root.rstrip("/"), *parts, f"{safe_part(job)}.png"])


def shown(url: str) -> str:
    """How a report's place is shown: a local file as its path, anything else as its URL."""
    scheme, _, rest = url.partition("://")
    return rest if scheme in LOCAL[1:] else url


def within(url: str, root: str) -> bool:
    """Whether ``url`` is a ``.png`` strictly below ``root`` (no ``..``, same scheme and place)."""
    if not url.endswith(".png") or ".." in url.split("/"):
        return False
    base, target = urlsplit(root.rstrip("/")), urlsplit(url)
    same = (base.scheme, base.netloc) == (target.scheme, target.netloc)
    inner = posixpath.normpath(target.path) == target.path
    return same and inner and target.path.startswith(base.path.rstrip("/") + "/")


def _path(url: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(url)


def write(url: str, data: bytes) -> str:
    """Store ``data`` at ``url`` (creating folders); how the place is shown (:func:`shown`)."""
    path = _path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.write(data)
    return shown(url)


def read(url: str) -> bytes:
    """The bytes stored at ``url``.

    Raises:
        FileNotFoundError: Nothing is stored there.
    """
    path = _path(url)
    if not path.exists():
        raise FileNotFoundError(url)
    with path.open("rb") as src:
        return bytes(src.read())
