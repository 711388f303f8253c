"""Planning a new run of a known job key on what earlier runs of that key measured."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from qosflow.core.fit import Measured, fit, measured
from qosflow.core.planning import belief_for, plan_job
from qosflow.core.prior import timed
from qosflow.core.spec import load_job
from qosflow.core.speed import SpeedModel

TRUE = SpeedModel(0.05, 1.0, 0.05, 0.002, 0.1, node_size=8)


def test_a_new_run_is_planned_on_what_earlier_runs_of_its_key_measured(
    spec_of, stream_of, t0
) -> None:
    # last night's run of the same key ran at 4 and 8 units
    history = stream_of(TRUE, [(4, 400), (8, 400)], np.random.default_rng(3), start=t0 - 86_400)
    prior = fit(history, node_size=8).model
    spec = spec_of(total_steps=12_000, deadline_s=4000.0)  # ~2,800 s at 8 units

    measured = plan_job(spec, capacity=16, now=t0, prior=prior, history=history)
    shape_only = plan_job(spec, capacity=16, now=t0, prior=prior)

    # what was measured is trusted (its spread, its sizes); the prior's shape alone is not
    assert measured.verdict.kind == "guaranteed"
    assert measured.verdict.units == 8
    assert shape_only.verdict.kind != "guaranteed"


def test_own_progress_wins_over_history(spec_of, stream_of, t0) -> None:
    slow = SpeedModel(0.1, 2.0, 0.1, 0.004, 0.2, node_size=8)  # tonight the job is twice as slow
    history = stream_of(TRUE, [(8, 400)], np.random.default_rng(3), start=t0 - 86_400)
    tonight = stream_of(slow, [(8, 400)], np.random.default_rng(4), start=t0 - 200.0)
    spec = spec_of(total_steps=12_000, deadline_s=4000.0)

    plan = plan_job(spec, capacity=16, now=t0, samples=tonight, history=history)

    assert plan.prediction.median_finish - t0 > 1.5 * 12_000 * TRUE.step_time(8)


def test_once_a_run_measured_the_sizes_of_its_history_still_count(spec_of, stream_of, t0) -> None:
    # earlier runs measured 2, 4 and 8 units; tonight's run has measured only 2 so far
    sizes = [(2, 400), (4, 400), (8, 400)]
    history = stream_of(TRUE, sizes, np.random.default_rng(3), start=t0 - 86_400)
    tonight = stream_of(TRUE, [(2, 400)], np.random.default_rng(4), start=t0 - 200.0)
    prior = fit(history, node_size=8).model
    spec = spec_of(total_steps=12_000, deadline_s=4000.0)

    plan = plan_job(spec, capacity=16, now=t0, samples=tonight, prior=prior, history=history)
    alone = plan_job(spec, capacity=16, now=t0, samples=tonight, prior=prior)

    assert plan.candidate is not None and alone.candidate is not None
    assert max(plan.candidate.levels) == 8  # the probe rule counts 4 and 8 as measured
    assert max(alone.candidate.levels) == 4  # one level beyond 2
    assert [m.units for m in measured(history)] == [2, 4, 8]
    assert measured(history[:3]) == ()  # warm-up only: nothing steady


def _estimated(at: int | None, step_s: float) -> dict[str, object]:
    """A key's first job on 4-unit nodes that needs 8 units, with the user's estimate."""
    return {
        "name": "bert",
        "total_steps": 1000,
        "deadline": "PT9000S",
        "resources": {
            "unit": "gpu",
            "min": 1,
            "max": 16,
            "levels": [1, 2, 4, 8, 16],
            "per_node": 4,
        },
        "step_seconds_estimate": step_s,
        **({} if at is None else {"step_seconds_estimate_at": at}),
    }


def test_an_estimate_timed_above_one_node_is_what_the_plan_counts_on_there() -> None:
    # the job runs 5.2 s a step at 8 units (two nodes) and 8.6 s at 4: its 1,000 steps need 8
    # (8,600 s at 4 leaves no margin before the 9,000 s deadline). Timed once at 8, or at 4:
    now = datetime(2026, 12, 3, tzinfo=UTC)
    at_8 = load_job(_estimated(8, 5.2), now=now)
    at_4 = load_job(_estimated(4, 8.6), now=now)

    timed = belief_for(at_8)
    shape = belief_for(at_4)

    assert timed.observed == (8,) and shape.observed == ()  # one window measured at 8, by the user
    assert 5.2 < timed.conservative.step_time(8) < 8.6  # the bound is wide, but counts there
    assert timed.best_plannable(0) >= 8
    # past the measured size the plan still counts on nothing better than it
    assert timed.conservative.step_time(16) >= timed.conservative.step_time(8)
    # an estimate within the node only anchors the shape: above the node nothing is counted on
    assert shape.conservative.step_time(8) >= min(
        shape.conservative.step_time(n) for n in (1, 2, 4)
    )
    assert plan_job(at_8, capacity=16, now=now.timestamp()).verdict.kind == "guaranteed"
    assert plan_job(at_4, capacity=16, now=now.timestamp()).verdict.kind != "guaranteed"


def test_a_timing_of_the_key_above_one_node_counts_for_its_later_jobs_until_a_run_measures() -> (
    None
):
    # the key's first job was timed at 8 (5.2 s a step); tonight's job was timed at 4 only
    now = datetime(2026, 12, 3, tzinfo=UTC)
    at_4 = load_job(_estimated(4, 8.6), now=now)
    timing = Measured(8, 5.2, 1)

    belief = belief_for(at_4, timings=[timing])
    assert belief.observed == (8,)
    assert plan_job(at_4, capacity=16, now=now.timestamp(), timings=[timing]).verdict.kind == (
        "guaranteed"
    )

    # a run of the key measured 8 slower than the timing: its windows rule, the timing drops out
    slow = [Measured(8, 9.5, 30)]
    ruled = belief_for(at_4, known=slow, timings=[timing])
    assert ruled.observed == (8,)
    assert ruled.median.step_time(8) == 9.5
    assert timed([timing, Measured(8, 4.0, 1), Measured(16, 3.0, 1)], slow) == (
        Measured(16, 3.0, 1),
    )
    assert timed([Measured(8, 4.0, 1), timing]) == (Measured(8, 4.0, 1),)  # newest first wins
