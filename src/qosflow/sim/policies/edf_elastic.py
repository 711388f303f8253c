"""``edf-elastic`` — the ElasticFlow artifact's EDF baseline (``ALGORITHM.md`` §5.7).

Elastic earliest-deadline-first with no admission control and no overhead: at every decision the
active jobs are ordered by deadline (stable, in arrival order on ties) and each gets
``min(cap, capacity)`` units if that many are free, otherwise the largest allowed level that fits
(possibly 0). ``cap`` is the generic cap (largest table column, <= 64, <= batch size). It ignores
``num_gpu``; greedy scale-out wastes units on poorly scaling jobs, which is why it collapses
under load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qosflow.sim.policy import NoOverhead, OverheadModel, SlotDecision, SlotSnapshot


@dataclass
class EdfElastic:
    """The artifact's elastic EDF (see the module docstring)."""

    name: str = "edf-elastic"
    overhead: OverheadModel = field(default_factory=NoOverhead)

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Hand units out in deadline order."""
        free = snap.capacity
        allocation: dict[str, int] = {}
        for job in sorted(snap.jobs, key=lambda j: j.deadline):
            base = min(job.max_units, snap.capacity)
            if base <= 0 or free <= 0:
                continue
            units = base if free >= base else max((k for k in job.speeds if k <= free), default=0)
            if units > 0:
                allocation[job.job_id] = units
                free -= units
        return SlotDecision(allocation=allocation)
