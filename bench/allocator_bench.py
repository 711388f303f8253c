"""What one call of the cluster allocator costs: 1,000 active jobs on ElasticFlow's A100 speeds.

Prints ``allocate_1000_ms_p50`` (target: at most 50 ms; every watch of every job runs one
allocation per decision) next to ``allocate_100_ms_p50`` and the mix of the snapshot.

The snapshot: 1,000 jobs of ElasticFlow's A100 throughput tables (oracle beliefs, as the board
carries them), deadlines 1 h to 7 days away, each sized to take 30-90 % of its window at its
smallest level; 600 of them guaranteed and running, the rest waiting; capacity enough for all
at their smallest levels, times 1.2. A decision between arrivals: every job was seen before and
the waiting ones were asked again a moment ago (an arrival adds one admission, see
``admission_1000_ms_p50`` in ``bench/core_bench.py``).
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime

import numpy as np

from qosflow.core.allocator import ClusterInput, JobInput, JobState, allocate
from qosflow.core.predict import oracle_belief
from qosflow.core.spec import JobSpec, Resources
from qosflow.core.speed import TableCurve
from qosflow.sim.trace import load_throughputs

NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC).timestamp()


def snapshot(count: int, rng: np.random.Generator) -> ClusterInput:
    """A board of ``count`` jobs (see the module docstring)."""
    table = load_throughputs("A100")
    curves = [dict(table.curve(m, b)) for m, b in sorted(table.curves)]
    jobs, need = [], 0.0
    for i in range(count):
        speeds = curves[int(rng.integers(len(curves)))]
        levels = tuple(sorted(speeds))
        belief = oracle_belief(TableCurve(speeds), levels)
        window = float(rng.uniform(3600.0, 7 * 86400.0))
        steps = max(int(rng.uniform(0.3, 0.9) * window * speeds[levels[0]]), 1)
        running = i < count * 0.6
        spec = JobSpec(
            name=f"j{i}", key=f"k{i % 40}", total_steps=steps, submitted_at=NOW - 60.0,
            deadline=NOW + window, resources=Resources("gpu", levels, 8, "1Gi"),
            checkpoint_every_steps=max(steps // 100, 1), best_effort=False,
            if_not_guaranteed="run_best_effort", margin_seconds=60.0, dwell_seconds=600.0,
            image="bench", command=("bench",),
        )  # fmt: skip
        state = JobState(
            seen=True, guaranteed=running, floor=1.0 if running else 0.0, asked_at=NOW - 10.0
        )
        units = levels[0] if running else 0
        jobs.append(JobInput(spec, 0.0, units, belief, state, 30.0))
        need += levels[0] * steps / speeds[levels[0]] / window
    capacity = max(64, int(need * 1.2))
    return ClusterInput(now=NOW, capacity=capacity, slot_s=60.0, jobs=tuple(jobs))


def allocate_ms(count: int, reps: int) -> float:
    """Median wall milliseconds of one allocation over ``count`` jobs."""
    cluster = snapshot(count, np.random.default_rng(7))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = allocate(cluster)
        times.append(time.perf_counter() - start)
    held = sum(a.units for a in out.jobs.values())
    print(f"allocate_{count}_capacity: {cluster.capacity}")
    print(f"allocate_{count}_units_allocated: {held}")
    print(f"allocate_{count}_guaranteed: {sum(a.guaranteed for a in out.jobs.values())}")
    return statistics.median(times) * 1e3


def main() -> int:
    for count, reps in ((100, 5), (1000, 3)):
        ms = allocate_ms(count, reps)
        print(f"allocate_{count}_ms_p50: {ms:.1f}")
    print("allocate_1000_ms_p50_target: 50.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
