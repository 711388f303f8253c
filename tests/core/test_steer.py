"""Steering: from the allocator's target to the one action a job's own step takes now."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.core import priority
from qosflow.core.allocator import JobAllocation, JobState
from qosflow.core.decide import Action, Decision, JobSnapshot
from qosflow.core.predict import oracle_belief
from qosflow.core.spec import load_job
from qosflow.core.speed import TableCurve
from qosflow.core.steer import steer

T0 = datetime(2026, 11, 29, 18, 0, tzinfo=UTC).timestamp()
LEVELS = (1, 2, 4, 8)
BELIEF = oracle_belief(TableCurve({n: float(n) for n in LEVELS}), LEVELS)
SPEC = load_job(
    {
        "name": "job",
        "total_steps": 10_000,
        "deadline": "PT2H",
        "resources": {"unit": "cpu", "min": 1, "max": 8, "levels": list(LEVELS), "per_node": 8},
    },
    now=datetime.fromtimestamp(T0, UTC),
)
CLASSES = [k.name for k in priority.LADDER]


def snap(units: int, *, queued: bool = False) -> JobSnapshot:
    return JobSnapshot(SPEC, T0 + 600, 1000, units, queued, None, 30.0)


def target(units: int, klass: str = "qosflow-normal") -> JobAllocation:
    return JobAllocation(units, klass, True, f"guaranteed; {units} units ({klass})", JobState())


def run(
    holds: int,
    to: int,
    *,
    klass: str = "qosflow-normal",
    current: str = "qosflow-normal",
    free: int = 0,
    below: int = 0,
    queued: bool = False,
    paused: bool = False,
) -> Decision:
    return steer(
        snap(holds, queued=queued),
        BELIEF,
        target(to, klass),
        free_units=free,
        held_below=below,
        current_class=current,
        paused=paused,
    )


def test_a_target_below_what_the_job_holds_gives_the_difference_back() -> None:
    d = run(8, 2)
    assert (d.action, d.units) == (Action.SCALE_DOWN, 2)
    assert "give back 6" in d.reason and "allocator: guaranteed; 2 units" in d.reason
    assert d.priority_class == "qosflow-normal"
    assert d.deadline == SPEC.deadline


def test_a_target_of_zero_pauses_a_running_job() -> None:
    d = run(4, 0, free=8)
    assert (d.action, d.units) == (Action.SCALE_DOWN, 0)
    assert d.reason.startswith("pause (checkpoint and stop)")


def test_a_job_grows_only_into_units_that_are_free_now() -> None:
    up = run(2, 8, free=6)
    assert (up.action, up.units) == (Action.SCALE_UP, 8)
    assert "take 6 free units" in up.reason
    wait = run(2, 8, free=5)
    assert (wait.action, wait.units) == (Action.ON_TRACK, 2)  # no round spent: it waits
    assert wait.reason.startswith("wait: 6 more units needed, 5 free")


def test_a_paused_job_resumes_at_its_target_once_the_units_are_free() -> None:
    d = run(0, 4, free=4, queued=True, paused=True)
    assert (d.action, d.units) == (Action.SCALE_UP, 4)
    assert d.reason.startswith("resume")
    early = run(0, 4, free=3, queued=True, paused=True)
    assert (early.action, early.units) == (Action.ON_TRACK, 0)
    still = run(0, 0, free=8, queued=True, paused=True)
    assert (still.action, still.units) == (Action.ON_TRACK, 0)  # its allocation is still 0


def test_a_start_or_a_resume_is_predicted_as_the_plan_charges_it() -> None:
    # the plan charges a start, a resume and a resize one restart each (restart_charge); the
    # finish step learns the factor from these predictions, so they must charge what it did
    after = T0 + 600 + (SPEC.total_steps - 1000) * BELIEF.median.step_time(4)
    for d in (run(0, 4, free=4, queued=True, paused=True), run(0, 4, free=4, queued=True)):
        assert d.median_finish == after + 30.0
    assert run(2, 4, free=4).median_finish == after + 30.0
    assert run(4, 4).median_finish == after


def test_a_queued_job_is_bumped_only_when_its_class_rises() -> None:
    up = run(1, 2, klass="qosflow-high", current="qosflow-low", queued=True, free=8)
    assert (up.action, up.units) == (Action.BUMP, 2)
    assert up.priority_class == "qosflow-high" and "raise to qosflow-high" in up.reason
    same = run(1, 2, klass="qosflow-high", current="qosflow-high", queued=True, free=8)
    assert same.action is Action.ON_TRACK
    lower = run(1, 2, klass="qosflow-low", current="qosflow-high", queued=True, free=8)
    assert lower.action is Action.ON_TRACK
    waiting = run(1, 0, klass="qosflow-high", current="qosflow-low", queued=True)
    assert (waiting.action, waiting.units) == (Action.BUMP, 1)  # keeps what it asked for


def test_a_running_job_is_restarted_into_urgent_only_when_lower_classes_hold_its_units() -> None:
    urgent, high = "qosflow-urgent", "qosflow-high"
    d = run(2, 8, free=2, below=4, klass=urgent, current=high)
    assert (d.action, d.units) == (Action.BUMP, 8)
    assert "restart into qosflow-urgent to preempt" in d.reason
    assert d.priority_class == "qosflow-urgent"
    short = run(2, 8, free=2, below=3, klass=urgent, current=high)  # could free 5 of the 6
    assert (short.action, short.units) == (Action.ON_TRACK, 2)
    already = run(2, 8, free=2, below=4, klass=urgent, current=urgent)
    assert already.action is Action.ON_TRACK  # nothing to gain from a restart
    calm = run(2, 8, free=2, below=6, klass="qosflow-high", current="qosflow-low")
    assert calm.action is Action.ON_TRACK  # only qosflow-urgent preempts


def test_on_an_empty_cluster_a_running_job_is_never_restarted_for_its_class() -> None:
    grow = run(2, 8, free=8, klass="qosflow-urgent", current="qosflow-low")
    assert grow.action is Action.SCALE_UP  # the units are free: just take them
    keep = run(4, 4, free=4, klass="qosflow-urgent", current="qosflow-low")
    assert (keep.action, keep.units) == (Action.ON_TRACK, 4)
    assert keep.reason.startswith("keep")


def test_a_paused_job_whose_class_rose_is_not_bumped_while_its_target_is_zero() -> None:
    d = run(0, 0, klass="qosflow-high", current="qosflow-low", queued=True, paused=True, free=8)
    assert d.action is Action.ON_TRACK


@settings(max_examples=200)
@given(
    holds=st.sampled_from([0, *LEVELS]),
    to=st.sampled_from([0, *LEVELS]),
    klass=st.sampled_from(CLASSES),
    current=st.sampled_from(CLASSES),
    free=st.integers(0, 10),
    below=st.integers(0, 10),
    queued=st.booleans(),
    paused=st.booleans(),
)
def test_every_action_changes_something_and_never_takes_units_that_are_not_there(
    holds: int,
    to: int,
    klass: str,
    current: str,
    free: int,
    below: int,
    queued: bool,
    paused: bool,
) -> None:
    holds = 0 if paused else holds  # a paused job holds nothing (its segment was stopped)
    queued = queued or paused or holds == 0  # a job holding nothing is waiting or paused
    d = run(
        holds,
        to,
        klass=klass,
        current=current,
        free=free,
        below=below,
        queued=queued,
        paused=paused,
    )
    have = 0 if queued else holds
    rank = {k.name: k.value for k in priority.LADDER}
    rises = rank[klass] > rank[current]
    assert d.priority_class == klass
    assert d.reason.endswith(f"allocator: guaranteed; {to} units ({klass})")
    if d.action is Action.SCALE_DOWN:
        assert have > 0 and d.units == to < have
    elif d.action is Action.SCALE_UP:
        assert d.units == to > have and to - have <= free and (have > 0 or paused)
    elif d.action is Action.BUMP:
        assert rises
        if have:  # a running job: a restart only to preempt lower classes for units not free
            assert klass == "qosflow-urgent" and free < to - have <= free + below
            assert d.units == to
    else:
        assert d.action is Action.ON_TRACK
        assert d.units == holds  # what it holds, or (queued) what it asked for
    if paused and to == 0:
        assert d.action is Action.ON_TRACK  # nothing to resume into, no workflow to patch
    if have and to > have and to - have > free + below:
        assert d.action is Action.ON_TRACK  # waits for others to give units back
