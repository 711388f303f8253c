"""The profile ladder: a key's scaling past one node is measured, on units no promise needs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from qosflow.core.allocator import Allocation, ClusterInput, JobInput, JobState, allocate
from qosflow.core.predict import Belief
from qosflow.core.profile import GAIN, rung
from qosflow.core.spec import JobSpec, load_job
from qosflow.core.speed import TableCurve

T0 = datetime(2026, 12, 6, 22, 0, tzinfo=UTC).timestamp()
LEVELS = (1, 2, 4, 8, 16)
PER_NODE = 4


def belief(rates: dict[int, float], settled: tuple[int, ...] | None) -> Belief:
    """Median and conservative alike (steps per second by size); ``settled`` as given."""
    curve = TableCurve(rates)
    levels = tuple(sorted(rates))
    return Belief(curve, curve, levels, levels[-1], settled or (), settled)


def unmeasured_past_the_node(settled: tuple[int, ...] | None) -> Belief:
    """A job measured within its node: believed no faster past it (the plan's cap)."""
    flat = {n: min(n, PER_NODE) * 1.0 for n in LEVELS}
    return replace(belief(flat, settled), knee=PER_NODE)


SCALES = {1: 1.0, 2: 2.0, 4: 4.0, 8: 7.0, 16: 12.0}
"""Steps per second by size: every size faster than the one below by more than GAIN."""


def test_the_first_size_past_one_node_not_settled_is_the_next_rung() -> None:
    assert rung(belief(SCALES, (1, 4)), per_node=PER_NODE, capacity=64) == 8
    assert rung(belief(SCALES, (4, 8)), per_node=PER_NODE, capacity=64) == 16


def test_the_ladder_ends_at_the_top_or_at_half_the_cluster() -> None:
    assert rung(belief(SCALES, (4, 8, 16)), per_node=PER_NODE, capacity=64) is None
    assert rung(belief(SCALES, (4, 8)), per_node=PER_NODE, capacity=31) is None  # 16 > 31 / 2


def test_the_ladder_ends_where_a_settled_size_is_not_faster_enough() -> None:
    flat = {**SCALES, 8: SCALES[4] * GAIN * 0.99}  # 8 units barely beat 4
    assert rung(belief(flat, (4, 8)), per_node=PER_NODE, capacity=64) is None


def test_only_measured_sizes_below_can_end_the_ladder() -> None:
    """A model's guess below (4 units, never measured) does not stop the climb at 8."""
    guessed = {**SCALES, 4: SCALES[8] * 2}
    assert rung(belief(guessed, (8,)), per_node=PER_NODE, capacity=64) == 16


def test_within_one_node_or_with_known_speeds_there_is_nothing_to_profile() -> None:
    small = {n: r for n, r in SCALES.items() if n <= PER_NODE}
    assert rung(belief(small, ()), per_node=PER_NODE, capacity=64) is None
    assert rung(belief(SCALES, None), per_node=PER_NODE, capacity=64) is None  # a table


def spec(
    name: str,
    key: str,
    *,
    deadline_s: float,
    best_effort: bool = False,
    levels: tuple[int, ...] = LEVELS,
) -> JobSpec:
    return load_job(
        {
            "name": name,
            "key": key,
            "total_steps": 1_000_000,
            "deadline": f"PT{deadline_s:.0f}S",
            "best_effort": best_effort,
            "resources": {
                "unit": "gpu",
                "min": levels[0],
                "max": levels[-1],
                "levels": list(levels),
                "per_node": PER_NODE,
            },
        },
        now=datetime.fromtimestamp(T0, UTC),
    )


NEEDY_S = 100_000
"""The climber's deadline: 1,000,000 steps at 4 per second within one node take 250,000 s."""


def run(
    profiler: Belief, lender_guaranteed: bool, *, deadline_s: float = NEEDY_S
) -> tuple[ClusterInput, Allocation]:
    """A 16-unit cluster: the profiler runs on 4, a job of another key holds 12.

    The profiler holds no promise and, by default, no size it may plan makes its deadline.
    """
    state = JobState(seen=True, guaranteed=True, floor=1.0) if lender_guaranteed else None
    lender = JobInput(
        spec(
            "lender",
            "other",
            deadline_s=400_000,
            best_effort=not lender_guaranteed,
            levels=(4, 8, 12),
        ),
        0.0,
        12,
        belief({4: 4.0, 8: 7.0, 12: 9.0}, None),
        state or JobState(seen=True),
    )
    climber = JobInput(
        spec("climber", "new-model", deadline_s=deadline_s),
        0.0,
        4,
        profiler,
        JobState(seen=True),
    )
    c = ClusterInput(now=T0, capacity=16, slot_s=60.0, jobs=(climber, lender))
    return c, allocate(c)


def test_a_profiler_borrows_its_rung_from_a_job_without_a_guarantee() -> None:
    _, out = run(unmeasured_past_the_node((4,)), lender_guaranteed=False)
    assert out.jobs["climber"].units == 8
    assert out.jobs["climber"].state.profiling
    assert out.jobs["lender"].units == 8  # shrunk to an allowed size
    assert out.wake_at == int(T0 + 60)  # the rung is measured interval by interval
    _, inert = run(unmeasured_past_the_node(None), lender_guaranteed=False)
    assert inert.jobs["climber"].units == 4 and not inert.jobs["climber"].state.profiling
    assert inert.jobs["lender"].units == 12


def test_a_profiler_never_takes_a_guarantees_units() -> None:
    _, out = run(unmeasured_past_the_node((4,)), lender_guaranteed=True)
    _, inert = run(unmeasured_past_the_node(None), lender_guaranteed=True)
    assert out.jobs["lender"].units == inert.jobs["lender"].units
    assert out.jobs["climber"].units == inert.jobs["climber"].units
    assert out.jobs["climber"].state.profiling  # it stays the profiler and waits for units


def test_one_profiler_per_key_and_it_stays_the_one() -> None:
    c, out = run(unmeasured_past_the_node((4,)), lender_guaranteed=False)
    second = replace(c.jobs[0], spec=replace(c.jobs[0].spec, name="second"), units=0)
    again = replace(
        c,
        jobs=(
            second,
            replace(c.jobs[0], units=8, state=out.jobs["climber"].state),
            replace(c.jobs[1], units=8),
        ),
    )
    nxt = allocate(again)
    assert nxt.jobs["climber"].state.profiling
    assert not nxt.jobs["second"].state.profiling


def test_a_key_climbs_only_while_a_job_of_it_cannot_make_its_deadline() -> None:
    """Every job of the key fits within what is measured: the units stay with the others."""
    _, out = run(unmeasured_past_the_node((4,)), lender_guaranteed=False, deadline_s=10**7)
    assert out.jobs["climber"].units == 4 and not out.jobs["climber"].state.profiling
    assert out.jobs["lender"].units == 12


def test_a_profiler_goes_on_when_its_job_no_longer_needs_it() -> None:
    """Once climbing, the ladder runs to its end: its measurement serves the key's next jobs."""
    c, out = run(unmeasured_past_the_node((4,)), lender_guaranteed=False, deadline_s=10**7)
    held = replace(c.jobs[0], units=8, state=replace(c.jobs[0].state, profiling=True))
    nxt = allocate(replace(c, jobs=(held, replace(c.jobs[1], units=8))))
    assert nxt.jobs["climber"].state.profiling and nxt.jobs["climber"].units == 8
    assert not out.jobs["climber"].state.profiling
