"""Allowed CPUs and a BLAS thread pool that follows them.

A pod's CPU budget shows up in two places on Linux:

* the **CPU affinity** mask (``os.sched_getaffinity``) — what the local cluster changes on an
  in-place resize, and what cpusets / the static CPU manager set on Kubernetes;
* the cgroup v2 **CFS quota** ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``) — what a
  Kubernetes CPU limit becomes.

:func:`allowed_cpus` is the minimum of both, with the quota rounded **down** to whole CPUs (at
least 1): more BLAS threads than the quota only buys throttling stalls. The cgroup files checked
are the process's own cgroup and all its ancestors (from ``/proc/self/cgroup``), since a limit
set on the pod's parent cgroup binds the container too.

:class:`CpuFollower` re-reads the budget and resizes a thread pool — by default the BLAS/OpenMP
pools (threadpoolctl); the reference trainer passes its own worker pool instead. When
the affinity mask of the main thread changed, it copies the new mask to every thread of the
process: ``os.sched_setaffinity(pid, ...)`` by an outside agent only changes the main thread, and
worker threads created earlier would otherwise stay on the old CPUs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded only when a follower is built: `import qosflow_trainer` stays light
    from threadpoolctl import ThreadpoolController

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Read by the BLAS/OpenMP libraries when numpy loads them (``python -m qosflow_trainer`` sets
them to 1, so the limit holds without threadpoolctl)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def cgroup_cpu_limit(cpu_max: Path) -> float | None:
    """CPUs granted by one cgroup v2 ``cpu.max`` file.

    Returns:
        ``quota / period`` in CPUs, or ``None`` when the file is missing, unreadable, malformed
        or says ``max`` (no limit).
    """
    try:
        fields = cpu_max.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(fields) not in (1, 2) or fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) == 2 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def own_cpu_max_files(
    proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT
) -> tuple[Path, ...]:
    """The ``cpu.max`` files of this process's cgroup v2 and of all its ancestors.

    Returns:
        Paths from the own cgroup up to the root (files may not exist); empty without cgroup v2.
    """
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ()
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            directory = root / rel.strip().lstrip("/")
            chain = [directory, *directory.parents]
            return tuple(d / "cpu.max" for d in chain if d == root or root in d.parents)
    return ()


def allowed_cpus(*, pid: int = 0, cpu_max: Path | Sequence[Path] | None = None) -> int:
    """How many CPUs this process may use right now: min(affinity, cgroup v2 quota), at least 1.

    Args:
        pid: Process (or thread) whose affinity is read; 0 means the calling thread.
        cpu_max: ``cpu.max`` file(s) to read instead of the process's own cgroup chain (tests and
            unusual mounts inject it here).

    Returns:
        The number of CPUs a thread pool should use.
    """
    cpus = len(os.sched_getaffinity(pid))
    files: Sequence[Path]
    if cpu_max is None:
        files = own_cpu_max_files()
    elif isinstance(cpu_max, Path):
        files = (cpu_max,)
    else:
        files = cpu_max
    limits = [limit for f in files if (limit := cgroup_cpu_limit(f)) is not None]
    if limits:
        cpus = min(cpus, max(1, math.floor(min(limits) + 1e-9)))
    return max(1, cpus)


def spread_affinity(mask: set[int]) -> int:
    """Apply ``mask`` to every thread of this process.

    Returns:
        How many threads were updated (threads that exited meanwhile are skipped).
    """
    updated = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), mask)
        except (OSError, ValueError):
            continue
        updated += 1
    return updated


class CpuFollower:
    """Keeps a thread pool sized to :func:`allowed_cpus`.

    Args:
        cpu_max: Passed to :func:`allowed_cpus`.
        reader: Replaces :func:`allowed_cpus` entirely (tests).
        controller: threadpoolctl controller (default: one over the loaded libraries, built
            only when ``apply`` is not given; needs ``pip install 'qosflow-trainer[threads]'``).
        apply: Called with the new thread count (default: limit the BLAS/OpenMP pools of
            ``controller`` to it).

    Raises:
        ImportError: Neither ``apply`` nor ``controller`` given and threadpoolctl is missing
            (the message says how to install it).
    """

    def __init__(
        self,
        *,
        cpu_max: Path | Sequence[Path] | None = None,
        reader: Callable[[], int] | None = None,
        controller: ThreadpoolController | None = None,
        apply: Callable[[int], object] | None = None,
    ) -> None:
        self._reader = reader or (lambda: allowed_cpus(cpu_max=cpu_max))
        if controller is None and apply is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                raise ImportError(
                    "CpuFollower resizes BLAS/OpenMP pools through threadpoolctl: "
                    "pip install 'qosflow-trainer[threads]', or pass apply= to resize your own pool"
                ) from None
            controller = ThreadpoolController()
        self._controller = controller
        self._apply = apply or self._limit_blas
        self._mask: frozenset[int] = frozenset(os.sched_getaffinity(0))
        self.threads = 0

    def check(self) -> int | None:
        """Re-read the budget; resize the pools when it changed.

        Returns:
            The new thread count when it changed, else ``None``.
        """
        mask = frozenset(os.sched_getaffinity(0))
        if mask != self._mask:
            self._mask = mask
            spread_affinity(set(mask))
        wanted = self._reader()
        if wanted == self.threads:
            return None
        self._apply(wanted)
        self.threads = wanted
        return wanted

    def _limit_blas(self, threads: int) -> None:
        if self._controller is not None:
            self._controller.limit(limits=threads)

    def pool_sizes(self) -> dict[str, int]:
        """Current thread count of each loaded BLAS/OpenMP pool, by library file name.

        ``{}`` when the follower has no threadpoolctl controller.
        """
        if self._controller is None:
            return {}
        return {
            Path(str(info["filepath"])).name: int(info["num_threads"])
            for info in self._controller.info()
        }
