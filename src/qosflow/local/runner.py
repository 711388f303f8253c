"""How pod containers run: as real local processes (:class:`ProcessRunner`) or scripted.

A runner turns a :class:`PodLaunch` into a :class:`PodProcess`. The process runner ignores the
image and runs the container's ``command + args`` as a real process: in its own session, in a
per-pod directory, with ``ARGO_PROGRESS_FILE`` set, ``PATH`` starting with the directory of
``sys.executable`` (so ``python`` is this interpreter), and its CPU affinity set to the cores the
local cluster allocated. Affinity is applied before the program starts (a tiny ``exec`` shim) and,
on an in-place resize, to every thread of the process and of its children. Where the host allows
it, the shim also joins the pod's cgroup, weighted by its CPU request
(:class:`~qosflow.local.cgroups.CpuWeights`), so the pod gets its CPUs ahead of the host's other
processes, as on a node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qosflow.local.cgroups import CpuWeights

_SHIM = (
    "import os,sys\n"
    "os.sched_setaffinity(0,[int(c) for c in sys.argv[1].split(',')])\n"
    "if sys.argv[2]:\n"
    " try:\n"
    "  open(sys.argv[2],'w').write(str(os.getpid()))\n"
    " except OSError:\n"
    "  pass\n"
    "try:\n"
    " os.execvp(sys.argv[3],sys.argv[3:])\n"
    "except OSError as e:\n"
    " print(f'exec {sys.argv[3]!r}: {e.strerror}',file=sys.stderr)\n"
    " os._exit(127)\n"
)


@dataclass(frozen=True, slots=True)
class PodLaunch:
    """Everything needed to start the ``main`` container of one pod.

    Attributes:
        pod: Pod name.
        namespace: Pod namespace.
        workflow: Workflow name.
        node_id: Argo node id.
        argv: ``command + args`` of the container.
        env: The container's environment variables (already resolved).
        cores: Host CPU ids the process may run on.
        cpus: CPU request (cores, may be fractional).
        workdir: Per-pod working directory (exists).
        progress_file: Path given as ``ARGO_PROGRESS_FILE``.
        on_exit: Called (from another thread) as soon as the process exits, to wake the kubelet.
    """

    pod: str
    namespace: str
    workflow: str
    node_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cores: tuple[int, ...]
    cpus: float
    workdir: Path
    progress_file: Path
    on_exit: Callable[[], None] | None = None


class PodProcess(Protocol):
    """A running (or finished) container."""

    @property
    def pid(self) -> int | None:
        """OS process id, or ``None`` for scripted pods."""
        ...

    @property
    def start_ticks(self) -> int | None:
        """Process start time in clock ticks (``/proc/<pid>/stat`` field 22), for restarts."""
        ...

    def poll(self, now: float) -> int | None:
        """Exit code once finished (``128 + signal`` when killed by a signal), else ``None``."""
        ...

    def set_cores(self, cores: tuple[int, ...], cpus: float) -> None:
        """Change the CPUs the container may use (in-place resize)."""
        ...

    def terminate(self) -> None:
        """Send SIGTERM to the container's main process."""
        ...

    def kill(self) -> None:
        """Send SIGKILL to the container's whole process group."""
        ...


class Runner(Protocol):
    """Starts pod containers."""

    def launch(self, spec: PodLaunch, now: float) -> PodProcess:
        """Start the container of ``spec`` at time ``now``."""
        ...


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks, or ``None`` when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def kill_orphan(pid: int, start_ticks: int | None) -> bool:
    """SIGKILL the process group of a pod left by a dead server, if it is still that process."""
    if start_ticks is None or process_start_ticks(pid) != start_ticks:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
        return True
    return False


def _threads_of_tree(pid: int) -> list[int]:
    """Thread ids of ``pid`` and of all its descendants (via ``/proc/<pid>/task/*/children``)."""
    tids: list[int] = []
    stack, seen = [pid], set()
    while stack:
        proc = stack.pop()
        if proc in seen:
            continue
        seen.add(proc)
        try:
            tasks = [int(t) for t in os.listdir(f"/proc/{proc}/task")]
        except OSError:
            continue
        tids.extend(tasks)
        for tid in tasks:
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{proc}/task/{tid}/children").read_text().split()
                stack.extend(int(c) for c in children)
    return tids


class LocalProcess:
    """A pod container running as a real process (see :class:`ProcessRunner`)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        on_exit: Callable[[], None] | None = None,
        *,
        weights: CpuWeights | None = None,
        key: str = "",
    ) -> None:
        self._popen = popen
        self._start_ticks = process_start_ticks(popen.pid)
        self._weights, self._key = weights, key
        threading.Thread(target=self._reap, args=(on_exit,), daemon=True).start()

    def _reap(self, on_exit: Callable[[], None] | None) -> None:
        """Wait for the exit in the background, then wake the kubelet (no tick of delay)."""
        self._popen.wait()
        if self._weights is not None:
            self._weights.release(self._key)
        if on_exit is not None:
            on_exit()

    @property
    def pid(self) -> int | None:
        """OS process id."""
        return self._popen.pid

    @property
    def start_ticks(self) -> int | None:
        """Start time in clock ticks."""
        return self._start_ticks

    def poll(self, now: float) -> int | None:
        """Exit code (``128 + signal`` when killed by one), or ``None`` while running."""
        code = self._popen.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def set_cores(self, cores: tuple[int, ...], cpus: float) -> None:
        """Re-pin every thread of the process tree to ``cores`` (and re-weight its cgroup)."""
        if self._weights is not None:
            self._weights.resize(self._key, round(cpus * 1000))
        for tid in _threads_of_tree(self._popen.pid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cores)

    def terminate(self) -> None:
        """SIGTERM to the main process (as the container runtime does to PID 1)."""
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group, then reap."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)


class ProcessRunner:
    """Runs each pod's command as a real local process (the image is ignored).

    Args:
        weights: Pod cgroups weighted by CPU request (``None``: pods run unweighted).
    """

    def __init__(self, weights: CpuWeights | None = None) -> None:
        self.weights = weights

    def launch(self, spec: PodLaunch, now: float) -> PodProcess:
        """Start the process pinned to ``spec.cores``; output goes to ``<workdir>/main.log``."""
        env = dict(os.environ)
        env.update(spec.env)
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", os.defpath)
        env.update(
            {
                "ARGO_PROGRESS_FILE": str(spec.progress_file),
                "ARGO_POD_NAME": spec.pod,
                "ARGO_CONTAINER_NAME": "main",
                "ARGO_NODE_ID": spec.node_id,
                "ARGO_WORKFLOW_NAME": spec.workflow,
            }
        )
        cores = ",".join(str(c) for c in spec.cores)
        key = f"{spec.namespace}_{spec.pod}"
        procs = self.weights.pod(key, round(spec.cpus * 1000)) if self.weights else None
        with open(spec.workdir / "main.log", "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-c", _SHIM, cores, str(procs or ""), *spec.argv],
                cwd=spec.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return LocalProcess(popen, spec.on_exit, weights=self.weights, key=key)
