"""The pod supervisor, seen from the server: how to start it and find it again.

Every container runs under the supervisor program :mod:`qosflow.local.shim`
(:func:`shim_command`): it pins the pod's cores, joins its cgroup, enters the pod's sandbox, execs
the container, forwards SIGTERM and SIGINT to it, and writes its exit code (``128 + signal`` when
a signal killed it) atomically to ``<pod dir>/.exit_code``. It is the container runtime's ``shim``
in a real node: the server can die and restart without losing what happened to its containers. A
container still running after a restart is re-adopted (same pid and start time,
:func:`process_alive`); one that ended meanwhile left its exit code in the file
(:func:`read_exit_code`).

The supervisor is the session and process-group leader, so SIGKILL to the group ends both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qosflow.local import shim

EXIT_FILE = ".exit_code"
PID_FILE = ".pid"


def shim_command(plan: Mapping[str, Any]) -> list[str]:
    """The command that runs a container under the supervisor (:mod:`qosflow.local.shim`).

    Args:
        plan: ``cores`` (host CPU ids), ``procs`` (the cgroup's ``cgroup.procs`` or ``""``),
            ``exit_file``, ``cwd`` and ``sandbox`` (``None`` for a process that shares the
            host's file system; see :func:`qosflow.local.sandbox.sandbox_plan`).

    Returns:
        ``python -I -S <shim.py> <plan as JSON>``; the container's argv follows.
    """
    return [sys.executable, "-I", "-S", str(Path(shim.__file__)), json.dumps(dict(plan))]


def exec_command(pid: int, argv: list[str]) -> list[str]:
    """The command that runs ``argv`` in the view of the running container ``pid``.

    ``python -I -S <shim.py> --exec <pid> <argv...>`` (see :func:`qosflow.local.shim.exec_in`).
    """
    return [sys.executable, "-I", "-S", str(Path(shim.__file__)), "--exec", str(pid), *argv]


def container_pid(supervisor: int) -> int | None:
    """The container process of a supervisor (its only child), or ``None`` when it has none."""
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks, or ``None`` when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` and is not a zombie."""
    fields = _stat_fields(pid)
    return (
        start_ticks is not None
        and fields is not None
        and int(fields[19]) == start_ticks
        and fields[0] not in ("Z", "X")
    )


def read_exit_code(path: Path) -> int | None:
    """The exit code a supervisor recorded, or ``None`` when it recorded none."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def kill_orphan(pid: int, start_ticks: int | None) -> bool:
    """SIGKILL the process group of a supervisor, if ``pid`` is still that process."""
    if not process_alive(pid, start_ticks):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
        return True
    return False


def write_pid_file(workdir: Path, pid: int, start_ticks: int | None) -> None:
    """Record which supervisor runs in ``workdir`` (a launch the state file never recorded)."""
    with contextlib.suppress(OSError):
        (workdir / PID_FILE).write_text(json.dumps({"pid": pid, "start_ticks": start_ticks}))


def kill_leftover(workdir: Path) -> None:
    """Kill a supervisor a crashed server started in ``workdir`` but never recorded as started."""
    try:
        record = json.loads((workdir / PID_FILE).read_text())
        pid, ticks = int(record["pid"]), record.get("start_ticks")
    except (OSError, ValueError, KeyError, TypeError):
        return
    kill_orphan(pid, ticks if isinstance(ticks, int) else None)
