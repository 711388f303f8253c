"""``qosflow local up|down``: the local cluster as a background daemon.

``up`` starts ``python -m qosflow.local`` in its own session, waits until it has written
``<state-dir>/cluster.json`` (pid, URLs, token, namespace, settings), and prints those values,
with the settings (``nodes: 2 x 4 CPU, 1 nvidia.com/gpu (qosflow-local-0, qosflow-local-1)``,
``preemption: on|off``, ``kubernetes: 1.35``; ``--nodes``, ``--cpus``, ``--gpus``,
``--gpu-resource``, ``--preemption`` and ``--kubernetes-version`` choose them). The token is
kept in ``<state-dir>/token`` (mode 0600), so a restart of the same state directory keeps it
(``--token`` or ``QOSFLOW_LOCAL_TOKEN`` choose one). ``down`` sends the daemon SIGTERM (running pods
are stopped, the state is saved) and waits for it to exit, SIGKILLing it after a timeout; it never
fails with a traceback and always removes ``cluster.json``. The lead wires :func:`add_subcommands`
into the ``qosflow`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qosflow.local.errors import LocalClusterError
from qosflow.local.kube_version import DEFAULT_KUBERNETES_VERSION, kubernetes_minor
from qosflow.local.supervisor import process_start_ticks
from qosflow.local.topology import GPU_RESOURCE, MAX_NODES, check_gpu_resource

DEFAULT_STATE_DIR = Path(".qosflow/local")
DEFAULT_PORT = 2746
INFO_FILE = "cluster.json"
TOKEN_FILE = "token"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
KILL_TIMEOUT_S = 5.0


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
    if not isinstance(info, dict):
        return None
    try:
        pid = int(info["pid"])
    except (KeyError, TypeError, ValueError):
        return None
    ticks = info.get("start_ticks")
    if ticks is not None and process_start_ticks(pid) != ticks:  # the pid was reused
        return None
    return info if _alive(pid) else None


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically, readable by the owner only."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_info(state_dir: Path, info: dict[str, Any]) -> None:
    """Write ``cluster.json`` atomically, readable by the owner only (it holds the token)."""
    _write_private(state_dir / INFO_FILE, json.dumps(info, indent=1))


def stored_token(state_dir: Path, given: str = "") -> str:
    """The bearer token of a state directory: ``given`` if set, else the stored one, else new.

    The token in effect is (re)written to ``<state_dir>/token`` with mode 0600, so the next start
    of the same state directory keeps it and existing clients are not locked out.
    """
    path = state_dir / TOKEN_FILE
    token = given.strip()
    if not token:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            token = path.read_text(encoding="utf-8").strip()
    token = token or secrets.token_urlsafe(24)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8").strip() == token and path.stat().st_mode & 0o077 == 0:
            return token
    _write_private(path, token + "\n")
    return token


def nodes_text(info: dict[str, Any]) -> str:
    """``2 x 4 CPU, 1 nvidia.com/gpu (qosflow-local-0, qosflow-local-1)`` from ``cluster.json``."""
    count = int(info.get("nodes") or 1)
    text = f"{count} x {info.get('cpus', '?')} CPU"
    if int(info.get("gpus") or 0):
        text += f", {info['gpus']} {info.get('gpu_resource') or GPU_RESOURCE}"
    names = info.get("node_names")
    return f"{text} ({', '.join(names)})" if isinstance(names, list) and names else text


def _print_info(info: dict[str, Any]) -> None:
    for key in ("pid", "argo_url", "kube_url", "namespace", "token", "state_dir"):
        print(f"{key}: {info[key]}")
    print(f"nodes: {nodes_text(info)}")
    print(f"preemption: {'on' if info.get('preemption') else 'off'}")
    print(f"kubernetes: {info.get('kubernetes_version') or DEFAULT_KUBERNETES_VERSION}")
    isolation = info.get("isolation", "private")
    print(
        f"pod file systems: {isolation}"
        + (
            " (no mount namespaces here: pods share this machine's files; see docs/local-cluster.md)"
            if isolation == "shared"
            else ""
        )
    )


def _settings_differ(info: dict[str, Any], args: argparse.Namespace) -> str:
    """What the running daemon does differently from what ``up`` was asked (empty if nothing)."""
    wanted = {
        "nodes": nodes_text(
            {
                "nodes": getattr(args, "nodes", 1),
                "cpus": getattr(args, "cpus", 2),
                "gpus": getattr(args, "gpus", 0),
                "gpu_resource": getattr(args, "gpu_resource", GPU_RESOURCE),
            }
        ),
        "preemption": "on" if getattr(args, "preemption", False) else "off",
        "kubernetes": getattr(args, "kubernetes_version", DEFAULT_KUBERNETES_VERSION),
    }
    running = {
        "nodes": nodes_text({k: v for k, v in info.items() if k != "node_names"}),
        "preemption": "on" if info.get("preemption") else "off",
        "kubernetes": info.get("kubernetes_version") or DEFAULT_KUBERNETES_VERSION,
    }
    return ", ".join(f"{k}: {running[k]}" for k in wanted if wanted[k] != running[k])


def kubernetes_version(text: str) -> str:
    """Argparse type of ``--kubernetes-version``: ``1.N`` (normalised, e.g. ``v1.32`` -> ``1.32``)."""
    try:
        return f"1.{kubernetes_minor(text)}"
    except LocalClusterError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def count(low: int, high: int | None = None) -> Callable[[str], int]:
    """Argparse type of an integer between ``low`` and ``high`` (inclusive)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound} (got {value})")
        return value

    return parse


def gpu_resource(text: str) -> str:
    """Argparse type of ``--gpu-resource``: an extended resource name."""
    try:
        return check_gpu_resource(text)
    except LocalClusterError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _daemon_command(args: argparse.Namespace, state_dir: Path) -> list[str]:
    """``python -m qosflow.local`` with the settings ``up`` was given."""
    command = [sys.executable, "-m", "qosflow.local"]
    for flag, value in (
        ("--nodes", getattr(args, "nodes", 1)),
        ("--cpus", args.cpus),
        ("--gpus", getattr(args, "gpus", 0)),
        ("--gpu-resource", getattr(args, "gpu_resource", GPU_RESOURCE)),
        ("--port", args.port),
        ("--state-dir", state_dir),
        ("--kubernetes-version", getattr(args, "kubernetes_version", DEFAULT_KUBERNETES_VERSION)),
    ):
        command += [flag, str(value)]
    if getattr(args, "preemption", False):
        command.append("--preemption")
    return command


def up(args: argparse.Namespace, on_up: Callable[[dict[str, Any]], int] | None = None) -> int:
    """Start the daemon (or report the running one); then ``on_up(info)`` (its exit code)."""
    state_dir = Path(args.state_dir)
    info = read_info(state_dir)
    if info is not None:
        print("the local cluster is already running")
        _print_info(info)
        differ = _settings_differ(info, args)
        if differ:
            print(
                f"note: it runs with {differ}; `qosflow local down` first to change that",
                file=sys.stderr,
            )
        return on_up(info) if on_up is not None else 0
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / INFO_FILE).unlink(missing_ok=True)
    command = _daemon_command(args, state_dir)
    env = dict(os.environ)
    if getattr(args, "token", ""):
        env["QOSFLOW_LOCAL_TOKEN"] = args.token  # not in argv: other users can read that
    with open(state_dir / "server.log", "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = read_info(state_dir)
        if info is not None and info.get("pid") == child.pid:
            _print_info(info)
            return on_up(info) if on_up is not None else 0
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


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` exits within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _stop(pid: int, timeout_s: float) -> int:
    """SIGTERM the daemon, SIGKILL it when it does not exit in time; the exit status of ``down``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"the local cluster (pid {pid}) had already exited")
        return 0
    if _wait_gone(pid, timeout_s):
        print(f"stopped the local cluster (pid {pid})")
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, KILL_TIMEOUT_S)
    print(
        f"error: the local cluster (pid {pid}) did not stop within {timeout_s:.0f} s and was "
        "killed; its pods keep running and the next `qosflow local up` re-adopts them",
        file=sys.stderr,
    )
    return 1


def down(args: argparse.Namespace) -> int:
    """Stop the daemon and wait for it to exit; ``cluster.json`` is removed in every case."""
    state_dir = Path(args.state_dir)
    try:
        info = read_info(state_dir)
        if info is None:
            print("the local cluster is not running")
            return 0
        return _stop(int(info["pid"]), float(getattr(args, "timeout", STOP_TIMEOUT_S)))
    except (OSError, ValueError) as exc:
        print(f"error: could not stop the local cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(OSError):
            (state_dir / INFO_FILE).unlink(missing_ok=True)


def add_subcommands(sub: Any, *, on_up: Callable[[dict[str, Any]], int] | None = None) -> None:
    """Register ``local up`` and ``local down`` on an argparse subparsers object.

    ``on_up``: run once the cluster is up, with what ``up`` printed (the CLI installs qosflow's
    WorkflowTemplate and PriorityClasses there; this package knows nothing of them).
    """
    local = sub.add_parser("local", help="the embedded local cluster (Argo + Kubernetes emulation)")
    verbs = local.add_subparsers(dest="local_command", required=True)
    start = verbs.add_parser("up", help="start the local cluster in the background")
    start.add_argument(
        "--nodes",
        type=count(1, MAX_NODES),
        default=1,
        help="number of nodes (default 1, named qosflow-local; several are qosflow-local-0...)",
    )
    start.add_argument(
        "--cpus", type=count(1), default=2, help="allocatable CPUs of each node (default 2)"
    )
    start.add_argument(
        "--gpus",
        type=count(0),
        default=0,
        help="GPUs of each node, advertised as --gpu-resource (default 0; no device reaches "
        "the pods: the scheduler counts them)",
    )
    start.add_argument(
        "--gpu-resource",
        type=gpu_resource,
        default=GPU_RESOURCE,
        help=f"the GPUs' extended resource name (default {GPU_RESOURCE})",
    )
    start.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"Argo Server port; Kubernetes API on port+1 (default {DEFAULT_PORT}; 0 = any)",
    )
    start.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="state directory")
    start.add_argument(
        "--token",
        default="",
        help="bearer token (default: $QOSFLOW_LOCAL_TOKEN, else the one stored in the state "
        "directory, else a new random one)",
    )
    start.add_argument(
        "--preemption",
        action="store_true",
        help="pending pods evict lower-priority running pods, as the Kubernetes scheduler does "
        "(default: off, a pending pod waits)",
    )
    start.add_argument(
        "--kubernetes-version",
        type=kubernetes_version,
        default=DEFAULT_KUBERNETES_VERSION,
        help=f"Kubernetes version to emulate (default {DEFAULT_KUBERNETES_VERSION}); before 1.33 "
        "there is no in-place resize (pods/resize), so jobs rescale by checkpoint-restart",
    )
    start.set_defaults(func=lambda args: up(args, on_up))
    stop = verbs.add_parser("down", help="stop the local cluster")
    stop.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help="state directory")
    stop.set_defaults(func=down)
