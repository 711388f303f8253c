"""``qosflow local up|down``: the local cluster as a background daemon.

``up`` starts ``python -m qosflow.local`` in its own session, waits until it has written
``<state-dir>/cluster.json`` (pid, URLs, token, namespace), and prints those values. ``down`` sends
it SIGTERM (running pods are stopped, the state is saved) and waits for it to exit. The lead wires
:func:`add_subcommands` into the ``qosflow`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = Path(".qosflow/local")
DEFAULT_PORT = 2746
INFO_FILE = "cluster.json"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie child is reaped and counts as gone)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    return True


def read_info(state_dir: Path) -> dict[str, Any] | None:
    """The daemon's ``cluster.json`` when its process is alive, else ``None``."""
    path = state_dir / INFO_FILE
    try:
        info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        pid = int(info["pid"])
    except (KeyError, ValueError):
        return None
    return info if _alive(pid) else None


def write_info(state_dir: Path, info: dict[str, Any]) -> None:
    """Write ``cluster.json`` atomically, readable by the owner only (it holds the token)."""
    path = state_dir / INFO_FILE
    tmp = path.with_name(f".{INFO_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)
    os.replace(tmp, path)


def _print_info(info: dict[str, Any]) -> None:
    for key in ("pid", "argo_url", "kube_url", "namespace", "token", "state_dir"):
        print(f"{key}: {info[key]}")


def up(args: argparse.Namespace) -> int:
    """Start the daemon (or report the running one)."""
    state_dir = Path(args.state_dir)
    info = read_info(state_dir)
    if info is not None:
        print("the local cluster is already running")
        _print_info(info)
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / INFO_FILE).unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "qosflow.local",
        "--cpus",
        str(args.cpus),
        "--port",
        str(args.port),
        "--state-dir",
        str(state_dir),
    ]
    if getattr(args, "preemption", False):
        command.append("--preemption")
    with open(state_dir / "server.log", "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = read_info(state_dir)
        if info is not None and info.get("pid") == child.pid:
            _print_info(info)
            return 0
        if child.poll() is not None:
            break
        time.sleep(0.1)
    tail = (state_dir / "server.log").read_text(encoding="utf-8", errors="replace")[-2000:]
    print(
        f"error: the local cluster did not start (see {state_dir / 'server.log'}):\n{tail}",
        file=sys.stderr,
    )
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    return 1


def down(args: argparse.Namespace) -> int:
    """Stop the daemon and wait for it to exit."""
    state_dir = Path(args.state_dir)
    info = read_info(state_dir)
    if info is None:
        print("the local cluster is not running")
        return 0
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            print(f"stopped the local cluster (pid {pid})")
            return 0
        time.sleep(0.1)
    print(
        f"error: the local cluster (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f} s",
        file=sys.stderr,
    )
    return 1


def add_subcommands(sub: Any) -> None:
    """Register ``local up`` and ``local down`` on an argparse subparsers object."""
    local = sub.add_parser("local", help="the embedded local cluster (Argo + Kubernetes emulation)")
    verbs = local.add_subparsers(dest="local_command", required=True)
    start = verbs.add_parser("up", help="start the local cluster in the background")
    start.add_argument(
        "--cpus", type=int, default=2, help="allocatable CPUs of the node (default 2)"
    )
    start.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"Argo Server port; Kubernetes API on port+1 (default {DEFAULT_PORT}; 0 = any)",
    )
    start.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="state directory")
    start.set_defaults(func=up)
    stop = verbs.add_parser("down", help="stop the local cluster")
    stop.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="state directory")
    stop.set_defaults(func=down)
