"""Parity over whole clusters: the simulator's adapter and the job board allocate the same.

The simulator's ``qosflow`` policy builds the allocator's snapshot from its engine
(:mod:`qosflow.sim.adapter`); the Airflow steps build it from the job board, where every watch
published its own job (spec as XCom carries it, progress, size, belief as tables, the allocator's
memory of it), with the forecast's arrivals. Multi-job snapshots are recorded from simulator runs (contended seed workloads,
oracle and learned speeds), every job is written to a real board (SQLite, JSON through the
store) as its watch would publish it, read back as the watch reads it
(:func:`qosflow_airflow.board.job_input`) and allocated again: every job's size, class,
guarantee and admission verdict must be the simulator's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qosflow.core import allocation
from qosflow.core.allocator import Allocation, ClusterInput, JobInput, allocate
from qosflow.core.forecast import arrival_from_dict, arrival_to_dict
from qosflow.core.predict import Calibration
from qosflow.core.summary import belief_to_dict, state_to_dict
from qosflow.sim.engine import SimConfig, simulate
from qosflow.sim.policies import qosflow_policy
from qosflow.sim.policies.qosflow_policy import QosflowPolicy
from qosflow.sim.workload import SeedWorkload, generate, seed_table
from qosflow.store.board import BoardEntry, JobBoard
from qosflow.store.history import HistoryStore
from qosflow_airflow.board import job_input
from qosflow_airflow.state import job_to_dict

CONTENDED = SeedWorkload(jobs=24, rate_per_hour=30, nodes=1, cores_per_node=16)


@dataclass(frozen=True)
class Recorded:
    """One decision of the simulator's policy."""

    cluster: ClusterInput
    allocation: Allocation
    repaired: bool


@functools.cache
def _record(mode: str, seed: int) -> list[Recorded]:
    """Every decision of one simulator run, with what the policy's allocator answered."""
    out: list[Recorded] = []
    repairs: list[int] = []
    real_repair = allocation.repair

    def counting_repair(*args: Any, **kwargs: Any) -> Any:
        repairs.append(1)
        return real_repair(*args, **kwargs)

    def recording(cluster: ClusterInput) -> Allocation:
        before = len(repairs)
        answer = allocate(cluster)
        out.append(Recorded(cluster, answer, len(repairs) > before))
        return answer

    with pytest.MonkeyPatch.context() as m:
        m.setattr(allocation, "repair", counting_repair)
        m.setattr(qosflow_policy, "allocate", recording)
        w = CONTENDED
        jobs = generate(w, np.random.default_rng(seed))
        learned = mode == "learned"
        policy = QosflowPolicy(calibration=Calibration() if learned else None)
        config = SimConfig(
            capacity=w.capacity, node_size=w.cores_per_node, slot=60, seed=seed, speeds=mode
        )
        simulate(jobs, seed_table(w), policy, config)
    return out


def _published(job: JobInput, now: float) -> BoardEntry:
    """The row the job's own watch writes (what it measured and what it was told)."""
    spec = job.spec
    return BoardEntry(
        job_id=spec.name,
        unit=spec.resources.unit,
        spec=job_to_dict(spec),
        done=job.done,
        units=job.units,
        belief=belief_to_dict(job.belief, job.belief_factor),
        state=state_to_dict(job.state),
        overhead_s=job.rescale_overhead_s,
        heartbeat=now,
    )


def _through_the_board(cluster: ClusterInput, board: JobBoard) -> ClusterInput:
    """The same snapshot as the Airflow steps see it: written to the board and read back."""
    now = float(cluster.now)
    with board.session(now) as session:
        for job in cluster.jobs:
            session.put(_published(job, now))
        order = {j.spec.name: i for i, j in enumerate(cluster.jobs)}
        entries = sorted(
            (e for e in session.entries(cluster.jobs[0].spec.resources.unit) if e.active),
            key=lambda e: order[e.job_id],
        )
        for e in entries:
            session.finish(e.job_id)
        unit = cluster.jobs[0].spec.resources.unit
        session.keep_arrivals(unit, [arrival_to_dict(a) for a in cluster.arrivals])
        arrivals = tuple(arrival_from_dict(a) for a in session.arrivals(unit))
    return ClusterInput(
        now=cluster.now,
        capacity=cluster.capacity,
        slot_s=cluster.slot_s,
        jobs=tuple(job_input(e) for e in entries),
        freed=cluster.freed,
        plan_factor=cluster.plan_factor,
        max_utilisation=cluster.max_utilisation,
        arrivals=arrivals,
    )


def _summary(a: Allocation) -> dict[str, Any]:
    return {
        "jobs": {n: (j.units, j.klass, j.guaranteed, j.reason, j.state) for n, j in a.jobs.items()},
        "admitted": a.admitted,
        "rejected": a.rejected,
        "verdicts": {n: (v.kind, v.units, v.counter_offer) for n, v in a.verdicts.items()},
        "wake_at": a.wake_at,
        "arrived": [  # step times as the board's tables give them back (rates: 1 ulp apart)
            (x.submitted_at, x.candidate.name, x.candidate.deadline, x.candidate.remaining_steps)
            for x in a.arrived
        ],
    }


def _interesting(records: list[Recorded]) -> Iterator[Recorded]:
    """Decisions with at least two jobs (most of them contended, with a repair or a verdict)."""
    for r in records:
        if len(r.cluster.jobs) >= 2:
            yield r


@pytest.fixture
def board(tmp_path: Path) -> Iterator[JobBoard]:
    store = HistoryStore(f"sqlite:///{tmp_path / 'board.db'}")
    try:
        yield JobBoard(store, "team")
    finally:
        store.close()


@pytest.mark.parametrize(("mode", "seed"), [("oracle", 2), ("oracle", 4), ("learned", 2)])
def test_board_and_simulator_allocate_the_same(mode: str, seed: int, board: JobBoard) -> None:
    records = list(_interesting(_record(mode, seed)))
    step = max(len(records) // 40, 1)
    chosen = records[::step]
    chosen += [r for r in records if r.repaired and r not in chosen][:3]
    assert len(chosen) >= 20
    contended = [
        r
        for r in chosen
        if sum(j.spec.resources.levels[0] for j in r.cluster.jobs) > r.cluster.capacity
        or sum(a.units for a in r.allocation.jobs.values()) == r.cluster.capacity
    ]
    best_effort = [
        r for r in chosen if any(v.kind != "guaranteed" for v in r.allocation.verdicts.values())
    ]
    assert len(contended) >= 10 and best_effort, "the recorded runs must contend"
    print(
        f"{mode}: {len(chosen)} snapshots, {len(contended)} contended, {len(best_effort)} "
        f"with a best-effort verdict, {sum(r.repaired for r in chosen)} repaired"
    )
    for r in chosen:
        again = allocate(_through_the_board(r.cluster, board))
        assert _summary(again) == _summary(r.allocation), f"t={r.cluster.now}"


def test_the_recorded_runs_include_a_repair() -> None:
    """The parity above is checked on repaired plans too (the recording must not lose them)."""
    records = _record("oracle", 2) + _record("oracle", 4) + _record("learned", 2)
    assert any(r.repaired for r in records)
