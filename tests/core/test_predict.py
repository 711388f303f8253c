"""Prediction: conformal calibration, beliefs, median/conservative finish, the deadline schedule."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from qosflow.core.fit import FitResult, fit
from qosflow.core.predict import (
    DEFAULT_FACTOR,
    Belief,
    Calibration,
    belief_from_fit,
    calibrate,
    oracle_belief,
    predict,
    restart_charge,
    schedule,
)
from qosflow.core.speed import SpeedModel, TableCurve

LEVELS = (1, 2, 4, 8, 16)
TRUE = SpeedModel(0.05, 1.0, 0.05, 0.002, 0.1, node_size=8)


def test_default_calibration_before_any_data() -> None:
    assert calibrate([]) == Calibration(DEFAULT_FACTOR, 0)
    assert calibrate([(0.0, 5.0), (math.inf, 1.0)]) == Calibration(DEFAULT_FACTOR, 0)


def test_conformal_factor_is_the_rank_ceil_coverage_m_plus_1() -> None:
    ratios = [1.0 + i / 100 for i in range(19)]  # m = 19 -> rank ceil(0.9 * 20) = 18
    cal = calibrate([(100.0, 100.0 * r) for r in ratios])
    assert cal.n == 19 and math.isclose(cal.factor, ratios[17])
    few = calibrate([(100.0, 130.0), (100.0, 90.0)])  # rank 3 > m = 2
    assert few.factor == max(DEFAULT_FACTOR, 1.3)
    assert calibrate([(100.0, 50.0)] * 30).factor == 1.0  # never below the median


def test_conformal_factor_from_an_array_is_the_factor_from_its_pairs() -> None:
    rng = np.random.default_rng(11)
    pairs = [(float(p), float(r)) for p, r in rng.uniform(-5.0, 100.0, (300, 2))]
    pairs += [(math.inf, 3.0), (math.nan, 1.0), (4.0, math.nan), (2.0, -1.0)]
    assert calibrate(np.array(pairs)) == calibrate(pairs)
    assert calibrate(np.empty((0, 2))) == calibrate([])


def test_conformal_factor_covers_held_out_ratios() -> None:
    rng = np.random.default_rng(3)
    realised = rng.lognormal(0.02, 0.08, 4000)
    cal = calibrate([(1000.0, 1000.0 * r) for r in realised[:2000]], coverage=0.9)
    covered = float(np.mean(realised[2000:] <= cal.factor))
    assert 0.87 <= covered <= 0.93


def _fit(stream_of, plan) -> FitResult:
    return fit(stream_of(TRUE, plan, np.random.default_rng(5)), node_size=8)


def test_belief_from_fit_is_conservative_and_widest_where_unobserved(stream_of) -> None:
    result = _fit(stream_of, [(1, 300), (2, 300), (4, 300)])
    belief = belief_from_fit(result, LEVELS, Calibration())
    assert belief.levels == LEVELS and belief.observed == (1, 2, 4)
    assert belief.probe_limit == 8
    ratio = {n: belief.conservative.step_time(n) / belief.median.step_time(n) for n in LEVELS}
    assert all(r >= DEFAULT_FACTOR - 1e-9 for r in ratio.values())
    assert ratio[16] > ratio[2]
    assert belief.knee == 8


def test_failed_fit_gives_an_infinite_belief() -> None:
    belief = belief_from_fit(fit([], node_size=8), LEVELS, Calibration())
    pred = predict(belief, now=0.0, steps_done=0, total_steps=10, units=4, current_units=4)
    assert math.isinf(pred.median_finish) and math.isinf(pred.conservative_finish)


def test_predict_counts_overhead_only_when_the_size_changes() -> None:
    belief = oracle_belief(TRUE, LEVELS)
    same = predict(
        belief, now=0.0, steps_done=100, total_steps=1100, units=4, current_units=4, overhead_s=60
    )
    other = predict(
        belief, now=0.0, steps_done=100, total_steps=1100, units=8, current_units=4, overhead_s=60
    )
    assert math.isclose(same.median_finish, 1000 * TRUE.step_time(4))
    assert math.isclose(other.median_finish, 60 + 1000 * TRUE.step_time(8))
    assert same.remaining_steps == 1000
    done = predict(
        belief, now=5.0, steps_done=1100, total_steps=1100, units=8, current_units=4, overhead_s=60
    )
    assert done.median_finish == done.conservative_finish == 5.0


def test_a_start_pays_the_restart_like_a_resize() -> None:
    belief = oracle_belief(TRUE, LEVELS)
    start = predict(
        belief, now=0.0, steps_done=100, total_steps=1100, units=8, current_units=0, overhead_s=60
    )
    assert math.isclose(start.median_finish, 60 + 1000 * TRUE.step_time(8))
    assert [restart_charge(60.0, held, 4) for held in (0, 4, 2, 8)] == [60.0, 0.0, 60.0, 60.0]


monotone = st.builds(
    lambda t0, t1: SpeedModel(t0, t1, 0.0, 0.0, 0.0, node_size=8),
    st.floats(0.0, 1.0),
    st.floats(0.0, 10.0),
)


def _monotone_fit(model: SpeedModel, boot_scale: list[float]) -> FitResult:
    boot = tuple(
        SpeedModel(model.t0 * a, model.t1 * b, 0, 0, 0, 8)
        for a, b in zip(boot_scale, boot_scale[::-1], strict=True)
    )
    return FitResult(True, model, 0.0, 10, (1,), "constructed", boot)


@example(  # a step time that underflowed to 0 once read as "no speed" (infinite step time)
    model=SpeedModel(0.0, 5e-324, 0.0, 0.0, 0.0, node_size=8),
    scales=[1.0, 2.0],
    done=0,
    total=1,
    factor=1.0,
)
@example(  # a subnormal step time once overflowed 1/c to an infinite throughput ("not allowed")
    model=SpeedModel(0.0, 2.2250738585072014e-308, 0.0, 0.0, 0.0, node_size=8),
    scales=[1.0, 1.0],
    done=0,
    total=1,
    factor=1.0,
)
@settings(max_examples=200)
@given(
    model=monotone,
    scales=st.lists(st.floats(0.5, 2.0), min_size=2, max_size=20),
    done=st.integers(0, 10_000),
    total=st.integers(1, 10_000),
    factor=st.floats(1.0, 2.0),
)
def test_with_a_monotone_model_more_units_never_predict_a_later_finish(
    model: SpeedModel, scales: list[float], done: int, total: int, factor: float
) -> None:
    beliefs = [
        oracle_belief(model, LEVELS),
        belief_from_fit(_monotone_fit(model, scales), LEVELS, Calibration(factor, 5)),
    ]
    for belief in beliefs:
        preds = [
            predict(
                belief,
                now=1e9,
                steps_done=done,
                total_steps=total,
                units=n,
                current_units=1,
                overhead_s=30.0,
            )
            for n in LEVELS[1:]
        ]
        for a, b in itertools.pairwise(preds):
            assert b.median_finish <= a.median_finish * (1 + 1e-12)
            assert b.conservative_finish <= a.conservative_finish * (1 + 1e-12)
        for p in preds:
            assert p.conservative_finish >= p.median_finish


def test_schedule_ends_at_deadline_minus_margin_with_all_steps() -> None:
    belief = oracle_belief(TableCurve({4: 2.0}), [4])  # 0.5 s per step
    plan = schedule(
        belief,
        start=0.0,
        steps_done=0,
        total_steps=1000,
        units=4,
        deadline=1000.0,
        margin=100.0,
        points=10,
    )
    assert plan[-1] == (900.0, 1000)
    assert plan[0] == (0.0, 0)  # 900 s of slack at 0.5 s/step covers 1800 > 1000 steps
    steps = [s for _, s in plan]
    assert steps == sorted(steps) and len(plan) == 10
    # at 600 s the job must have done 1000 - 300 / 0.5 = 400 steps
    assert dict(plan)[600.0] == 400


@settings(max_examples=100)
@given(
    done=st.integers(0, 5000),
    total=st.integers(1, 5000),
    deadline=st.floats(10.0, 1e5),
    t=st.floats(0.0, 1e5),
)
def test_schedule_line_is_where_the_conservative_finish_meets_deadline_minus_margin(
    done: int, total: int, deadline: float, t: float
) -> None:
    belief: Belief = oracle_belief(TRUE, LEVELS)
    margin = 5.0
    plan = schedule(
        belief,
        start=0.0,
        steps_done=0,
        total_steps=total,
        units=4,
        deadline=deadline,
        margin=margin,
        points=20,
    )
    assert all(0 <= s <= total for _, s in plan)
    for when, need in plan:
        if 0 < need < total:
            pred = predict(
                belief, now=when, steps_done=need, total_steps=total, units=4, current_units=4
            )
            assert pred.conservative_finish <= deadline - margin + 1e-6
            behind = predict(
                belief, now=when, steps_done=need - 1, total_steps=total, units=4, current_units=4
            )
            assert behind.conservative_finish > deadline - margin - 1e-6


def test_schedule_with_no_usable_speed_requires_everything() -> None:
    belief = oracle_belief(TableCurve({2: 0.0}), [2])
    plan = schedule(
        belief,
        start=0.0,
        steps_done=0,
        total_steps=50,
        units=2,
        deadline=100.0,
        margin=10.0,
        points=3,
    )
    assert [s for _, s in plan] == [50, 50, 50]


def test_below_the_observed_sizes_the_conservative_curve_is_at_least_linear(stream_of) -> None:
    # the pessimistic default prior would say 1 unit is only ~1.5x slower than 2
    scales_well = SpeedModel(0.0, 1.0, 0.0, 0.0, 0.0, node_size=8)
    result = fit(stream_of(scales_well, [(4, 300)], np.random.default_rng(2)), node_size=8)
    belief = belief_from_fit(result, LEVELS, Calibration())
    for n in (1, 2):
        assert belief.conservative.step_time(n) >= scales_well.step_time(n)
        assert belief.conservative.step_time(n) >= belief.median.step_time(4) * 4 / n


def test_sizes_the_prior_was_fitted_on_count_as_observed(stream_of) -> None:
    """A key's history measured 2..16; this run measured 4 so far: plan up to 32, not 8."""
    truth = SpeedModel(0.01, 1.0, 0.02, 0.0, 0.0, node_size=8)
    history = stream_of(truth, [(2, 300), (8, 300), (16, 300)], np.random.default_rng(3))
    prior = fit(history, node_size=8)
    own = fit(
        stream_of(truth, [(4, 300)], np.random.default_rng(4)), node_size=8, prior=prior.model
    )
    levels = (*LEVELS, 32)
    alone = belief_from_fit(own, levels, Calibration())
    known = belief_from_fit(own, levels, Calibration(), known=prior.measured)
    assert alone.observed == (4,) and alone.probe_limit == 8
    assert known.observed == (2, 4, 8, 16) and known.probe_limit == 32
    # below the smallest size anyone measured (2), the slow-down rule starts from 2, not 4
    assert known.conservative.step_time(2) < alone.conservative.step_time(2)
    assert known.conservative.step_time(1) >= known.median.step_time(2) * 2


def test_where_a_size_was_measured_the_belief_is_the_measurement(stream_of) -> None:
    """The model misses a wobbly real curve by up to ~20 %; at measured sizes plan on the data."""
    wobbly = TableCurve({1: 1.0, 2: 1 / 0.55, 4: 1 / 0.26, 8: 1 / 0.2, 16: 1 / 0.09})
    samples = stream_of(wobbly, [(2, 300), (8, 300)], np.random.default_rng(5), sigma=0.03)
    result = fit(samples, node_size=8)
    belief = belief_from_fit(result, LEVELS, Calibration(1.1, 50))
    for m in result.measured:
        assert belief.median.step_time(m.units) == m.step_time
        # conservative: the measurement's upper 90 % bound (1.2816 standard errors), x the factor
        upper = m.step_time * math.exp(1.2816 * m.error) * 1.1
        assert belief.conservative.step_time(m.units) == pytest.approx(upper, rel=1e-4)
        assert abs(m.step_time / wobbly.step_time(m.units) - 1) < 0.02
    assert belief.median.step_time(4) == result.model.step_time(4)  # unmeasured: the model
    # the knee follows the measurements: 8 units really are faster than 2
    assert belief.knee >= 8


def test_past_one_node_only_measured_scaling_is_counted_on(stream_of) -> None:
    """Measured at 4 units on 4-unit nodes: past the node the truth halves, the prior cannot know.

    Promise no more past the node than the best size within it. Once a run measured past the
    node, the measurement is the belief there, and the next size up, still unmeasured, is
    promised no more than the best measured one.
    """
    halves = TableCurve({1: 0.35, 2: 0.7, 4: 1.32, 8: 0.61, 16: 1.1})
    within = fit(stream_of(halves, [(4, 100)], np.random.default_rng(1)), node_size=4)
    belief = belief_from_fit(within, LEVELS, Calibration())
    best_within = min(belief.conservative.step_time(n) for n in (1, 2, 4))
    assert all(belief.conservative.step_time(n) >= best_within for n in (8, 16))
    pred = {
        n: predict(belief, now=0.0, steps_done=0, total_steps=1000, units=n, current_units=4)
        for n in (4, 8, 16)
    }
    assert pred[8].conservative_finish >= pred[4].conservative_finish
    assert pred[16].conservative_finish >= pred[4].conservative_finish
    doubles = TableCurve({1: 0.35, 2: 0.7, 4: 1.32, 8: 2.6, 16: 5.0})
    plan = [(4, 100), (8, 200)]
    crossed = fit(stream_of(doubles, plan, np.random.default_rng(1)), node_size=4)
    measured = belief_from_fit(crossed, LEVELS, Calibration())
    assert measured.observed == (4, 8) and measured.probe_limit == 16
    fastest_within = min(measured.conservative.step_time(n) for n in (1, 2, 4))
    assert measured.conservative.step_time(8) < 0.6 * fastest_within
    assert measured.conservative.step_time(16) >= measured.conservative.step_time(8)
    assert measured.median.step_time(16) < measured.median.step_time(8)  # may still scale out
