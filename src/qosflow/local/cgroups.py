"""CPU requests as cgroup weights: pods get the CPUs they requested first, as on a node.

On Kubernetes a pod's CPU request becomes its cgroup's ``cpu.shares`` (v1) or ``cpu.weight``
(v2), and a node that enforces its allocatable (``--enforce-node-allocatable=pods``, with the
host's own daemons under ``system-reserved``) keeps the rest of the host from eating into what
pods requested. Without that, a local process pinned to "its" cores still competes on equal terms
with everything else the host runs (a browser, a build, the Airflow processes that drive the
demo), and a job given 2 CPUs gets barely more than one.

:class:`CpuWeights` gives the local cluster the same behaviour where the host lets it: a parent
cgroup for the node whose weight is :data:`NODE_WEIGHT` times that of the host's other
processes (they play ``system-reserved``), and one child per pod weighted by its request with
the kubelet's formula (``shares = milliCPU * 1024 / 1000``, ``weight = 1 + (shares - 2) * 9999 /
262142``). It needs a writable CPU controller (root, or a delegated cgroup v2 subtree); where
there is none, :meth:`CpuWeights.detect` returns ``None``, pods run unweighted and the local
cluster says so (``qosflow local up`` prints it, the demo warns).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

_LOG = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
NODE_WEIGHT = 10
"""The node's weight against one of the host's other processes, per allocatable CPU."""


def shares_for(milli: int) -> int:
    """The kubelet's ``cpu.shares`` for a request of ``milli`` millicores (at least 2)."""
    return max(2, milli * 1024 // 1000)


def weight_for(shares: int) -> int:
    """The kubelet's cgroup v2 ``cpu.weight`` for ``shares`` (1..10000)."""
    return max(1, min(10000, 1 + (shares - 2) * 9999 // 262142))


@dataclass(frozen=True, slots=True)
class CpuWeights:
    """The node's cgroup and its pods' children (see the module docstring).

    Attributes:
        node: The node's cgroup directory.
        v2: True for the unified hierarchy (``cpu.weight``), False for v1 (``cpu.shares``).
    """

    node: Path
    v2: bool

    @classmethod
    def detect(cls, name: str, cpus: int, root: Path = ROOT) -> CpuWeights | None:
        """Create the node's cgroup ``name`` for ``cpus`` CPUs, or ``None`` where the host forbids it."""
        v2 = (root / "cgroup.controllers").is_file()
        base = root if v2 else root / "cpu"
        if v2 and "cpu" not in _read(root / "cgroup.controllers").split():
            return None
        if not os.access(base, os.W_OK):
            return None
        node = base / "qosflow-local" / name
        try:
            node.mkdir(parents=True, exist_ok=True)
            if v2:
                for parent in (base, node.parent):  # children get the cpu controller
                    with contextlib.suppress(OSError):
                        (parent / "cgroup.subtree_control").write_text("+cpu")
            weights = cls(node, v2)
            weights._set(node.parent, 1024 * NODE_WEIGHT * max(cpus, 1))
            weights._set(node, 1024 * NODE_WEIGHT * max(cpus, 1))
        except OSError as exc:
            _LOG.info("cgroup CPU weights unavailable (%s): pods compete with the host", exc)
            return None
        return weights

    def _set(self, group: Path, shares: int) -> None:
        if self.v2:
            (group / "cpu.weight").write_text(str(weight_for(shares)))
        else:
            (group / "cpu.shares").write_text(str(shares))

    def pod(self, key: str, milli: int) -> Path | None:
        """The cgroup of one pod, weighted by its request; its ``cgroup.procs`` path to join."""
        group = self.node / key.replace("/", "_")
        try:
            group.mkdir(exist_ok=True)
            self._set(group, shares_for(milli))
        except OSError as exc:
            _LOG.warning("pod %s: no cgroup (%s); it competes with the host", key, exc)
            return None
        return group / "cgroup.procs"

    def resize(self, key: str, milli: int) -> None:
        """Re-weight a pod after an in-place resize."""
        with contextlib.suppress(OSError):
            self._set(self.node / key.replace("/", "_"), shares_for(milli))

    def release(self, key: str) -> None:
        """Remove a pod's cgroup once its processes are gone (a busy one is left for later)."""
        with contextlib.suppress(OSError):
            (self.node / key.replace("/", "_")).rmdir()

    def close(self) -> None:
        """Remove the node's empty cgroups (pods still running keep theirs)."""
        with contextlib.suppress(OSError):
            for child in self.node.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            self.node.rmdir()
            self.node.parent.rmdir()  # the last local cluster of the host tidies the parent


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return ""
