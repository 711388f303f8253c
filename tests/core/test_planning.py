"""Planning a new run of a known job key on what earlier runs of that key measured."""

from __future__ import annotations

import numpy as np

from qosflow.core.fit import fit, measured
from qosflow.core.planning import plan_job
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
