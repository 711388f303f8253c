"""Per-run metrics of a simulation, with their definitions in one place.

Definitions (issue 5 item 5, notes/algorithms.md §4.7):

* **deadline jobs**: jobs with a finite deadline; best-effort jobs are excluded from the ratio;
* **met**: a deadline job that finished at or before its deadline; a rejected job is a miss, and so
  is a job still unfinished when the run ends;
* **ratio** = met / deadline jobs; **fraction of bound** = met / upper bound;
* **met as guaranteed** / **met as best-effort**: met jobs that the policy had / had not guaranteed;
* **guarantee violations**: guaranteed jobs that missed their deadline;
* **utilisation** (the seed paper's metric): busy unit-seconds / allocated unit-seconds, where
  unit-seconds lost to restart overhead are allocated but not busy;
* **cluster load**: allocated unit-seconds / (capacity × span of the run);
* **rescales**: size changes of running jobs (starts excluded);
* **lateness p50/p95**: percentiles of (finish − deadline) over deadline jobs that finished late;
* **best-effort JCT**: mean completion time (finish − submit) of finished best-effort jobs;
* **policy CPU per decision**: CPU seconds the policy spent in ``decide``, per decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one job ended.

    Attributes:
        job_id: Trace id.
        submit: Arrival (s).
        deadline: Absolute deadline (s); ``inf`` for best effort.
        finish: Completion time (s), or ``None`` when it never finished.
        rejected: Refused by the policy (left the system).
        guaranteed: The policy guaranteed the deadline at some point.
        rescales: Size changes while running (the first start is not a rescale).
        gpu_seconds: Unit-seconds the job held.
    """

    job_id: str
    submit: float
    deadline: float
    finish: float | None
    rejected: bool
    guaranteed: bool
    rescales: int = 0
    gpu_seconds: float = 0.0

    @property
    def best_effort(self) -> bool:
        """True when the job has no deadline."""
        return math.isinf(self.deadline)

    @property
    def met(self) -> bool:
        """Finished at or before its deadline (best-effort jobs never count)."""
        return (
            not self.best_effort
            and not self.rejected
            and self.finish is not None
            and self.finish <= self.deadline
        )

    @property
    def lateness(self) -> float | None:
        """Lateness, finish − deadline, of a finished deadline job (negative = early), else ``None``."""
        if self.best_effort or self.finish is None or self.rejected:
            return None
        return self.finish - self.deadline


@dataclass(frozen=True, slots=True)
class Usage:
    """Resource accounting of one run.

    Attributes:
        capacity: Units in the cluster.
        span: Seconds from the first arrival to the last completion.
        allocated_unit_s: Unit-seconds held by jobs.
        busy_unit_s: Of those, unit-seconds spent making progress (not overhead).
        decisions: Number of policy decisions.
        policy_cpu_s: CPU seconds spent inside the policy.
    """

    capacity: int
    span: float
    allocated_unit_s: float
    busy_unit_s: float
    decisions: int
    policy_cpu_s: float


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """One row of ``results.csv`` (see the module docstring for every definition)."""

    policy: str
    deadline_jobs: int
    met: int
    ratio: float
    upper_bound: int | None
    fraction_of_bound: float | None
    met_guaranteed: int
    met_best_effort: int
    rejected: int
    guarantee_violations: int
    utilisation: float
    cluster_load: float
    rescales: int
    lateness_p50_s: float
    lateness_p95_s: float
    best_effort_jobs: int
    best_effort_jct_s: float
    decisions: int
    cpu_ms_per_decision: float
    wall_s: float

    def row(self) -> dict[str, Any]:
        """The CSV row, numbers rounded to stable text (so equal runs give equal bytes)."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, float):
                out[key] = "" if math.isnan(value) else f"{value:.4f}"
            elif value is None:
                out[key] = ""
            else:
                out[key] = value
        return out


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def compute(
    policy: str,
    outcomes: Sequence[JobOutcome],
    usage: Usage,
    *,
    upper_bound: int | None = None,
    wall_s: float = 0.0,
) -> RunMetrics:
    """Compute every metric of one run.

    Args:
        policy: Policy name.
        outcomes: Every job of the trace (finished, rejected or unfinished).
        usage: Resource accounting of the run.
        upper_bound: The offline upper bound on met jobs, when computed.
        wall_s: Wall-clock seconds of the run (measured by the caller, not by the simulator).

    Returns:
        The metrics row.
    """
    deadline = [o for o in outcomes if not o.best_effort]
    met = [o for o in deadline if o.met]
    late = [o.lateness for o in deadline if o.lateness is not None and o.lateness > 0]
    best = [o for o in outcomes if o.best_effort]
    jct = [o.finish - o.submit for o in best if o.finish is not None]
    n = len(deadline)
    alloc = usage.allocated_unit_s
    return RunMetrics(
        policy=policy,
        deadline_jobs=n,
        met=len(met),
        ratio=len(met) / n if n else 1.0,
        upper_bound=upper_bound,
        fraction_of_bound=(len(met) / upper_bound if upper_bound else None),
        met_guaranteed=sum(o.guaranteed for o in met),
        met_best_effort=sum(not o.guaranteed for o in met),
        rejected=sum(o.rejected for o in deadline),
        guarantee_violations=sum(o.guaranteed and not o.met for o in deadline),
        utilisation=usage.busy_unit_s / alloc if alloc > 0 else 1.0,
        cluster_load=(alloc / (usage.capacity * usage.span) if usage.span > 0 else 0.0),
        rescales=sum(o.rescales for o in outcomes),
        lateness_p50_s=_percentile([x for x in late if x is not None], 50),
        lateness_p95_s=_percentile([x for x in late if x is not None], 95),
        best_effort_jobs=len(best),
        best_effort_jct_s=float(np.mean(jct)) if jct else 0.0,
        decisions=usage.decisions,
        cpu_ms_per_decision=(
            1000.0 * usage.policy_cpu_s / usage.decisions if usage.decisions else 0.0
        ),
        wall_s=wall_s,
    )
