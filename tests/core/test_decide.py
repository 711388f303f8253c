"""Decision: every action on a worked example, and invariants over random jobs and beliefs."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qosflow.core.decide import (
    Action,
    Decision,
    JobSnapshot,
    decide,
    decided_units,
    margin_for,
    minimal_share,
)
from qosflow.core.errors import SpecError
from qosflow.core.fit import fit
from qosflow.core.predict import Belief, Calibration, belief_from_fit, oracle_belief, predict
from qosflow.core.speed import SpeedModel, TableCurve

LEVELS = (1, 2, 4, 8, 16)
# steps per second; 20 000 steps in 2 h after 600 s at 1 unit needs n* = 4
CURVE = TableCurve({1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 10.0})


@pytest.fixture
def job(spec_of):
    return spec_of(total_steps=20_000, deadline_s=7200.0, levels=LEVELS, margin_seconds=30.0)


def snap(job, t0, *, after=600.0, done=600, units=1, queued=False, last=None, overhead=30.0):
    return JobSnapshot(job, t0 + after, done, units, queued, last, overhead)


def test_margin_is_the_larger_of_absolute_and_5pct_of_time_left(job, spec_of, t0) -> None:
    assert margin_for(job, t0 + 600) == pytest.approx(0.05 * 6600)
    assert margin_for(job, t0 + 7000) == 30.0
    assert margin_for(job, t0 + 9000) == 30.0
    assert margin_for(spec_of(best_effort=True), t0) == 30.0


def test_minimal_share_is_the_smallest_level_meeting_deadline_minus_margin(job, t0) -> None:
    belief = oracle_belief(CURVE, LEVELS)
    assert minimal_share(belief, snap(job, t0)) == 4
    assert minimal_share(belief, snap(job, t0, after=7100.0)) is None


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    after=st.floats(0.0, 7300.0),
    done=st.integers(0, 20_000),
    units=st.sampled_from(LEVELS),
    queued=st.booleans(),
    factor=st.floats(1.0, 2.0),
)
def test_minimal_share_is_the_first_level_whose_predicted_finish_is_in_time(
    job, t0, after, done, units, queued, factor
) -> None:
    belief = Belief(
        CURVE,
        TableCurve({n: x / factor for n, x in CURVE.throughput_by_units.items()}),
        LEVELS,
        16,
    )
    sn = snap(job, t0, after=after, done=done, units=units, queued=queued)
    target = job.deadline - margin_for(job, sn.now)
    want = next(
        (
            n
            for n in LEVELS
            if predict(
                belief,
                now=sn.now,
                steps_done=done,
                total_steps=job.total_steps,
                units=n,
                current_units=0 if queued else units,  # a start pays the restart too
                overhead_s=30.0,
            ).conservative_finish
            <= target
        ),
        None,
    )
    assert minimal_share(belief, sn) == want


def test_scale_up_at_once_when_the_units_are_free(job, t0) -> None:
    d = decide(snap(job, t0), oracle_belief(CURVE, LEVELS), free_units=8)
    assert d.action is Action.SCALE_UP and d.units == 4
    assert d.conservative_finish <= d.deadline - d.margin
    assert "3 of 8 free units" in d.reason


def test_bump_when_not_free_or_queued(job, t0) -> None:
    belief = oracle_belief(CURVE, LEVELS)
    d = decide(snap(job, t0), belief, free_units=2)
    assert d.action is Action.BUMP and d.units == 4 and "only 2 of the 3 extra are free" in d.reason
    q = decide(snap(job, t0, queued=True), belief, free_units=100)
    assert q.action is Action.BUMP and q.units == 4 and q.reason.startswith("queued")


def test_at_most_one_rescale_per_dwell(job, t0) -> None:
    d = decide(snap(job, t0, last=t0 + 590), oracle_belief(CURVE, LEVELS), free_units=8)
    assert d.action is Action.ON_TRACK and d.units == 1 and d.reason.startswith("hold")
    assert "50 s" in d.reason  # 60 s dwell, 10 s ago


def test_probe_one_level_beyond_the_largest_observed(job, t0) -> None:
    belief = Belief(CURVE, CURVE, LEVELS, 16, observed=(1,))
    d = decide(snap(job, t0), belief, free_units=15)
    assert d.action is Action.SCALE_UP and d.units == 2 and "probe" in d.reason


def test_probe_upwards_when_no_size_is_known_to_make_it(job, t0) -> None:
    # the pessimistic extrapolation says even 16 misses; 4 is unexplored, so probe, not at_risk
    pessimistic = TableCurve({1: 1.0, 2: 1.5, 4: 1.8, 8: 2.0, 16: 2.1})
    belief = Belief(pessimistic, pessimistic, LEVELS, 16, observed=(1, 2))
    d = decide(snap(job, t0, units=2), belief, free_units=14)
    assert d.action is Action.SCALE_UP and d.units == 4
    assert "no observed size makes it" in d.reason
    explored = Belief(pessimistic, pessimistic, LEVELS, 16, observed=(1, 2, 4, 8, 16))
    assert decide(snap(job, t0, units=2), explored, free_units=14).action is Action.AT_RISK


def test_scale_down_with_twice_the_margin_dwell_and_benefit(job, t0) -> None:
    belief = oracle_belief(CURVE, LEVELS)
    d = decide(snap(job, t0, units=16), belief, free_units=0)
    assert d.action is Action.SCALE_DOWN and d.units == 4
    assert d.conservative_finish <= d.deadline - 2 * d.margin
    assert "gives back" in d.reason or "giving back 12 units" in d.reason
    recent = decide(snap(job, t0, units=16, last=t0 + 580), belief, free_units=0)
    assert recent.action is Action.ON_TRACK and recent.units == 16


def test_no_scale_down_without_real_benefit(job, t0) -> None:
    # 200 steps left, 100 s rescale: going to 1 unit frees 7 x 300 = 2100 unit-s < 3 x 100 x 8
    belief = oracle_belief(CURVE, LEVELS)
    d = decide(snap(job, t0, units=8, done=19_800, overhead=100.0), belief, free_units=0)
    assert d.action is Action.ON_TRACK and d.units == 8
    cheap = decide(snap(job, t0, units=8, done=19_800, overhead=30.0), belief, free_units=0)
    assert cheap.action is Action.SCALE_DOWN and cheap.units == 1


def test_at_risk_when_even_the_knee_cannot_make_it(job, t0) -> None:
    belief = oracle_belief(CURVE, LEVELS)
    d = decide(snap(job, t0, after=6000.0, done=600, units=2), belief, free_units=6)
    assert d.action is Action.AT_RISK and d.units == 8  # the best reachable: 2 + 6 free
    assert d.reason.startswith("at risk: even at 16 units") and "8 units reachable now" in d.reason
    queued = decide(snap(job, t0, after=6000.0, done=600, queued=True), belief, free_units=0)
    assert queued.action is Action.AT_RISK and queued.units == 16


def test_at_risk_above_a_knee_that_would_make_it(job, t0) -> None:
    humped = TableCurve({1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 1.0})
    belief = oracle_belief(humped, LEVELS)
    d = decide(snap(job, t0, units=16, done=7_000, after=5000.0), belief, free_units=0)
    assert d.action is Action.AT_RISK and d.units == 8 and "above the knee" in d.reason


def test_at_risk_runs_at_the_fastest_size_not_at_a_thin_knee_believed_slower(job, t0) -> None:
    # The knee stays at 16 while 16's measurement is thin (qosflow.core.predict), though 16 is
    # believed slower than 8: a job at risk runs, and is judged, at 8.
    humped = TableCurve({1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 5.0})
    belief = replace(oracle_belief(humped, LEVELS), knee=16)
    assert (belief.best_plannable(2), belief.fastest_plannable(2)) == (16, 8)
    d = decide(snap(job, t0, after=6000.0, done=600, queued=True), belief, free_units=0)
    assert d.action is Action.AT_RISK and d.units == 8
    assert d.reason.startswith("at risk: even at 8 units (knee 16")


@given(
    rates=st.lists(st.floats(0.1, 20.0), min_size=len(LEVELS), max_size=len(LEVELS)),
    knee=st.sampled_from(LEVELS),
    units=st.sampled_from(LEVELS),
)
def test_the_fastest_plannable_size_is_never_slower_nor_above_the_best_plannable(
    rates: list[float], knee: int, units: int
) -> None:
    belief = replace(
        oracle_belief(TableCurve(dict(zip(LEVELS, rates, strict=True))), LEVELS), knee=knee
    )
    cap, fastest = belief.best_plannable(units), belief.fastest_plannable(units)
    step = belief.conservative.step_time
    assert fastest <= cap and step(fastest) <= step(cap)
    assert all(step(n) > step(fastest) for n in LEVELS if n < fastest)  # ties keep the fewer
    assert all(step(n) >= step(fastest) for n in LEVELS if n <= cap)


def test_done_and_best_effort(job, spec_of, t0) -> None:
    belief = oracle_belief(CURVE, LEVELS)
    assert decide(snap(job, t0, done=20_000, units=4), belief, free_units=0).action is Action.DONE
    free = spec_of(best_effort=True)
    d = decide(snap(free, t0), belief, free_units=16)
    assert d.action is Action.ON_TRACK and math.isinf(d.deadline)


def test_decision_round_trips_through_json(job, spec_of, t0) -> None:
    for spec in (job, spec_of(best_effort=True)):
        d = decide(snap(spec, t0), oracle_belief(CURVE, LEVELS), free_units=8)
        text = json.dumps(d.to_dict(), allow_nan=False)
        assert Decision.from_dict(json.loads(text)) == d
    with pytest.raises(SpecError, match=r"decision\.action"):
        Decision.from_dict({"action": "explode"})
    with pytest.raises(SpecError, match=r"decision\.units"):
        Decision.from_dict({"action": "done"})


# ------------------------------------------------------------------------------- invariants

models = st.builds(
    SpeedModel,
    st.floats(0.0, 0.5),
    st.floats(0.01, 5.0),
    st.floats(0.0, 0.1),
    st.floats(0.0, 0.005),
    st.floats(0.0, 0.1),
    st.just(8),
)
level_sets = st.lists(st.integers(1, 32), min_size=1, max_size=6, unique=True).map(sorted)
level_sets = st.one_of(level_sets, level_sets.filter(lambda ls: len(ls) >= 3))


@st.composite
def situations(draw):
    levels = tuple(draw(level_sets))
    model = draw(models)
    factor = draw(st.floats(1.0, 1.3))
    cons = TableCurve({n: 1.0 / (model.step_time(n) * factor) for n in levels})
    observed = tuple(draw(st.sets(st.sampled_from(levels), max_size=3)))
    belief = Belief(model, cons, levels, min(levels, key=model.step_time), observed)
    total = draw(st.integers(1, 50_000))
    # deadlines from the work itself, so every action is reachable: the whole job at a random
    # level takes `alone` seconds; the deadline is lam x that, the job is seen part-way
    alone = total * model.step_time(draw(st.sampled_from(levels)))
    deadline_s = max(60.0, draw(st.integers(50, 250)) / 100 * alone)
    after = draw(st.integers(0, 110)) / 100 * deadline_s
    return (
        levels,
        belief,
        dict(
            total_steps=total,
            deadline_s=deadline_s,
            margin_seconds=draw(st.floats(0.0, 0.05)) * deadline_s,
            dwell_seconds=draw(st.floats(0.0, 3600.0)),
        ),
        dict(
            after=after,
            done=min(total, int(total * after / deadline_s * draw(st.integers(0, 200)) / 100)),
            units=draw(st.sampled_from(levels)),
            queued=draw(st.booleans()),
            since=draw(st.none() | st.integers(0, 3600).map(float)),
            overhead=float(draw(st.integers(0, 120))),
        ),
        draw(st.integers(0, 64)),
    )


@settings(max_examples=500)
@given(situation=situations())
def test_decision_invariants(spec_of, t0, situation) -> None:
    levels, belief, spec_kw, s, free = situation
    spec = spec_of(levels=levels, **spec_kw)
    now = t0 + s["after"]
    last = None if s["since"] is None else now - s["since"]
    sn = JobSnapshot(spec, now, s["done"], s["units"], s["queued"], last, s["overhead"])
    d = decide(sn, belief, free_units=free)
    event(d.action.value)
    # a silent call decides exactly the same, only without the words; the allocator's size-only
    # call (with or without the minimal share it computed) keeps the same size
    silent = decide(sn, belief, free_units=free, explain=False)
    assert silent.action is d.action and silent.units == d.units
    assert silent.conservative_finish == d.conservative_finish
    share = minimal_share(belief, sn)
    assert decided_units(sn, belief, free_units=free) == d.units
    assert decided_units(sn, belief, free_units=free, share=share) == d.units
    margin = margin_for(spec, now)
    in_dwell = last is not None and now - last < spec.dwell_seconds

    assert d.units in levels
    assert re.search(r"\d", d.reason)
    assert (d.action is Action.DONE) == (s["done"] >= spec.total_steps)
    at = predict(
        belief,
        now=now,
        steps_done=s["done"],
        total_steps=spec.total_steps,
        units=d.units,
        current_units=0 if s["queued"] else s["units"],
        overhead_s=s["overhead"],
    )
    assert math.isclose(d.conservative_finish, at.conservative_finish)
    if d.action is Action.SCALE_DOWN:
        assert d.units < s["units"] and not in_dwell and not s["queued"]
        assert d.conservative_finish <= spec.deadline - 2 * margin
    if d.action is Action.SCALE_UP:
        assert s["units"] < d.units <= max(belief.probe_limit, s["units"])
        assert d.units - s["units"] <= free and not in_dwell and not s["queued"]
    if d.action in (Action.SCALE_UP, Action.SCALE_DOWN) or (
        d.action is Action.AT_RISK and d.units != s["units"] and not s["queued"]
    ):
        assert not in_dwell
    if d.action is Action.ON_TRACK and not d.reason.startswith("hold"):
        assert d.units == s["units"]
        assert d.conservative_finish <= spec.deadline - margin
    if d.action is Action.AT_RISK and minimal_share(belief, sn) is None:
        assert d.units <= belief.knee or d.units == s["units"]


def test_a_belief_over_more_sizes_than_the_spec_allows_is_restricted(spec_of, t0) -> None:
    job = spec_of(total_steps=20_000, deadline_s=7200.0, levels=(1, 2, 8))
    belief = oracle_belief(CURVE, LEVELS)  # also knows 4 and 16
    d = decide(snap(job, t0), belief, free_units=15)
    assert d.action is Action.SCALE_UP and d.units == 8
    assert minimal_share(belief, snap(job, t0)) == 8


@settings(max_examples=80)
@given(
    t1=st.floats(0.2, 3.0),
    t3=st.floats(0.0, 0.02),
    plan=st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3),
    lam=st.integers(30, 300),
    free=st.integers(0, 16),
    seed=st.integers(0, 2**32 - 1),
)
def test_fitted_beliefs_keep_decisions_within_the_levels(
    spec_of, stream_of, t0, t1, t3, plan, lam, free, seed
) -> None:
    truth = SpeedModel(0.02, t1, 0.02, t3, 0.05, node_size=8)
    rng = np.random.default_rng(seed)
    samples = stream_of(truth, [(n, 200) for n in plan], rng, start=t0)
    done = 200 * len(plan)
    total = 10 * done
    job = spec_of(
        total_steps=total, deadline_s=lam / 100 * total * truth.step_time(1), levels=LEVELS
    )
    belief = belief_from_fit(fit(samples, node_size=8, rng=rng), LEVELS, Calibration())
    now = samples[-1].time
    for units in LEVELS:
        d = decide(JobSnapshot(job, now, done, units, False, None), belief, free_units=free)
        assert d.units in LEVELS
        if d.action is Action.SCALE_UP:
            assert d.units <= belief.probe_limit and d.units - units <= free
        if d.action is Action.SCALE_DOWN:
            assert d.units < units
            low = min(belief.observed)
            if d.units < low:  # judged by at least a linear slow-down from the smallest observed
                linear = belief.median.step_time(low) * low / d.units
                assert belief.conservative.step_time(d.units) >= linear * (1 - 1e-9)
            assert d.conservative_finish <= d.deadline - 2 * d.margin
