"""The fill by runs places every job exactly where the one-by-one fill does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.core.plan import IntArray
from qosflow.core.timeline import (
    SNAPSHOT_EVERY,
    Candidate,
    FillJob,
    Timeline,
    edf,
    fill_job,
    place_in_order,
    timeline,
)

NOW = 1_000_000.0
SLOT = 60.0


@st.composite
def fills(draw: st.DrawFn) -> tuple[list[FillJob], int]:
    """Up to 200 jobs on a small cluster: most fit at one level, some only level by level."""
    capacity = draw(st.integers(1, 32))
    jobs = []
    for i in range(draw(st.integers(0, 200))):
        levels = tuple(sorted(draw(st.sets(st.sampled_from([1, 2, 4, 8, 16]), min_size=1))))
        t1 = draw(st.floats(0.05, 3.0))
        times = tuple(t1 / n ** draw(st.floats(0.0, 1.0)) for n in levels)
        hours = draw(st.floats(0.05, 30.0))
        steps = max(1, int(draw(st.floats(0.01, 1.2)) * hours * 3600 / min(times)))
        running = draw(st.sampled_from([0, 0, 0, levels[0]]))
        margin = draw(st.sampled_from([0.0, 300.0]))
        c = Candidate(
            f"j{i}", NOW + hours * 3600, steps, margin, levels, times, bool(running), running
        )
        jobs.append(fill_job(c, capacity, i))
    return edf(jobs), capacity


def one_by_one(
    tl: Timeline, order: list[FillJob], stop: bool
) -> tuple[dict[str, tuple[int, int, list[int], int]], list[str], list[list[int]]]:
    """The fill as it was written first: each job placed on the free units the others left."""
    placed, failed, snaps = {}, [], []
    for i, job in enumerate(order):
        if i % SNAPSHOT_EVERY == 0:
            snaps.append(tl.free.tolist())
        got = tl.place(job)
        if got is None:
            failed.append(job.name)
            if stop:
                break
            continue
        tl.apply(got)
        units = np.broadcast_to(got.alloc, (got.end - got.start,)).tolist()
        placed[job.name] = (got.start, got.end, units, got.share)
    return placed, failed, snaps


@settings(max_examples=100, deadline=None)
@given(fills(), st.booleans())
def test_runs_place_every_job_where_one_by_one_does(
    case: tuple[list[FillJob], int], stop: bool
) -> None:
    """Same placements, same failures, same free units after, same snapshots on the way.

    The guarantees' plan, admission's test and its counter-offer all read these; a run that
    placed a job one slot off would change a verdict.
    """
    order, capacity = case
    edges = timeline(NOW, max([NOW, *(j.due for j in order)]), SLOT, [j.due for j in order])
    pinned = sum(j.pin_units for j in order)
    ref_tl, tl = (Timeline(edges, capacity, SLOT, pinned) for _ in range(2))
    ref_placed, ref_failed, ref_snaps = one_by_one(ref_tl, order, stop)
    snaps: list[IntArray] = []
    placed, failed = place_in_order(tl, order, stop=stop, snapshots=snaps)
    got = {
        k: (p.start, p.end, np.broadcast_to(p.alloc, (p.end - p.start,)).tolist(), p.share)
        for k, p in placed.items()
    }
    assert got == ref_placed
    assert failed == ref_failed
    assert tl.free.tolist() == ref_tl.free.tolist()
    assert [s.tolist() for s in snaps] == ref_snaps
