"""Speed model: parameter recovery, warm-up and restarts, priors, knee, probe rule, failure as a value."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.core.fit import FitResult, Measured, anchored, fit
from qosflow.core.speed import (
    UNKNOWN,
    ProgressSample,
    SpeedModel,
    TableCurve,
    knee,
    pessimistic_prior,
)
from qosflow.core.windows import windows

TRUE = SpeedModel(t0=0.05, t1=1.0, t2=0.05, t3=0.002, t4=0.1, node_size=8)
ALL_LEVELS = (1, 2, 4, 8, 16)


def _rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@pytest.mark.parametrize("seed", range(5))
def test_recovers_step_time_within_5pct_at_observed_sizes(stream_of, seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = stream_of(TRUE, [(n, 400) for n in ALL_LEVELS], rng, sigma=0.05, every=10)
    result = fit(samples, node_size=8, rng=np.random.default_rng(seed))
    assert result.success, result.message
    assert result.observed_units == ALL_LEVELS
    for n in ALL_LEVELS:
        assert _rel(result.model.step_time(n), TRUE.step_time(n)) <= 0.05, n
    assert result.residual < 0.05


@settings(max_examples=40)
@given(
    t0=st.floats(0.0, 0.5),
    t1=st.floats(0.1, 5.0),
    t2=st.floats(0.0, 0.3),
    t3=st.floats(0.0, 0.01),
    t4=st.floats(0.0, 0.3),
    sizes=st.sets(st.sampled_from(ALL_LEVELS), min_size=1, max_size=5),
    every=st.sampled_from([1, 5, 20]),
    seed=st.integers(0, 2**32 - 1),
)
def test_recovery_holds_for_any_parameters_and_observed_sizes(
    stream_of, t0: float, t1: float, t2: float, t3: float, t4: float, sizes, every, seed
) -> None:
    true = SpeedModel(t0, t1, t2, t3, t4, node_size=8)
    rng = np.random.default_rng(seed)
    samples = stream_of(true, [(n, 300) for n in sorted(sizes)], rng, sigma=0.05, every=every)
    result = fit(samples, node_size=8, rng=rng)
    assert result.success
    for n in sizes:
        assert _rel(result.model.step_time(n), true.step_time(n)) <= 0.05, (n, result.message)


def test_warmup_after_every_restart_is_dropped(stream_of, rng) -> None:
    slow_start = stream_of(TRUE, [(2, 300), (4, 300)], rng, sigma=0.0, every=5, warmup_factor=8.0)
    result = fit(slow_start, node_size=8)
    for n in (2, 4):
        assert _rel(result.model.step_time(n), TRUE.step_time(n)) < 0.01


def test_step_counter_reset_starts_a_new_run(t0) -> None:
    # resumed from a checkpoint at step 100 after reaching 150: the reset is not a negative interval
    samples = [ProgressSample(t0 + i, 10 * i, 2) for i in range(16)]
    samples += [ProgressSample(t0 + 100 + i, 100 + 10 * i, 2) for i in range(16)]
    ws = windows(samples, warmup_steps=20, warmup_s=1e9)
    assert ws and all(math.isclose(w.step_time, 0.1) for w in ws)


def test_stalls_fold_into_the_next_interval(t0) -> None:
    samples = [ProgressSample(t0 + i, 10 * (i // 2), 1) for i in range(40)]
    ws = windows(samples, warmup_steps=0, warmup_s=0)
    assert ws and all(math.isclose(w.step_time, 0.2) for w in ws)


def test_a_run_shorter_than_a_window_measures_once_it_spans_five_seconds(t0) -> None:
    second_long = [ProgressSample(t0 + i, 10 * i, 2) for i in range(6)]
    assert windows(second_long[:5], warmup_steps=0, warmup_s=0) == []  # 4 intervals, 4 s
    assert len(windows(second_long, warmup_steps=0, warmup_s=0)) == 1  # a full window
    # a slow reporting cadence (the simulator's one sample a slot, Argo's progress patches): one
    # long interval is a window at once
    one_slot = [ProgressSample(t0, 0, 2), ProgressSample(t0 + 60.0, 600, 2)]
    assert [w.step_time for w in windows(one_slot, warmup_steps=0, warmup_s=0)] == [0.1]


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [ProgressSample(0.0, 0, 4)],
        [ProgressSample(0.0, 0, 4), ProgressSample(5.0, 3, 4)],  # warm-up only
        [ProgressSample(float(i), 0, 4) for i in range(10)],  # no progress
        [ProgressSample(float("nan"), i, 4) for i in range(30)],
        [ProgressSample(float(i), 100 * i, 0) for i in range(30)],  # zero units
    ],
    ids=["empty", "one", "warmup-only", "stalled", "nan-times", "zero-units"],
)
def test_a_fit_that_cannot_be_made_is_a_value(samples: list[ProgressSample]) -> None:
    result = fit(samples, node_size=8)
    assert isinstance(result, FitResult)
    assert not result.success
    assert result.model == UNKNOWN and math.isinf(result.model.step_time(4))
    assert result.message


def test_history_prior_without_data_is_the_prior() -> None:
    result = fit([], node_size=8, prior=TRUE)
    assert not result.success
    for n in ALL_LEVELS:
        assert _rel(result.model.step_time(n), TRUE.step_time(n)) < 1e-6
    assert result.bootstrap


def test_a_prior_that_predicts_no_time_at_one_unit_does_not_poison_the_fit(stream_of) -> None:
    # a key's history fitted on multi-node sizes only can come back with t0 = t1 = 0: 0 s per
    # step on one unit. That prior row once made every weight NaN, so the fit failed (with a
    # RuntimeWarning) even with good measurements
    import warnings

    degenerate = SpeedModel(0.0, 0.0, 0.0, 0.01, 0.0, node_size=8)
    truth = SpeedModel(0.02, 0.8, 0.0, 0.0, 0.0, node_size=8)
    data = stream_of(truth, [(8, 300)], np.random.default_rng(3), sigma=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = fit(data, node_size=8, prior=degenerate)
    assert result.success, result.message
    assert _rel(result.model.step_time(8), truth.step_time(8)) < 0.05


def test_a_prior_with_no_time_at_a_measured_size_still_shapes_the_others(stream_of) -> None:
    # the same kind of history, now with the job measured on one unit, where it predicts 0 s:
    # the prior is rescaled on the sizes where it predicts a time, so its node-crossing cost
    # still reaches the unmeasured multi-node sizes (dropping it predicted half the step time)
    import warnings

    multi_node_only = SpeedModel(0.0, 0.0, 0.5, 0.0, 0.3, node_size=8)
    truth = SpeedModel(0.02, 0.8, 0.05, 0.0, 0.3, node_size=8)
    data = stream_of(truth, [(1, 300), (4, 300)], np.random.default_rng(3), sigma=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = fit(data, node_size=8, prior=multi_node_only)
    assert result.success, result.message
    for n in (1, 4):
        assert _rel(result.model.step_time(n), truth.step_time(n)) < 0.05
    assert _rel(result.model.step_time(9), truth.step_time(9)) < 0.15


def test_prior_shapes_unobserved_sizes_and_fades_with_data(stream_of) -> None:
    scales_well = SpeedModel(0.01, 1.0, 0.0, 0.0, 0.0, node_size=8)
    little = stream_of(scales_well, [(1, 120)], np.random.default_rng(1), sigma=0.02)
    with_history = fit(little, node_size=8, prior=scales_well)
    with_default = fit(little, node_size=8)
    # history says 8 units is ~7.5x faster; the pessimistic default assumes much less
    assert _rel(with_history.model.step_time(8), scales_well.step_time(8)) < 0.05
    assert with_default.model.step_time(8) > 2 * scales_well.step_time(8)
    # with data at every size the same wrong prior no longer matters
    lots = stream_of(scales_well, [(n, 600) for n in ALL_LEVELS], np.random.default_rng(2))
    refit = fit(lots, node_size=8)
    for n in ALL_LEVELS:
        assert _rel(refit.model.step_time(n), scales_well.step_time(n)) < 0.05


def test_pessimistic_default_never_extrapolates_faster_than_linear(stream_of, rng) -> None:
    samples = stream_of(TRUE, [(1, 300)], rng)
    model = fit(samples, node_size=8).model
    for n in ALL_LEVELS:
        assert model.step_time(n) * n >= model.step_time(1) * 0.99
    prior = pessimistic_prior(8, step_time=2.0, units=4)
    assert math.isclose(prior.step_time(4), 2.0)


def test_bootstrap_is_seeded_and_wider_where_unobserved(stream_of, rng) -> None:
    samples = stream_of(TRUE, [(1, 300), (2, 300)], rng)
    a = fit(samples, node_size=8, rng=np.random.default_rng(7))
    b = fit(samples, node_size=8, rng=np.random.default_rng(7))
    assert a.bootstrap == b.bootstrap and len(a.bootstrap) >= 50

    def spread(n: int) -> float:
        taus = np.array([m.step_time(n) for m in a.bootstrap])
        return float(np.quantile(taus, 0.9) / np.median(taus))

    assert spread(16) > spread(2)


def test_table_curve_is_infinite_where_the_table_has_no_value() -> None:
    curve = TableCurve({1: 2.0, 2: 0.0})
    assert curve.step_time(1) == 0.5
    assert math.isinf(curve.step_time(2)) and math.isinf(curve.step_time(4))


def test_knee_is_the_smallest_level_with_peak_throughput() -> None:
    bert = TableCurve({1: 6.03, 2: 8.64, 4: 10.36, 8: 11.06, 16: 10.99, 32: 10.61, 64: 9.25})
    assert knee(bert, [1, 2, 4, 8, 16, 32, 64]) == 8
    flat = TableCurve({1: 5.0, 2: 5.0})
    assert knee(flat, [2, 1]) == 1
    assert knee(TRUE, ALL_LEVELS) == 8
    assert knee(UNKNOWN, ALL_LEVELS) == 1


def _probe_limit(levels: list[int], observed: list[int]) -> int:
    from qosflow.core.predict import Belief

    curve = TableCurve({n: 1.0 for n in levels})
    ordered = tuple(sorted(set(levels)))
    return Belief(curve, curve, ordered, ordered[-1], tuple(sorted(observed))).probe_limit


def test_probe_rule_examples() -> None:
    assert _probe_limit([1, 2, 4, 8, 16], [1, 2]) == 4
    assert _probe_limit([1, 2, 4, 8, 16], [3]) == 4
    assert _probe_limit([1, 2, 4, 8, 16], [16]) == 16
    assert _probe_limit([1, 2, 4], []) == 4


@given(
    levels=st.lists(st.integers(1, 64), min_size=1, max_size=10, unique=True),
    observed=st.lists(st.integers(1, 64), max_size=5),
)
def test_probe_rule_plans_at_most_one_level_beyond_observed(levels, observed) -> None:
    limit = _probe_limit(levels, observed)
    assert limit in levels
    out = [n for n in sorted(levels) if n <= limit]
    if observed:
        assert len([n for n in out if n > max(observed)]) <= 1
    else:
        assert limit == max(levels)


@settings(max_examples=150)
@given(
    st.lists(
        st.builds(
            ProgressSample,
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-5, 10**6),
            st.integers(-1, 64),
        ),
        max_size=40,
    )
)
def test_fit_never_raises_on_arbitrary_samples(samples: list[ProgressSample]) -> None:
    result = fit(samples, node_size=8)
    assert isinstance(result, FitResult)
    if result.success:
        assert all(n >= 1 for n in result.observed_units)
        assert all(v >= 0 for v in result.model.params)


# a real speed curve the five-parameter model cannot follow (8 units barely beat 4, 16 jumps)
WOBBLY = TableCurve({1: 1.0, 2: 1 / 0.55, 4: 1 / 0.26, 8: 1 / 0.2, 16: 1 / 0.09})


def test_the_fit_reports_the_median_measured_at_each_size(stream_of) -> None:
    samples = stream_of(
        WOBBLY, [(n, 300) for n in ALL_LEVELS], np.random.default_rng(5), sigma=0.03
    )
    result = fit(samples, node_size=8)
    assert [m.units for m in result.measured] == list(result.observed_units) == list(ALL_LEVELS)
    worst_model = max(_rel(result.model.step_time(n), WOBBLY.step_time(n)) for n in ALL_LEVELS)
    assert worst_model > 0.1  # the model is far off somewhere ...
    for m in result.measured:  # ... where the measurement is not
        assert _rel(m.step_time, WOBBLY.step_time(m.units)) < 0.02, m
        assert m.windows >= 1 and 0 < m.error < 0.05


def test_runs_that_agree_are_pooled_size_by_size() -> None:
    own = (Measured(4, 1.0, 5, 0.02),)
    known = (Measured(4, 1.01, 50, 0.02), Measured(8, 0.6, 50, 0.02))
    curve = anchored(TRUE, own, known)
    assert 1.0 < curve.step_time(4) < 1.01  # weighted towards the 50 windows of history
    assert curve.step_time(4) > 1.009
    assert curve.errors[4] < min(own[0].error, known[0].error)  # pooled: surer than either
    assert curve.step_time(8) == 0.6 and curve.errors[8] == known[1].error
    assert curve.step_time(16) == TRUE.step_time(16)  # nobody measured 16: the model


def test_a_run_that_contradicts_its_history_rules_and_rescales_it() -> None:
    """Tonight's data make every step 30 % slower: believe tonight, keep history's shape."""
    own = (Measured(4, 1.3, 5, 0.02),)
    known = (Measured(4, 1.0, 50, 0.02), Measured(8, 0.6, 50, 0.02))
    curve = anchored(TRUE, own, known)
    assert curve.step_time(4) == 1.3
    assert curve.step_time(8) == pytest.approx(0.6 * 1.3)
    assert curve.errors[8] > known[1].error  # the rescaling adds this run's uncertainty
    assert anchored(TRUE, (), known).step_time(4) == 1.0  # nothing of its own: history as is
