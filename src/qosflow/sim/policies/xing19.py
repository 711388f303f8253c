"""``xing19`` — a RECONSTRUCTION of the seed paper's heuristic (Xing et al., IJCNN 2019).

The paper describes its scheduler in words only; no code was published. What it states, and what
this module does:

* *QoS ordering*: jobs are ordered by deadline, ties by resource status (the job needing fewer
  units first, so more jobs fit);
* *prediction*: training time is predictable, so each job's finish is predicted at every candidate
  size — here with the core's predictor and minimal share (:func:`qosflow.core.decide.minimal_share`,
  the same functions the pipeline steps call);
* *skip jobs that can no longer make it*: a job whose deadline cannot be met even at its knee is
  not given capacity while others still can use it;
* *autoscaling to the minimal configuration*: each job gets the smallest size that meets its
  deadline, in order, as long as it fits; jobs that do not fit wait (later jobs may backfill);
* *full utilisation of allocated resources*: units left over go, in the same order, to jobs that
  are waiting (deadline-missing ones included), at the largest size that fits.

What it does NOT have (and the ``qosflow`` policy does): admission control with guarantees and
counter-offers, margins from prediction uncertainty, laxity classes, rescale hysteresis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qosflow.core.decide import minimal_share
from qosflow.core.predict import Calibration
from qosflow.sim.adapter import job_snapshot
from qosflow.sim.policies.qosflow_policy import belief_of, job_spec
from qosflow.sim.policy import NoOverhead, OverheadModel, SlotDecision, SlotSnapshot


@dataclass
class Xing19Policy:
    """Deadline + resource-status ordering, skip the hopeless, minimal configuration (rebuilt).

    Attributes:
        name: Policy name in results.
        overhead: The engine's overhead model for this policy.
        margin_s: Absolute margin the minimal share keeps before the deadline.
        calibration: ``None`` for oracle speeds; else the inflation of learned speeds.
        rescale_overhead_s: Restart its minimal share charges a running job's change of size.
            A start is not charged: the paper predicts a job's training time only, and this
            reconstruction was measured that way from the start (the core's plan charges a
            start too, :func:`~qosflow.core.predict.restart_charge`; on elasticVpollux_e that
            costs this policy 6 of its 169 deadlines).
    """

    name: str = "xing19"
    overhead: OverheadModel = field(default_factory=NoOverhead)
    margin_s: float = 0.0
    calibration: Calibration | None = None
    rescale_overhead_s: float = 30.0

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Allocate minimal configurations in deadline order, then the leftover."""
        plans = []
        for view in snap.jobs:
            spec = job_spec(view, node_size=snap.node_size, margin_s=self.margin_s, dwell_s=0.0)
            belief = belief_of(view, spec.resources.levels, self.calibration)
            js = job_snapshot(
                view,
                spec,
                now=snap.now,
                last_rescale_at=None,
                rescale_overhead_s=0.0 if view.units == 0 else self.rescale_overhead_s,
            )
            need = None if view.best_effort else minimal_share(belief, js)
            plans.append((view, belief, need))
        plans.sort(key=lambda p: (p[0].deadline, p[2] or 1 << 30, p[0].submit, p[0].job_id))
        alloc: dict[str, int] = {}
        free = snap.capacity
        for view, _, need in plans:
            if need is not None and need <= free:
                alloc[view.job_id] = need
                free -= need
        for view, belief, _ in plans:
            if view.job_id in alloc or free <= 0:
                continue
            fits = [n for n in belief.levels if n <= min(free, belief.knee)]
            if fits:
                alloc[view.job_id] = fits[-1]
                free -= fits[-1]
        return SlotDecision(allocation=alloc)
