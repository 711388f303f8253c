"""``k8s-default`` — FIFO with the user-requested static size (the seed paper's baseline).

Jobs start in arrival order with ``num_gpu`` units (clamped to the largest allowed count that the
cluster can hold) and keep that size until they finish; a job at the head of the queue that does
not fit blocks the ones behind it, like the default Kubernetes scheduler with a FIFO queue of
gang-scheduled pods. No deadline awareness, no rescaling, so no rescale overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qosflow.sim.policy import JobView, NoOverhead, OverheadModel, SlotDecision, SlotSnapshot


def requested_units(job: JobView, capacity: int) -> int:
    """The job's static size: ``num_gpu``, or the largest allowed count below it that fits."""
    allowed = [k for k in job.speeds if k <= min(job.requested, capacity)]
    return max(allowed, default=min(job.speeds, default=0))


@dataclass
class K8sDefault:
    """FIFO, static size (see the module docstring)."""

    name: str = "k8s-default"
    overhead: OverheadModel = field(default_factory=NoOverhead)

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Keep running jobs; start waiting ones in arrival order while the head fits."""
        allocation = {j.job_id: j.units for j in snap.jobs if j.units > 0}
        free = snap.capacity - sum(allocation.values())
        for job in sorted(snap.jobs, key=lambda j: j.submit):
            if job.units > 0:
                continue
            units = requested_units(job, snap.capacity)
            if units > free:
                break
            allocation[job.job_id] = units
            free -= units
        return SlotDecision(allocation=allocation)
