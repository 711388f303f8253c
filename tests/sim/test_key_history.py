"""Learned speeds: a job that has measured nothing yet is believed what its key's last run measured."""

from __future__ import annotations

from qosflow.sim.truth import LearnedBelief, Truth
from qosflow.trace import ThroughputTable, TraceJob

CURVE = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 11.0}
TRUTH = Truth(ThroughputTable("A100", {("resnet", 64): CURVE, ("bert", 64): CURVE}))


def _job(job_id: str, model: str = "resnet") -> TraceJob:
    return TraceJob(job_id, 0.0, 10_000.0, 50_000, model, 64, 2, 0.0)


def _samples(units: int, speed: float, start: float = 0.0) -> list[tuple[float, float, int]]:
    return [(start + 10.0 * i, 10.0 * i * speed, units) for i in range(40)]


def test_a_new_job_of_a_known_key_starts_from_what_its_last_run_measured() -> None:
    belief = LearnedBelief(TRUTH, node_size=8)
    first = belief.speeds(_job("a"), _samples(8, CURVE[8]))
    assert abs(first[8] - CURVE[8]) < 0.05 * CURVE[8]  # measured at 8

    again = belief.speeds(_job("b"), [])  # same key, nothing measured yet
    other = belief.speeds(_job("c", "bert"), [])  # another key: only the request is known

    assert again == first
    assert abs(again[8] - CURVE[8]) < 0.05 * CURVE[8]
    assert abs(other[8] - CURVE[8]) > 0.05 * CURVE[8]  # the prior's shape guesses 8 units


def test_own_progress_replaces_the_key_history() -> None:
    belief = LearnedBelief(TRUTH, node_size=8)
    belief.speeds(_job("a"), _samples(8, CURVE[8]))
    slower = belief.speeds(_job("b"), _samples(8, CURVE[8] / 2, start=1000.0))
    assert abs(slower[8] - CURVE[8] / 2) < 0.05 * CURVE[8]
