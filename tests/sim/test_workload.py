"""The seed-paper generator: seeded, ElasticFlow's deadline rule, round-trips through the loaders."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from qosflow.core.errors import SpecError
from qosflow.sim.trace import load_throughputs, load_trace
from qosflow.sim.workload import (
    BATCH,
    FAMILIES,
    SeedWorkload,
    generate,
    seed_table,
    write_table,
    write_trace,
)


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    w = SeedWorkload(jobs=50)
    assert generate(w, np.random.default_rng(7)) == generate(w, np.random.default_rng(7))
    assert generate(w, np.random.default_rng(7)) != generate(w, np.random.default_rng(8))


def test_deadline_rule_sizes_and_feasibility() -> None:
    w = SeedWorkload(jobs=300, lam_min=0.5, lam_max=1.5)
    table = seed_table(w)
    jobs = generate(w, np.random.default_rng(1))
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)
    for job in jobs:
        curve = table.curve(job.model, job.batch_size)
        lam = (job.deadline - job.submit) / job.duration
        assert 0.5 - 0.01 <= lam <= 1.5 + 0.01 or lam == pytest.approx(
            1.05 * job.iterations / max(curve.values()) / job.duration, rel=0.01
        )
        # iterations = duration x throughput at the requested size (ElasticFlow's size rule)
        assert job.iterations == pytest.approx(job.duration * curve[job.num_gpu], rel=0.01, abs=1)
        # feasible alone on the fastest size
        assert job.iterations / max(curve.values()) <= job.deadline - job.submit
        assert job.num_gpu <= w.cores_per_node
    lams = [(j.deadline - j.submit) / j.duration for j in jobs]
    assert min(lams) < 0.8  # tight deadlines exist: some jobs need more than they asked for


def test_rate_knob_compresses_arrivals() -> None:
    slow = generate(SeedWorkload(jobs=200, rate_per_hour=4), np.random.default_rng(2))
    fast = generate(SeedWorkload(jobs=200, rate_per_hour=40), np.random.default_rng(2))
    assert slow[-1].submit / 3600 == pytest.approx(200 / 4, rel=0.2)
    assert fast[-1].submit / 3600 == pytest.approx(200 / 40, rel=0.2)


def test_speed_curves_are_parameter_server_like() -> None:
    w = SeedWorkload()
    table = seed_table(w)
    assert w.levels() == (1, 2, 4, 8, 16, 32)
    for fam in FAMILIES:
        curve = table.curve(fam.name, BATCH)
        per_core = [curve[n] / n for n in w.levels()]
        assert per_core == sorted(per_core, reverse=True)  # diminishing returns
        assert curve[32] < curve[16]  # crossing the node costs more than it gains


def test_best_effort_share_and_round_trip(tmp_path: Path) -> None:
    w = SeedWorkload(jobs=80, best_effort_fraction=0.25)
    jobs = generate(w, np.random.default_rng(3))
    assert 5 <= sum(j.best_effort for j in jobs) <= 40
    assert all(math.isinf(j.deadline) for j in jobs if j.best_effort)
    write_trace(jobs, tmp_path / "seed.csv")
    write_table(seed_table(w), tmp_path / "throughputs_CPU")
    table = load_throughputs(tmp_path / "throughputs_CPU")
    back = load_trace(tmp_path / "seed.csv", table)
    assert [(j.job_id, j.submit, j.deadline, j.iterations, j.best_effort) for j in back] == [
        (j.job_id, j.submit, j.deadline, j.iterations, j.best_effort) for j in jobs
    ]
    assert dict(table.curve("cnn-small", BATCH)) == pytest.approx(
        dict(seed_table(w).curve("cnn-small", BATCH))
    )


def test_bad_knobs_name_the_field() -> None:
    with pytest.raises(SpecError, match="rate_per_hour"):
        generate(SeedWorkload(rate_per_hour=0), np.random.default_rng(0))
    with pytest.raises(SpecError, match="lam_min"):
        generate(SeedWorkload(lam_min=2.0, lam_max=1.0), np.random.default_rng(0))
