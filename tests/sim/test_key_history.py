"""Learned speeds: what the completed runs of a job's key measured, as the history store keeps it."""

from __future__ import annotations

from datetime import UTC, datetime

from qosflow.core.planning import belief_for
from qosflow.core.predict import Calibration, belief_from_fit
from qosflow.core.spec import JobSpec, load_job
from qosflow.sim.trace import ThroughputTable, TraceJob
from qosflow.sim.truth import FittedSpeeds, LearnedBelief, Truth

CURVE = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 11.0}
TRUTH = Truth(ThroughputTable("A100", {("resnet", 64): CURVE, ("bert", 64): CURVE}))


def _job(job_id: str, model: str = "resnet") -> TraceJob:
    return TraceJob(job_id, 0.0, 10_000.0, 50_000, model, 64, 2, 0.0)


def _samples(units: int, speed: float, start: float = 0.0) -> list[tuple[float, float, int]]:
    return [(start + 10.0 * i, 10.0 * i * speed, units) for i in range(40)]


def _timed_at(units: int, name: str) -> JobSpec:
    """The spec of a trace job whose user timed it at ``units`` (the table's value there)."""
    return load_job(
        {
            "name": name,
            "total_steps": 50_000,
            "deadline": "PT10000S",
            "resources": {"unit": "gpu", "min": 1, "max": 16, "levels": [1, 2, 4, 8, 16]},
            "step_seconds_estimate": 1.0 / CURVE[units],
            "step_seconds_estimate_at": units,
        },
        now=datetime(2026, 12, 3, tzinfo=UTC),
    )


def test_a_new_job_of_a_known_key_starts_from_what_its_completed_runs_measured() -> None:
    belief = LearnedBelief(TRUTH, node_size=8)
    running = belief.speeds(_job("a"), _samples(8, CURVE[8]))
    assert abs(running[8] - CURVE[8]) < 0.05 * CURVE[8]  # measured at 8
    before = belief.speeds(_job("b"), [])  # a is still running: its key has no history yet
    assert abs(before[8] - CURVE[8]) > 0.05 * CURVE[8]  # the request prior's shape guesses 8

    belief.finished(_job("a"), _samples(8, CURVE[8]))  # the finish step records it
    again = belief.speeds(_job("b"), [])  # same key, same (empty) samples: the belief is renewed
    other = belief.speeds(_job("c", "bert"), [])  # another key: only the request is known

    assert isinstance(again, FittedSpeeds)
    assert [m.units for m in again.fit.measured] == [8]
    assert again[8] == 1.0 / again.fit.measured[0].step_time  # the table shows the measurement
    assert abs(again[8] - CURVE[8]) < 1e-3 * CURVE[8]
    assert abs(other[8] - CURVE[8]) > 0.05 * CURVE[8]


def test_every_completed_run_of_the_key_counts() -> None:
    """Two runs measured 2 and 16; a third, measuring 4, believes 2 and 16 as they measured."""
    belief = LearnedBelief(TRUTH, node_size=8)
    belief.finished(_job("a"), _samples(2, CURVE[2]))
    belief.finished(_job("b"), _samples(16, CURVE[16], start=1000.0))
    speeds = belief.speeds(_job("c"), _samples(4, CURVE[4], start=2000.0))
    assert isinstance(speeds, FittedSpeeds)
    assert [m.units for m in speeds.known] == [2, 16]
    assert [m.units for m in speeds.fit.measured] == [4]


def test_own_progress_replaces_the_key_history() -> None:
    belief = LearnedBelief(TRUTH, node_size=8)
    belief.finished(_job("a"), _samples(8, CURVE[8]))
    slower = belief.speeds(_job("b"), _samples(8, CURVE[8] / 2, start=1000.0))
    assert abs(slower[8] - CURVE[8] / 2) < 0.05 * CURVE[8]


def test_a_request_above_one_node_counts_as_measured_there_as_the_plan_step_counts_it() -> None:
    """The user timed the job once at the size it asks for; above a node that is a measurement."""
    belief = LearnedBelief(TRUTH, node_size=8)
    big = TraceJob("big", 0.0, 10_000.0, 50_000, "resnet", 64, 16, 0.0)
    speeds = belief.speeds(big, [])
    assert isinstance(speeds, FittedSpeeds)
    assert [(m.units, m.windows) for m in speeds.known] == [(16, 1)]
    assert abs(speeds[16] - CURVE[16]) < 1e-9 * CURVE[16]
    other = belief.speeds(_job("other", "bert"), [])  # another key, asking for 2: nothing known
    assert isinstance(other, FittedSpeeds) and other.known == ()

    # the plan step, given a spec stating the same estimate, believes the same
    spec = _timed_at(16, "big")
    levels = spec.resources.levels
    ours = belief_from_fit(speeds.fit, levels, Calibration(), known=speeds.known)
    theirs = belief_for(spec)
    assert ours.observed == theirs.observed == (16,)
    for n in levels:
        assert abs(ours.conservative.step_time(n) - theirs.conservative.step_time(n)) < 1e-9


def test_a_timing_above_one_node_counts_for_every_later_job_of_the_key_until_a_run_measures() -> (
    None
):
    """The plan step records the timing for the key; a later job asking for 2 counts it too."""
    belief = LearnedBelief(TRUTH, node_size=8)
    belief.speeds(TraceJob("big", 0.0, 10_000.0, 50_000, "resnet", 64, 16, 0.0), [])
    small = belief.speeds(_job("small"), [])  # same key, asks for 2
    assert isinstance(small, FittedSpeeds)
    assert [(m.units, m.windows) for m in small.known] == [(16, 1)]

    # the plan step of the same job (its estimate timed at 2), given the key's timings
    spec = _timed_at(2, "small")
    levels = spec.resources.levels
    ours = belief_from_fit(small.fit, levels, Calibration(), known=small.known)
    theirs = belief_for(spec, timings=small.known)
    assert ours.observed == theirs.observed == (16,)
    for n in levels:
        assert abs(ours.conservative.step_time(n) - theirs.conservative.step_time(n)) < 1e-9

    # once a run of the key measured 16, its windows rule: the timing drops out
    belief.finished(_job("a"), _samples(16, CURVE[16]))
    late = belief.speeds(_job("late"), [])
    assert isinstance(late, FittedSpeeds)
    assert [m.units for m in late.fit.measured] == [16] and late.known == ()


def test_a_profilers_samples_reach_its_key_when_its_ladder_ends_and_are_not_counted_twice() -> None:
    """The watch records a profiler's samples at once; the finish step skips them later."""
    belief = LearnedBelief(TRUTH, node_size=8)
    climbed = _samples(16, CURVE[16])
    belief.profiled(_job("a"), climbed)  # its ladder ended: 16 is measured for the key
    later = belief.speeds(_job("b"), [])
    assert isinstance(later, FittedSpeeds)
    assert [m.units for m in later.fit.measured] == [16]
    windows = later.fit.measured[0].windows

    tail = [(400.0 + 10.0 * i, climbed[-1][1] + 10.0 * i * CURVE[8], 8) for i in range(40)]
    belief.finished(_job("a"), [*climbed, *tail])  # the whole run, the climbed part included
    done = belief.speeds(_job("c"), [])
    assert isinstance(done, FittedSpeeds)
    assert {m.units: m.windows for m in done.fit.measured}[16] == windows  # not twice
    assert 8 in {m.units for m in done.fit.measured}  # the rest of the run counts
