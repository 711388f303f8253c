"""``SimCluster`` — the simulator behind the ``ClusterView``/``Actuator`` Protocols — and placement.

:func:`buddy_place` is ElasticFlow's buddy placement (``ALGORITHM.md`` §5.4): all jobs are
re-placed from scratch, largest first; a job of at least one node takes whole free nodes, smaller
ones go into partly used nodes (first fit, contiguous), else open a fresh node. With power-of-two
sizes in decreasing order this never fragments.

:class:`SimCluster` implements :class:`qosflow.cluster.ClusterView` and
:class:`qosflow.cluster.Actuator` on a virtual clock, so code written against ArgoCluster (the
Airflow steps, the CLI) runs unchanged against the simulator: ``submit`` creates a workflow that
runs at the speed the injected ``speed`` function gives, ``advance(t)`` moves the clock and the
progress, ``stop`` checkpoints (progress is kept by the job, the segment ends), ``resize`` works in
place for CPU units only, like the real thing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from qosflow.cluster import (
    Capacity,
    JobStatus,
    Phase,
    ResizeResult,
    ResizeState,
    SubmitRequest,
)
from qosflow.errors import ClusterError, NotFoundError
from qosflow.spec import Unit


def buddy_place(
    sizes: Sequence[tuple[str, int]], *, capacity: int, node_size: int
) -> dict[str, tuple[tuple[int, ...], int]]:
    """Place jobs on nodes, largest first; return ``{job: (node indices, first global rank)}``.

    Raises:
        ClusterError: When the sizes do not fit (more than the capacity, or fragmented by sizes
            that are not powers of two).
    """
    nodes = max(1, math.ceil(capacity / node_size))
    used = [0] * nodes
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for job_id, k in sorted(sizes, key=lambda s: -s[1]):
        if k >= node_size:
            want = math.ceil(k / node_size)
            free = [n for n in range(nodes) if used[n] == 0][:want]
            if len(free) < want:
                raise ClusterError(f"placement: no {want} free nodes for {job_id} ({k} units)")
            for n in free:
                used[n] = node_size
            out[job_id] = (tuple(free), free[0] * node_size)
            continue
        partly = [n for n in range(nodes) if 0 < used[n] <= node_size - k]
        empty = [n for n in range(nodes) if used[n] == 0]
        pick = partly[0] if partly else (empty[0] if empty else None)
        if pick is None:
            raise ClusterError(f"placement: no node has {k} free units for {job_id}")
        out[job_id] = ((pick,), pick * node_size + used[pick])
        used[pick] += k
    return out


@dataclass(slots=True)
class _Workflow:
    request: SubmitRequest
    status: JobStatus
    done: float


class SimCluster:
    """A simulated cluster behind the same Protocols as ArgoCluster (virtual time).

    Args:
        total: Units in the cluster.
        unit: Kind of unit (cpu | gpu | worker).
        node_size: Units per node.
        speed: ``speed(job, units)`` -> steps per second (the truth).
        start: Initial virtual time (epoch seconds).
    """

    def __init__(
        self,
        total: int,
        *,
        unit: Unit = "gpu",
        node_size: int = 8,
        speed: Callable[[str, int], float],
        start: float = 0.0,
    ) -> None:
        """Create an empty cluster at time ``start``."""
        if total < 1 or node_size < 1:
            raise ClusterError("total and node_size must be >= 1")
        self._total, self._unit, self._node_size = total, unit, node_size
        self._speed, self._now = speed, float(start)
        self._wf: dict[str, _Workflow] = {}

    # ClusterView
    def now(self) -> float:
        """Virtual time."""
        return self._now

    def capacity(self, unit: Unit) -> Capacity:
        """Free and total units (only the cluster's own unit kind exists)."""
        if unit != self._unit:
            return Capacity(unit=unit, total=0, free=0)
        used = sum(w.status.units for w in self._wf.values() if w.status.phase == Phase.RUNNING)
        return Capacity(unit=unit, total=self._total, free=self._total - used)

    def status(self, name: str) -> JobStatus:
        """One workflow's status; ``NotFoundError`` when unknown."""
        wf = self._wf.get(name)
        if wf is None:
            raise NotFoundError(f"workflow {name} not found")
        return wf.status

    def list_jobs(self, job: str | None = None) -> list[JobStatus]:
        """All workflows (optionally of one job), in submit order."""
        return [w.status for w in self._wf.values() if job is None or w.status.job == job]

    # Actuator
    def submit(self, request: SubmitRequest) -> JobStatus:
        """Start a segment (idempotent: an existing name is returned as it is)."""
        if request.name in self._wf:
            return self._wf[request.name].status
        if request.units < 1:
            raise ClusterError(f"{request.name}: units must be >= 1", retryable=False)
        done = max((w.done for w in self._wf.values() if w.request.job == request.job), default=0)
        fits = self.capacity(self._unit).free >= request.units
        status = JobStatus(
            name=request.name,
            job=request.job,
            segment=request.segment,
            phase=Phase.RUNNING if fits else Phase.PENDING,
            steps_done=int(done) if request.resume else 0,
            total_steps=request.total_steps,
            units=request.units,
            priority_class=request.priority_class,
            priority=request.priority,
            started_at=self._now if fits else None,
            pod_name=f"{request.name}-train",
        )
        self._wf[request.name] = _Workflow(request, status, done if request.resume else 0.0)
        return status

    def stop(self, name: str, *, message: str = "") -> JobStatus:
        """End a segment for checkpoint-restart (its progress stays with the job)."""
        wf = self._wf.get(name)
        if wf is None:
            raise NotFoundError(f"workflow {name} not found")
        if not wf.status.phase.finished:
            wf.status = replace(
                wf.status, phase=Phase.STOPPED, finished_at=self._now, message=message
            )
        return wf.status

    def resize(self, name: str, units: int) -> ResizeResult:
        """Resize a running segment in place (CPU only; others report ``Unsupported``)."""
        wf = self._wf.get(name)
        if wf is None:
            raise NotFoundError(f"workflow {name} not found")
        if not self.supports_in_place_resize(self._unit):
            return ResizeResult(
                ResizeState.UNSUPPORTED, wf.status.units, "only CPU resizes in place"
            )
        if units - wf.status.units > self.capacity(self._unit).free:
            return ResizeResult(ResizeState.INFEASIBLE, wf.status.units, "not enough free units")
        wf.status = replace(wf.status, units=units, resize=ResizeState.DONE)
        return ResizeResult(ResizeState.DONE, units)

    def supports_in_place_resize(self, unit: Unit) -> bool:
        """CPU quotas change in place; GPUs need a checkpoint-restart."""
        return unit == "cpu"

    def set_priority(
        self, name: str, *, priority: int, priority_class: str | None = None
    ) -> JobStatus:
        """Record the priority (the simulator does not preempt)."""
        wf = self._wf.get(name)
        if wf is None:
            raise NotFoundError(f"workflow {name} not found")
        klass = priority_class if priority_class is not None else wf.status.priority_class
        wf.status = replace(wf.status, priority=priority, priority_class=klass)
        return wf.status

    # simulation
    def advance(self, to: float) -> None:
        """Move the clock to ``to``: running segments progress, pending ones start when they fit."""
        if to < self._now:
            raise ClusterError(f"time cannot go back ({to} < {self._now})")
        for wf in self._wf.values():
            if wf.status.phase != Phase.RUNNING:
                continue
            rate = self._speed(wf.request.job, wf.status.units)
            total = wf.request.total_steps
            if rate > 0 and wf.done + rate * (to - self._now) >= total:
                end = self._now + (total - wf.done) / rate
                wf.done = float(total)
                wf.status = replace(
                    wf.status, phase=Phase.SUCCEEDED, steps_done=total, finished_at=end
                )
            else:
                wf.done += rate * (to - self._now)
                wf.status = replace(wf.status, steps_done=int(wf.done))
        self._now = float(to)
        for wf in self._wf.values():
            if (
                wf.status.phase == Phase.PENDING
                and self.capacity(self._unit).free >= wf.status.units
            ):
                wf.status = replace(wf.status, phase=Phase.RUNNING, started_at=self._now)
