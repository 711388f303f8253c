"""Learned speeds: what the completed runs of a job's key measured, as the history store keeps it."""

from __future__ import annotations

from qosflow.sim.trace import ThroughputTable, TraceJob
from qosflow.sim.truth import FittedSpeeds, LearnedBelief, Truth

CURVE = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 11.0}
TRUTH = Truth(ThroughputTable("A100", {("resnet", 64): CURVE, ("bert", 64): CURVE}))


def _job(job_id: str, model: str = "resnet") -> TraceJob:
    return TraceJob(job_id, 0.0, 10_000.0, 50_000, model, 64, 2, 0.0)


def _samples(units: int, speed: float, start: float = 0.0) -> list[tuple[float, float, int]]:
    return [(start + 10.0 * i, 10.0 * i * speed, units) for i in range(40)]


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
