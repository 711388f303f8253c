"""How pod containers run: as real local processes (:class:`ProcessRunner`) or scripted.

A runner turns a :class:`PodLaunch` into a :class:`PodProcess`. The process runner ignores the
image and runs the container's ``command + args`` as a real process: in its own session, under
the pod supervisor (:mod:`qosflow.local.shim`), in the pod's own file system view
(:mod:`qosflow.local.sandbox`: isolation ``private``, or ``shared`` with path rewriting where the
host cannot do better), with its CPU affinity set to the cores the local cluster allocated.
Affinity is applied before the program starts and, on an in-place resize, to every thread of the
process tree. Where the host allows it, the supervisor also joins the pod's cgroup, weighted by
its CPU request (:class:`~qosflow.local.cgroups.CpuWeights`), so the pod gets its CPUs ahead of
the host's other processes, as on a node.

A pod sees only its declared environment (:func:`pod_environment`): the container's resolved
environment (``env``, ``envFrom``, the ``ARGO_*`` variables; see :mod:`qosflow.local.env`) and
the little an image has (``PATH`` with the directory of ``sys.executable`` first, so ``python`` is
this interpreter; ``HOME``; ``LANG``/``LC_ALL``; ``TMPDIR``; ``HOSTNAME`` = the pod name). Nothing
else of the server's environment (its token, an Airflow connection with a password) reaches a pod.

After a restart of the server, :meth:`ProcessRunner.adopt` re-attaches to a container that is
still running, or reads the exit code of one that ended meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qosflow.local.cgroups import CpuWeights
from qosflow.local.probes import EXEC, ProbeAction, network_probe
from qosflow.local.sandbox import (
    PRIVATE,
    SHARED,
    Mount,
    rewrite,
    sandbox_plan,
    shared_cwd,
)
from qosflow.local.supervisor import (
    EXIT_FILE,
    container_pid,
    exec_command,
    kill_leftover,
    process_alive,
    process_start_ticks,
    read_exit_code,
    shim_command,
    write_pid_file,
)

IMAGE_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR")
"""Variables a container image would have, taken from the server (nothing else of it is)."""


@dataclass(frozen=True, slots=True)
class PodLaunch:
    """Everything needed to start the ``main`` container of one pod.

    Attributes:
        pod: Pod name.
        namespace: Pod namespace.
        workflow: Workflow name.
        node_id: Argo node id.
        argv: ``command + args`` of the container (``$(VAR)`` expanded).
        env: The container's environment variables (resolved and expanded, ``ARGO_*`` included).
        cores: Host CPU ids the process may run on.
        cpus: CPU request (cores, may be fractional).
        workdir: The pod's folder on the host (exists; the container does not see it).
        progress_file: Host path of the file the container knows as ``ARGO_PROGRESS_FILE``.
        on_exit: Called (from another thread) as soon as the process exits, to wake the kubelet.
        mounts: The container's volumes, ``/var/run/argo`` included.
        working_dir: The container's ``workingDir`` (``""``: the image's, ``/``).
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
    mounts: tuple[Mount, ...] = ()
    working_dir: str = ""


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

    def probe(self, action: ProbeAction) -> bool:
        """Run one probe handler against the container; True when it passes."""
        ...


class Runner(Protocol):
    """Starts pod containers (and finds them again after a restart)."""

    def launch(self, spec: PodLaunch, now: float) -> PodProcess:
        """Start the container of ``spec`` at time ``now``."""
        ...

    def adopt(self, spec: PodLaunch, record: Mapping[str, Any], now: float) -> PodProcess | None:
        """Re-attach to the container a previous server started (``record``: its runtime record).

        Returns the process while it runs, a finished process carrying its exit code when it
        ended while the server was down, or ``None`` when nothing of it can be found.
        """
        ...


def pod_environment(spec: PodLaunch, server: Mapping[str, str]) -> dict[str, str]:
    """The environment of a pod: the image's few variables, then the container's."""
    env = {key: server[key] for key in IMAGE_ENV if server.get(key)}
    env.setdefault("LANG", "C.UTF-8")
    env["PATH"] = server.get("PATH") or os.defpath
    env["HOSTNAME"] = spec.pod
    env.update(spec.env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    return env


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


def probe_container(supervisor: int, action: ProbeAction) -> bool:
    """Run a probe against the container of ``supervisor``: ``exec`` in its view, else the network.

    An ``exec`` probe runs its command with the container's environment, root and working
    directory (:func:`qosflow.local.shim.exec_in`), killed after ``timeoutSeconds``; it passes on
    exit code 0.
    """
    if action.kind != EXEC:
        return network_probe(action)
    pid = container_pid(supervisor)
    if pid is None or not action.command:
        return False
    try:
        done = subprocess.run(
            exec_command(pid, list(action.command)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=action.timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def pin_tree(pid: int, cores: tuple[int, ...]) -> None:
    """Re-pin every thread of the process tree of ``pid`` to ``cores``."""
    for tid in _threads_of_tree(pid):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cores)


class LocalProcess:
    """A pod container this server started (see :class:`ProcessRunner`)."""

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
        """OS process id (of the supervisor)."""
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
        pin_tree(self._popen.pid, cores)

    def terminate(self) -> None:
        """SIGTERM to the supervisor, which forwards it to the container (its PID 1)."""
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group, then reap."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)

    def probe(self, action: ProbeAction) -> bool:
        """Run a probe handler against the container (see :func:`probe_container`)."""
        return self._popen.poll() is None and probe_container(self._popen.pid, action)


class AdoptedProcess:
    """A container a previous server started and that still runs (it is not our child).

    Its exit is noticed through a pidfd where the kernel has them (else at the next tick), and its
    exit code is read from the file its supervisor writes.
    """

    def __init__(
        self,
        pid: int,
        start_ticks: int,
        exit_file: Path,
        on_exit: Callable[[], None] | None = None,
        *,
        weights: CpuWeights | None = None,
        key: str = "",
    ) -> None:
        self._pid, self._ticks, self._exit_file = pid, start_ticks, exit_file
        self._weights, self._key = weights, key
        self._code: int | None = None
        if on_exit is not None:
            self._watch(on_exit)

    def _watch(self, on_exit: Callable[[], None]) -> None:
        """Call ``on_exit`` from a thread once the process ends (needs ``pidfd_open``)."""
        try:
            fd = os.pidfd_open(self._pid)
        except (AttributeError, OSError):
            return
        if not process_alive(self._pid, self._ticks):  # the pid was reused meanwhile
            os.close(fd)
            return

        def wait() -> None:
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
            on_exit()

        threading.Thread(target=wait, name=f"qosflow-adopted-{self._pid}", daemon=True).start()

    @property
    def pid(self) -> int | None:
        """OS process id (of the supervisor)."""
        return self._pid

    @property
    def start_ticks(self) -> int | None:
        """Start time in clock ticks."""
        return self._ticks

    def poll(self, now: float) -> int | None:
        """The recorded exit code once the supervisor is gone (137 if it recorded none)."""
        if self._code is None and not process_alive(self._pid, self._ticks):
            code = read_exit_code(self._exit_file)
            self._code = 137 if code is None else code
            if self._weights is not None:
                self._weights.release(self._key)
        return self._code

    def set_cores(self, cores: tuple[int, ...], cpus: float) -> None:
        """Re-pin the process tree (and re-weight its cgroup)."""
        if self._weights is not None:
            self._weights.resize(self._key, round(cpus * 1000))
        if process_alive(self._pid, self._ticks):
            pin_tree(self._pid, cores)

    def terminate(self) -> None:
        """SIGTERM to the supervisor (it forwards it to the container)."""
        if process_alive(self._pid, self._ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group."""
        if process_alive(self._pid, self._ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)

    def probe(self, action: ProbeAction) -> bool:
        """Run a probe handler against the container (see :func:`probe_container`)."""
        return process_alive(self._pid, self._ticks) and probe_container(self._pid, action)


@dataclass(frozen=True, slots=True)
class ExitedProcess:
    """A container that ended while the server was down, with the exit code it recorded."""

    pid: int | None
    start_ticks: int | None
    code: int

    def poll(self, now: float) -> int | None:
        """The recorded exit code."""
        return self.code

    def set_cores(self, cores: tuple[int, ...], cpus: float) -> None:
        """Nothing runs any more."""

    def terminate(self) -> None:
        """Nothing runs any more."""

    def kill(self) -> None:
        """Nothing runs any more."""

    def probe(self, action: ProbeAction) -> bool:
        """Nothing runs any more: no probe passes."""
        return False


class ProcessRunner:
    """Runs each pod's command as a real local process (the image is ignored).

    Args:
        weights: Pod cgroups weighted by CPU request (``None``: pods run unweighted).
        isolation: ``private`` (each pod in its own file system view) or ``shared`` (pods share
            the host's, with volume paths rewritten); see :mod:`qosflow.local.sandbox`.
        hide: Host folders a ``private`` pod must not see (the local cluster's state directory).
    """

    def __init__(
        self,
        weights: CpuWeights | None = None,
        *,
        isolation: str = SHARED,
        hide: tuple[Path, ...] = (),
    ) -> None:
        self.weights = weights
        self.isolation = isolation
        self.hide = hide

    def command(
        self, spec: PodLaunch, exit_file: Path, procs: str
    ) -> tuple[list[str], dict[str, str]]:
        """The supervisor's command line and environment for ``spec`` (in this isolation mode)."""
        env = pod_environment(spec, os.environ)
        argv = list(spec.argv)
        plan: dict[str, Any] = {
            "cores": list(spec.cores),
            "procs": procs,
            "exit_file": str(exit_file),
            "cwd": spec.working_dir or "/",
            "sandbox": None,
        }
        if self.isolation == PRIVATE:
            plan["sandbox"] = sandbox_plan(spec.workdir, self.hide, spec.mounts)
        else:
            env = {key: rewrite(value, spec.mounts) for key, value in env.items()}
            argv = [rewrite(arg, spec.mounts) for arg in argv]
            cwd = shared_cwd(spec.workdir, spec.working_dir, spec.mounts)
            cwd.mkdir(parents=True, exist_ok=True)
            plan["cwd"] = str(cwd)
        return [*shim_command(plan), *argv], env

    def launch(self, spec: PodLaunch, now: float) -> PodProcess:
        """Start the supervised process pinned to ``spec.cores``; output goes to ``main.log``."""
        kill_leftover(spec.workdir)
        exit_file = spec.workdir / EXIT_FILE
        exit_file.unlink(missing_ok=True)
        key = f"{spec.namespace}_{spec.pod}"
        procs = self.weights.pod(key, round(spec.cpus * 1000)) if self.weights else None
        command, env = self.command(spec, exit_file, str(procs or ""))
        with open(spec.workdir / "main.log", "ab") as log:
            popen = subprocess.Popen(
                command,
                cwd=spec.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = LocalProcess(popen, spec.on_exit, weights=self.weights, key=key)
        write_pid_file(spec.workdir, popen.pid, process.start_ticks)
        return process

    def adopt(self, spec: PodLaunch, record: Mapping[str, Any], now: float) -> PodProcess | None:
        """The container of ``record`` if its supervisor still runs, else its recorded exit."""
        pid, ticks = record.get("pid"), record.get("start_ticks")
        exit_file = spec.workdir / EXIT_FILE
        if isinstance(pid, int) and isinstance(ticks, int) and process_alive(pid, ticks):
            key = f"{spec.namespace}_{spec.pod}"
            return AdoptedProcess(
                pid, ticks, exit_file, spec.on_exit, weights=self.weights, key=key
            )
        code = read_exit_code(exit_file)
        if code is None:
            return None
        return ExitedProcess(pid if isinstance(pid, int) else None, ticks, code)
