"""Thin or contended measurements never switch scaling off (issue 13).

The newcomer's sequence, as seen on a real deployment: a first run left 209 clean samples at
1 CPU and, after a rescale onto a busy host, 19 samples (about 60 s) at 2 CPUs in which the job
got barely more than one CPU. The next run must plan to use 2 CPUs again, and no later run may be
rejected for a belief when its spec says ``if_not_guaranteed: run_best_effort``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from qosflow.core.decide import Action, JobSnapshot, decide
from qosflow.core.fit import fit, measured
from qosflow.core.planning import belief_for, plan_job
from qosflow.core.predict import Calibration, belief_from_fit
from qosflow.core.prior import fit_of
from qosflow.core.spec import load_job
from qosflow.core.speed import ProgressSample
from qosflow.core.windows import CLEAN_SHARE, SETTLED_WINDOWS, STALE_S, windows
from qosflow.store.history import HistoryStore

STEP_1CPU = 0.15  # s/step at 1 CPU; the job really runs 1.67x faster at 2 CPUs
T0 = datetime(2026, 11, 30, 1, 0, tzinfo=UTC).timestamp()


def run_at(
    units: int,
    n: int,
    step_s: float,
    *,
    start: float,
    steps: int = 0,
    every: float = 2.0,
    share: float | None = 0.99,
    rng: np.random.Generator | None = None,
) -> list[ProgressSample]:
    """``n`` samples ``every`` seconds of a job doing one step per ``step_s`` (2 % noise)."""
    rng = rng or np.random.default_rng(0)
    out, done, t = [], float(steps), start
    for _ in range(n):
        out.append(ProgressSample(t, int(done), units, share))
        t += every
        done += every / step_s * float(rng.lognormal(0.0, 0.02))
    return out


def newcomer(start: float = T0) -> list[ProgressSample]:
    """209 clean samples at 1 CPU, then 19 contended ones at 2 CPUs going no faster (~60 s)."""
    first = run_at(1, 209, STEP_1CPU, start=start)
    last = first[-1]
    contended = run_at(
        2, 19, STEP_1CPU * 0.97, start=last.time + 2, steps=last.steps_done, every=3.3, share=0.55
    )
    return first + contended


def job(deadline_s: float, *, policy: str = "run_best_effort", now: float = T0):
    return load_job(
        {
            "name": "retrain",
            "key": "nightly-retrain",
            "total_steps": 1500,
            "deadline": f"PT{deadline_s:.0f}S",
            "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
            "margin_seconds": 10,
            "dwell_seconds": 15,
            "if_not_guaranteed": policy,
        },
        now=datetime.fromtimestamp(now, UTC),
    )


def test_a_contended_window_is_discounted() -> None:
    samples = newcomer()
    ws = windows(samples)
    at2 = [w for w in ws if w.units == 2]
    assert at2 and all(not w.clean and w.share < CLEAN_SHARE for w in at2)
    assert all(w.clean for w in ws if w.units == 1)
    result = fit(samples, node_size=2)
    assert result.observed_units == (1,)  # 2 CPUs were not measured: the host was
    assert result.discounted == len(at2)
    assert "contended" in result.message
    # taken at face value (no share reported) the same windows would have said "no faster"
    blind = [ProgressSample(s.time, s.steps_done, s.units) for s in samples]
    assert fit(blind, node_size=2).observed_units == (1, 2)


def test_the_next_run_plans_to_use_two_cpus_again(tmp_path: Path) -> None:
    store = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    store.record_samples("nightly-retrain", "cpu", newcomer())
    history = store.history("nightly-retrain", "cpu")
    assert [s.share for s in history[-3:]] == [0.55] * 3  # the store keeps the share
    now = T0 + 86400
    spec = job(1500 * STEP_1CPU * 1.1, now=now)  # 1 CPU cannot be promised it; 2 CPUs can
    fitted = fit_of(history, 2, now=now)
    assert fitted is not None and fitted.observed_units == (1,)
    plan = plan_job(
        spec, capacity=2, now=now, prior=fitted.model, calibration=Calibration(), history=history
    )
    assert plan.verdict.units == 2, plan.verdict.reason
    assert plan.verdict.kind == "guaranteed", plan.verdict.reason


def test_the_run_after_it_is_never_rejected_for_a_belief(tmp_path: Path) -> None:
    # the next run, planned on the contended belief, went on at 1 CPU and missed; its samples join
    # the history. The run after it has a deadline the belief says it cannot make.
    store = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    store.record_samples("nightly-retrain", "cpu", newcomer())
    store.record_samples(
        "nightly-retrain", "cpu", run_at(1, 120, STEP_1CPU, start=T0 + 86400, share=0.98)
    )
    history = store.history("nightly-retrain", "cpu")
    now = T0 + 2 * 86400
    fitted = fit_of(history, 2, now=now)
    assert fitted is not None
    for policy, kinds in (("run_best_effort", {"best_effort"}), ("reject", {"rejected"})):
        spec = job(1500 * STEP_1CPU * 0.3, policy=policy, now=now)  # hopeless even at 2 CPUs
        plan = plan_job(spec, capacity=2, now=now, prior=fitted.model, history=history)
        assert plan.verdict.kind in kinds, plan.verdict.reason
        if policy == "run_best_effort":
            assert plan.verdict.units == 2  # best-effort at its fastest size, it tries 2 again


def test_a_thin_measurement_keeps_the_knee_until_it_has_enough_clean_windows() -> None:
    spec = job(600)
    first = run_at(1, 80, STEP_1CPU, start=T0)
    last = first[-1]
    # at 2 CPUs the job really is no faster (a job that does not scale), with clean windows
    slow = run_at(2, 60, STEP_1CPU, start=last.time + 2, steps=last.steps_done)
    for n in range(12, len(slow) + 1, 4):
        belief = belief_for(spec, first + slow[:n])
        at2 = next((m for m in fit(first + slow[:n], node_size=2).measured if m.units == 2), None)
        if at2 is None or at2.windows < SETTLED_WINDOWS:
            assert belief.knee == 2, (n, at2)  # thin: 2 CPUs may still help, keep measuring
        else:
            assert belief.knee == 1, (n, at2)  # enough clean evidence: no faster, give it back
    assert belief.knee == 1


def test_thin_history_never_lowers_the_knee_and_stale_history_gives_way() -> None:
    now = T0 + 86400
    spec = job(600, now=now)
    first = run_at(1, 120, STEP_1CPU, start=T0)
    last = first[-1]
    # two clean windows at 2 CPUs that happened to show no speed-up: too thin to rule 2 CPUs out
    thin = run_at(2, 14, STEP_1CPU, start=last.time + 2, steps=last.steps_done)
    got = fit_of(first + thin, 2, now=now)
    assert got is not None and got.observed_units == (1, 2)  # kept: it is evidence
    at2 = next(m for m in got.measured if m.units == 2)
    assert 0 < at2.windows < SETTLED_WINDOWS
    belief = belief_for(spec, [], prior=got.model, known=got.measured)
    assert belief.knee == 2  # but too little to say two CPUs never help: tonight probes it again
    # plenty of windows at 2 CPUs, but older than STALE_S before tonight's plan, next to fresh
    # 1-CPU windows: old evidence gives way to new
    old = run_at(2, 80, STEP_1CPU, start=T0 - STALE_S - 86400)
    fresh = fit_of(old + first, 2, now=now)
    assert fresh is not None and fresh.observed_units == (1,)
    assert [m.units for m in measured(old + first, stale_before=now - STALE_S)] == [1]
    assert fit_of(old + first, 2).observed_units == (1, 2)  # without a plan time: all evidence
    assert fit_of(old, 2, now=now).observed_units == (2,)  # nothing newer: the old evidence stays


@pytest.mark.parametrize("share", [None, 0.97])
def test_clean_or_unreported_windows_count_as_before(share: float | None) -> None:
    samples = run_at(1, 60, STEP_1CPU, start=T0, share=share)
    samples += run_at(
        2, 60, STEP_1CPU / 1.67, start=samples[-1].time + 2, steps=samples[-1].steps_done,
        share=share,
    )  # fmt: skip
    result = fit(samples, node_size=2)
    assert result.observed_units == (1, 2) and result.discounted == 0
    belief = belief_from_fit(result, (1, 2), Calibration())
    assert belief.knee == 2
    assert belief.median.step_time(2) == pytest.approx(STEP_1CPU / 1.67, rel=0.05)


def test_a_stale_progress_read_just_after_a_rescale_never_sends_the_job_back() -> None:
    # the trainer rewrites its progress file once a second and the watch reads it every 1.1 s, so
    # now and then a read finds no new line and the next one a single new line: the two intervals
    # fold into one that reads half the true speed. Grown to 2 CPUs (really 1.67x faster) and out
    # of its dwell, the job must not go back to 1 CPU on that one interval.
    spec = job(1500 * STEP_1CPU * 0.6)  # not even 2 CPUs make it: it runs as fast as it can
    first = run_at(1, 15, STEP_1CPU, start=T0, every=1.1)
    t, k = first[-1].time + 3.0, first[-1].steps_done
    per_write = round(1.0 / (STEP_1CPU / 1.67))  # steps at 2 CPUs between two progress writes
    reads = [(0.0, 0), (1.1, per_write), (2.2, 2 * per_write), (3.3, 2 * per_write)]
    reads.append((4.4, 3 * per_write))  # stale at 3.3 s, one new line at 4.4 s
    at2 = [ProgressSample(t + dt, k + dk, 2, 0.99) for dt, dk in reads]
    samples = first + at2
    assert max(w.step_time for w in windows(samples, warmup_steps=0, per_window=1)) > STEP_1CPU
    now = at2[-1].time
    snap = JobSnapshot(spec, now, at2[-1].steps_done, 2, False, now - 30.0, 2.0)
    belief = belief_for(spec, samples)
    assert 2 not in fit(samples, node_size=2).observed_units  # 2.2 s measure the reporting
    decision = decide(snap, belief, free_units=0)
    assert decision.action is Action.AT_RISK and decision.units == 2, decision.reason
    # five more reads, one of them stale: a full window, whose median is the true speed
    more = [(5.5, 4), (6.6, 5), (7.7, 5), (8.8, 7), (9.9, 8)]
    samples += [ProgressSample(t + dt, k + n * per_write, 2, 0.99) for dt, n in more]
    measured_at2 = next(m for m in fit(samples, node_size=2).measured if m.units == 2)
    assert measured_at2.step_time < STEP_1CPU / 1.4
