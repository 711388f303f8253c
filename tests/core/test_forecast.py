"""The forecast: a promise is proved against the deadline jobs the recent past says are coming."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from qosflow.core.allocator import ClusterInput, JobInput, JobState, allocate
from qosflow.core.errors import SpecError
from qosflow.core.forecast import (
    SUFFIX,
    Arrival,
    Memory,
    arrival_from_dict,
    arrival_to_dict,
    remember,
    rivals,
)
from qosflow.core.predict import Belief
from qosflow.core.spec import JobSpec, load_job
from qosflow.core.speed import TableCurve
from qosflow.core.timeline import Candidate

T0 = datetime(2026, 12, 7, 22, 0, tzinfo=UTC).timestamp()
LEVELS = (1, 2, 4)
RATES = {1: 1.0, 2: 2.0, 4: 4.0}
"""Steps per second by size: linear scaling on a 4-unit cluster."""


def arrival(name: str, *, submitted: float, deadline: float, steps: int = 28_000) -> Arrival:
    """A job as its first ask saw it (conservative step times from :data:`RATES`)."""
    return Arrival(
        T0 + submitted,
        Candidate(
            name=name,
            deadline=T0 + deadline,
            remaining_steps=steps,
            margin=60.0,
            levels=LEVELS,
            step_time=tuple(1.0 / RATES[n] for n in LEVELS),
        ),
    )


def test_a_recent_job_whose_deadline_passed_comes_again_one_window_later() -> None:
    """Asked with 10,000 s left: what came in the last 10,000 s comes again 10,000 s later."""
    past = arrival("nightly", submitted=-8_000, deadline=-1_000)
    (again,) = rivals([past], deadline=T0 + 10_000, now=T0)
    assert again.name == "nightly" + SUFFIX
    assert again.deadline == T0 + 9_000
    assert again.guaranteed and again.running_units == 0
    assert again.remaining_steps == past.candidate.remaining_steps
    assert again == replace(past.candidate, name=again.name, deadline=T0 + 9_000, guaranteed=True)


def test_only_arrivals_inside_the_window_whose_repeat_is_due_in_time_count() -> None:
    older = arrival("older", submitted=-10_500, deadline=-9_000)  # before the window
    still_due = arrival("still-due", submitted=-500, deadline=2_000)  # repeat due after the ask
    inside = arrival("inside", submitted=-9_000, deadline=-100)
    got = rivals([older, inside, still_due], deadline=T0 + 10_000, now=T0)
    assert [c.name for c in got] == ["inside" + SUFFIX]
    assert rivals([older, inside, still_due], deadline=T0, now=T0) == []  # no time left


def kept(arrivals: list[Arrival], now: float, *earlier: Arrival) -> tuple[Arrival, ...]:
    """What :func:`remember` keeps of ``arrivals`` reported at ``now`` after ``earlier``."""
    return remember(Memory.of(earlier), arrivals, now).arrivals


def test_remember_drops_what_no_window_can_reach_and_orders_by_submission() -> None:
    short = arrival("short", submitted=-5_000, deadline=-4_000)  # a 1,000 s window
    long = arrival("long", submitted=-3_000, deadline=1_000)  # the longest: 4,000 s
    ancient = arrival("ancient", submitted=-9_000, deadline=-8_500)
    assert kept([long, short, ancient], T0) == (long,)  # 4,000 s back from now
    assert kept([long, short], T0 - 1_000) == (short, long)  # both within 4,000 s then
    assert kept([long], T0 - 1_000, short) == (short, long)
    assert kept([short], T0 - 1_000, long) == (short, long)  # merged in order
    assert kept([], T0) == ()


def test_the_longest_window_left_decides_what_goes_next() -> None:
    """Once the longest window's job has gone, the next longest decides, arrival after arrival."""
    long = arrival("long", submitted=-10_000, deadline=0)  # 10,000 s
    mid = arrival("mid", submitted=-8_000, deadline=1_000)  # 9,000 s
    short = arrival("short", submitted=-7_000, deadline=-6_000)  # 1,000 s
    memory = remember(Memory(), [long, mid, short], T0 - 7_000)
    assert memory.arrivals == (long, mid, short)
    assert remember(memory, [], T0 + 5_000) is memory  # only an arrival prunes
    tick = arrival("tick", submitted=0, deadline=100)
    memory = remember(memory, [tick], T0 + 1)  # 10,000 s back: long's own start is past
    assert memory.arrivals == (mid, short, tick)
    late = arrival("late", submitted=500, deadline=600)
    memory = remember(memory, [late], T0 + 1_001)  # now mid's 9,000 s count: mid goes
    assert memory == Memory.of([short, tick, late])
    last = arrival("last", submitted=1_300, deadline=1_350)
    memory = remember(memory, [last], T0 + 1_301)  # short's 1,000 s: only late and last stay
    assert memory.arrivals == (late, last)


def test_a_job_reported_again_is_remembered_once() -> None:
    """A shell that forgot a job and saw it come back reports it again: it is still one."""
    first = arrival("nightly", submitted=-500, deadline=500)
    other = arrival("other", submitted=-50, deadline=950)
    assert kept([first, other], T0, first) == (first, other)
    assert kept([first], T0, first, other) == (first, other)
    assert kept([other, other], T0) == (other,)
    # the same name submitted again is the next run of that job: a new arrival
    tomorrow = arrival("nightly", submitted=-100, deadline=900)
    assert kept([tomorrow], T0, first) == (first, tomorrow)


def test_an_arrival_survives_json_with_an_unplannable_size() -> None:
    a = arrival("nightly", submitted=-10, deadline=100)
    slow = Arrival(a.submitted_at, replace(a.candidate, step_time=(1.0, 0.5, math.inf)))
    for x in (a, slow):
        assert arrival_from_dict(arrival_to_dict(x)) == x
    data = arrival_to_dict(a)
    del data["deadline"]
    with pytest.raises(SpecError, match=r"arrival\.deadline"):
        arrival_from_dict(data)


def spec(name: str, steps: int, deadline_s: float, *, best_effort: bool = False) -> JobSpec:
    return load_job(
        {
            "name": name,
            "total_steps": steps,
            "deadline": f"PT{deadline_s:.0f}S",
            "best_effort": best_effort,
            "resources": {"unit": "cpu", "min": 1, "max": 4, "levels": list(LEVELS)},
        },
        now=datetime.fromtimestamp(T0, UTC),
    )


def job(s: JobSpec) -> JobInput:
    curve = TableCurve(RATES)
    return JobInput(s, 0.0, 0, Belief(curve, curve, LEVELS, 4, ()), JobState())


def decide(arrivals: tuple[Arrival, ...]) -> tuple[str, ...]:
    """The long job alone on the 4-unit cluster: is it guaranteed?"""
    long = job(spec("long", 20_000, 10_000))  # 5,000 s on the whole cluster
    out = allocate(ClusterInput(now=T0, capacity=4, slot_s=60.0, jobs=(long,), arrivals=arrivals))
    return out.admitted


def test_a_promise_leaves_room_for_the_burst_the_forecast_sees_coming() -> None:
    """A burst like the last one needs the whole cluster for 7,000 s of the next 9,000."""
    assert decide(()) == ("long",)
    assert decide((arrival("burst", submitted=-8_000, deadline=-1_000),)) == ()
    # a small one leaves room: the long job is guaranteed next to it
    assert decide((arrival("small", submitted=-8_000, deadline=-1_000, steps=4_000),)) == ("long",)


def test_the_allocator_reports_each_deadline_job_once_at_its_first_ask() -> None:
    first = job(spec("first", 4_000, 10_000))
    lazy = job(spec("lazy", 4_000, 10_000, best_effort=True))
    c = ClusterInput(now=T0, capacity=4, slot_s=60.0, jobs=(first, lazy))
    out = allocate(c)
    (seen,) = out.arrived
    assert seen.candidate.name == "first" and seen.submitted_at == first.spec.submitted_at
    assert seen.candidate.remaining_steps == 4_000 and not seen.candidate.guaranteed
    again = tuple(
        JobInput(j.spec, 0.0, 0, j.belief, out.jobs[j.spec.name].state) for j in (first, lazy)
    )
    later = allocate(ClusterInput(now=T0 + 60, capacity=4, slot_s=60.0, jobs=again))
    assert later.arrived == ()
