"""The profile ladder: one job of a key measures its scaling past one node, paid in units.

Past one node a plan counts only on measured scaling (:func:`qosflow.core.predict.belief_from_fit`),
and nothing plans a job at a size it does not believe faster. So a key that no run has measured
past one node is planned within one node for good: its jobs are believed no faster on two
nodes, no rule gives them two, and no run measures there. On ElasticFlow's elasticVpollux_e
trace (4 GPUs a node) that circle cost learned speeds 19 to 24 of the 157 deadlines the oracle
meets (docs/experiments.md, 2026-12-06 (eighth)).

The ladder breaks it. One running job of the key (its *profiler*) is raised to the smallest size
above one node that its key has not settled (:attr:`~qosflow.core.predict.Belief.settled`:
measured for :data:`~qosflow.core.windows.SETTLED_WINDOWS` clean windows, by this run or the
key's history), held there until it has, then raised to the next. It stops where a settled size
is not :data:`GAIN` times faster than the largest measured size below it (scaling has ended;
the model's guesses below do not count), or at the top of the ladder: the job's largest level,
at most half the cluster. The job trains at every rung, so the profile costs it only its
restarts; it costs the others the units it borrows, which come only from jobs without a
guarantee, the latest deadline first, shrunk to an allowed size; never from a guarantee. A rung
it cannot borrow whole waits for the next decision.

A key climbs only on demand: while one of its deadline jobs without a guarantee has no size it
may plan that makes its deadline (no minimal share, ``Prepared.need is None``). Then measuring
past one node is the only way that job, or the next like it, can be saved; a key whose jobs all
fit within what is measured lends its units to the others instead (climbing every key cost
195job two deadlines on some noise seeds). Once climbing, the profiler goes on to the end of
its ladder.

The shell records the profiler's samples in the key's history as soon as its ladder ends (the
watch, ``HistoryStore.record_samples``, which skips them at the finish step; the simulator's
learned speeds alike), so every later job of the key plans on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from qosflow.core.allocation import Prepared
from qosflow.core.predict import Belief

GAIN = 1.1
"""A settled size must be this many times faster than the measured one below it to go on."""


def rung(belief: Belief, *, per_node: int, capacity: int) -> int | None:
    """The size the job should measure next for its key, or ``None`` (nothing left to profile).

    Args:
        belief: The job's belief (its settled sizes are this run's and the key's history's).
        per_node: Units per node (the ladder starts above one node).
        capacity: Units in the cluster (the ladder stops at half of them).
    """
    if belief.settled is None:  # a table, not measurements: every size is known
        return None
    settled = set(belief.settled)
    step = belief.median.step_time
    for n in belief.levels:
        if n <= per_node or 2 * n > capacity:
            continue
        if n not in settled:
            return n
        below = max((m for m in belief.observed if m < n), default=None)
        if below is not None and step(n) * GAIN > step(below):
            return None  # scaling has ended here
    return None


class _Remembers(Protocol):
    """What the ladder reads of the allocator's memory of a job (``JobState``)."""

    @property
    def profiling(self) -> bool: ...


def profile(
    jobs: Sequence[Prepared],
    units: Mapping[str, int],
    capacity: int,
    states: Mapping[str, _Remembers],
) -> tuple[dict[str, int], set[str], bool]:
    """Raise one running job per key to its next rung, on borrowed units (see the module).

    Args:
        jobs: The jobs in allocation order.
        units: The allocation so far (rules 1-5); not changed.
        capacity: Units in the cluster.
        states: The allocator's memory of each job: whether it was its key's profiler at the
            last decision (it stays the profiler while it has a rung).

    Returns:
        The allocation with the profilers raised, the profilers now, and whether one of them
        holds its rung (it is measured interval by interval: decide again after the next one).
    """
    out = dict(units)
    wanted = {  # keys with a deadline job no plannable size saves: only those climb
        j.spec.key for j in jobs if not j.spec.best_effort and not j.guaranteed and j.need is None
    }
    rungs: dict[str, tuple[str, int]] = {}  # key -> (profiler, its rung)
    for job in jobs:  # per key: the profiler of the last decision, else the first that runs
        if job.snap.queued or out[job.name] <= 0:
            continue
        if job.spec.key not in wanted and not states[job.name].profiling:
            continue
        size = rung(job.belief, per_node=job.spec.resources.per_node, capacity=capacity)
        current = rungs.get(job.spec.key)
        if size is not None and (
            current is None or (states[job.name].profiling and not states[current[0]].profiling)
        ):
            rungs[job.spec.key] = (job.name, size)
    chosen = {name for name, _ in rungs.values()}
    lenders = sorted(
        (j for j in jobs if not j.guaranteed and j.name not in chosen),
        key=lambda j: (-j.spec.deadline, -j.spec.submitted_at, j.name),
    )
    measuring = False
    for name, size in rungs.values():
        short = size - out[name] - (capacity - sum(out.values()))
        cuts: dict[str, int] = {}
        for lender in lenders:
            if short <= 0:
                break
            held = out[lender.name]
            if held > 0:
                cuts[lender.name] = max(
                    (n for n in lender.belief.levels if n <= held - short), default=0
                )
                short -= held - cuts[lender.name]
        if short <= 0 and size > out[name]:  # else: not whole now, or held already
            out.update(cuts)
            out[name] = size
        measuring = measuring or out[name] == size
    return out, chosen, measuring
