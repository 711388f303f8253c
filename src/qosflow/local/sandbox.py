"""Pod file systems, seen from the host: the pod folder's layout, the isolation modes, the probe.

A pod of a real cluster sees its image, its declared volumes at their mount paths and nothing
else of the node; what it writes elsewhere is gone with its container. The local cluster gives
each pod the same view where the host allows it (isolation ``private``, the sandbox of
:mod:`qosflow.local.shim`): a private copy-on-write view of the host's file system (the host is
the "image"), its volumes' host folders bind-mounted at their mount paths, ``/var/run/argo`` = the
pod's ``argo`` folder (where Argo's executor keeps the progress file), the local cluster's state
directory hidden, and the container's ``workingDir`` (or ``/``) as working directory.

Where it cannot (no mount namespaces: not root and no unprivileged user namespaces, or a
security module that forbids them), the local cluster falls back, loudly, to isolation
``shared``: the pod is a plain
process of this user in a private working folder, and every container path under a volume's
mount path in its environment values, command and arguments is rewritten to that volume's host
folder (:func:`rewrite`). That still sends what a program writes to its volumes where the next
pod finds it, but it hides nothing: files written anywhere else persist and are shared, the
state directory and other pods' folders are visible, ``readOnly`` is not enforced, and a path the
program builds itself (not from its environment or arguments) is not rewritten.

The pod folder ``<state-dir>/pods/<ns>/<pod>/`` holds, outside the pod's view: ``main.log``,
``.exit_code`` and ``.pid`` (the supervisor's), ``argo/`` (``/var/run/argo``), ``rootfs/`` (the
container's writable layers) and ``volumes/`` (emptyDir, configMap and secret volumes). The
last two are removed when the pod ends (:func:`release`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qosflow.local.errors import LocalClusterError
from qosflow.local.supervisor import EXIT_FILE, shim_command

PRIVATE = "private"
SHARED = "shared"
AUTO = "auto"
MODES = (AUTO, PRIVATE, SHARED)
ARGO_PATH = "/var/run/argo"
PROGRESS_PATH = f"{ARGO_PATH}/progress"
"""``ARGO_PROGRESS_FILE`` as Argo sets it (``common.ArgoProgressPath``)."""
_PATH_CHAR = r"[A-Za-z0-9._\-/~]"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Mount:
    """A host folder (or file) the container sees at ``path``.

    Attributes:
        host: The host path (a folder of the local cluster, never chosen by the pod).
        path: The container path (the volumeMount's ``mountPath``).
        read_only: Mount it read-only.
    """

    host: Path
    path: str
    read_only: bool = False


def argo_dir(workdir: Path) -> Path:
    """The pod's ``/var/run/argo`` on the host (kept after the pod ends: the node reads it)."""
    return workdir / "argo"


def progress_file(workdir: Path) -> Path:
    """The host path of the pod's ``ARGO_PROGRESS_FILE``."""
    return argo_dir(workdir) / "progress"


def rootfs_dir(workdir: Path) -> Path:
    """The container's writable layers (and, isolation ``shared``, its working folder)."""
    return workdir / "rootfs"


def volumes_dir(workdir: Path) -> Path:
    """The pod's own volumes (emptyDir, configMap, secret), removed when the pod ends."""
    return workdir / "volumes"


def _writable(function: Any, path: str, _: Any) -> None:
    """``rmtree`` error handler: overlayfs leaves a mode-000 ``work`` folder behind."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), stat.S_IRWXU)
        os.chmod(path, stat.S_IRWXU)
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def release(workdir: Path) -> None:
    """Drop what dies with a pod: its container layers and its own volumes.

    The supervisor's files, the log and ``argo/`` stay (the API serves the log, the node reads
    the last progress).
    """
    for path in (rootfs_dir(workdir), volumes_dir(workdir)):
        if path.exists():
            shutil.rmtree(path, onerror=_writable)


def mount_entries(mounts: Iterable[Mount]) -> list[dict[str, Any]]:
    """Mounts as the supervisor reads them (JSON)."""
    return [{"host": str(m.host), "path": m.path, "readOnly": m.read_only} for m in mounts]


def sandbox_plan(workdir: Path, hide: Sequence[Path], mounts: Sequence[Mount]) -> dict[str, Any]:
    """The ``sandbox`` part of a supervisor plan (see :mod:`qosflow.local.shim`)."""
    return {
        "root": str(rootfs_dir(workdir)),
        "hide": [str(h) for h in hide],
        "mounts": mount_entries(mounts),
    }


def _container_path_pattern(mounts: Sequence[Mount]) -> re.Pattern[str] | None:
    """A regex matching a mount path where it starts a path in a string (longest path first)."""
    paths = sorted({m.path.rstrip("/") or "/" for m in mounts if m.path}, key=len, reverse=True)
    paths = [p for p in paths if p != "/"]
    if not paths:
        return None
    alternatives = "|".join(re.escape(p) for p in paths)
    return re.compile(rf"(?<!{_PATH_CHAR})({alternatives})(?=/|$|[^A-Za-z0-9._\-~])")


def rewrite(text: str, mounts: Sequence[Mount]) -> str:
    """Isolation ``shared``: container paths under a mount path in ``text`` become host paths.

    ``--out=/ckpt/run1`` with ``/ckpt`` mounted from ``<host>`` becomes ``--out=<host>/run1``.
    """
    pattern = _container_path_pattern(mounts)
    if pattern is None:
        return text
    by_path = {m.path.rstrip("/"): str(m.host) for m in mounts}
    return pattern.sub(lambda found: by_path[found.group(1)], text)


def shared_cwd(workdir: Path, working_dir: str, mounts: Sequence[Mount]) -> Path:
    """Isolation ``shared``: the working folder (a volume's host folder, else a private one)."""
    if working_dir:
        rewritten = rewrite(working_dir, mounts)
        if rewritten != working_dir:
            return Path(rewritten)
    return rootfs_dir(workdir) / "cwd"


PROBE_CHECK = (
    "import os, sys\n"
    "open('/qosflow-probe/ok', 'w').write('ok')\n"
    "sys.exit(0 if os.listdir(sys.argv[1]) == [] else 3)\n"
)


def probe(state_dir: Path, timeout_s: float = 30.0) -> str | None:
    """Whether private pod file systems work on this host: ``None``, else why not.

    Starts one sandboxed process the way a pod starts (the real supervisor, a volume, the state
    directory hidden) and checks what it saw: its volume written through, the state directory
    empty, and nothing of its root written to the host's.
    """
    if not sys.platform.startswith("linux"):
        return f"mount namespaces need Linux (this is {sys.platform})"
    state = state_dir.resolve()
    scratch = state / ".isolation-probe"
    release(scratch)
    volume = scratch / "volume"
    volume.mkdir(parents=True, exist_ok=True)
    plan = {
        "cores": [],
        "procs": "",
        "exit_file": str(scratch / EXIT_FILE),
        "cwd": "/",
        "sandbox": sandbox_plan(scratch, [state], [Mount(volume, "/qosflow-probe")]),
    }
    check = [sys.executable, "-I", "-S", "-c", PROBE_CHECK, str(state)]
    try:
        done = subprocess.run(
            [*shim_command(plan), *check],
            env={"PATH": os.defpath, "LANG": "C.UTF-8"},
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        leaked = Path("/qosflow-probe").exists()
        wrote = (volume / "ok").exists()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the probe could not run: {exc}"
    finally:
        release(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0 or not wrote or leaked:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"the probe exited {done.returncode}"
    return None


def choose(requested: str, state_dir: Path) -> str:
    """The isolation mode to use: ``private`` when asked for (or ``auto``) and it works.

    Raises:
        LocalClusterError: For an unknown mode, or ``private`` on a host that cannot do it.
    """
    if requested not in MODES:
        raise LocalClusterError(f"isolation: must be one of {', '.join(MODES)} (got {requested!r})")
    if requested == SHARED:
        return SHARED
    reason = probe(state_dir)
    if reason is None:
        return PRIVATE
    if requested == PRIVATE:
        raise LocalClusterError(f"isolation: private pod file systems do not work here: {reason}")
    _LOG.warning(
        "pods will SHARE this host's file system (isolation 'shared'): private pod file "
        "systems do not work here (%s). Volumes still work through path rewriting, but files "
        "a pod writes outside its volumes persist and other pods see them; see "
        "docs/local-cluster.md",
        reason,
    )
    return SHARED
