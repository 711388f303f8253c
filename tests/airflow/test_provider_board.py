"""The provider's job board: steps of different jobs allocating one cluster through the store.

A cluster of 4 CPUs is modelled here by what its jobs hold; every job runs at ``n`` steps per
second on ``n`` units. Each step brings only what it measured (its row), runs the allocator on
the whole board and acts on its own job (:func:`qosflow.core.steer.steer`), as the watch does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from qosflow.core import allocator as core_allocator
from qosflow.core.decide import Action, JobSnapshot
from qosflow.core.predict import Belief, oracle_belief
from qosflow.core.spec import IfNotGuaranteed, JobSpec, load_job
from qosflow.core.speed import TableCurve
from qosflow.core.steer import steer
from qosflow.store.board import HEARTBEAT_TTL_S, BoardEntry, JobBoard
from qosflow.store.history import HistoryStore
from qosflow_airflow import board as provider
from qosflow_airflow.board import (
    BoardAnswer,
    allocate_on_board,
    finish_on_board,
    job_input,
    publish,
)
from qosflow_airflow.state import job_to_dict

T0 = datetime(2026, 11, 29, 18, 0, tzinfo=UTC).timestamp()
CAPACITY = 4
LEVELS = (1, 2, 3, 4)


def spec(
    name: str,
    steps: int,
    deadline_s: float,
    *,
    at: float = T0,
    policy: IfNotGuaranteed = "run_best_effort",
) -> JobSpec:
    return load_job(
        {
            "name": name,
            "total_steps": steps,
            "deadline": f"PT{deadline_s:.0f}S",
            "if_not_guaranteed": policy,
            "margin_seconds": 10,
            "dwell_seconds": 60,
            "resources": {"unit": "cpu", "min": 1, "max": 4, "levels": list(LEVELS), "per_node": 4},
        },
        now=datetime.fromtimestamp(at, UTC),
    )


def linear(slowdown: float = 1.0) -> Belief:
    """n steps per second on n units; the conservative bound ``slowdown`` times slower."""
    median = TableCurve({n: float(n) for n in LEVELS})
    cons = TableCurve({n: n / slowdown for n in LEVELS})
    return Belief(median, cons, LEVELS, oracle_belief(median, LEVELS).knee, ())


@pytest.fixture
def board(tmp_path: Path) -> Iterator[JobBoard]:
    store = HistoryStore(f"sqlite:///{tmp_path / 'shared.db'}")
    yield JobBoard(store, "team")
    store.close()


@dataclass
class Cluster:
    """What every job holds, and the steps of each job (one row each on the board)."""

    board: JobBoard
    specs: dict[str, JobSpec] = field(default_factory=dict)
    beliefs: dict[str, Belief] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    klass: dict[str, str] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return CAPACITY - sum(self.holds.values())

    def add(self, s: JobSpec, belief: Belief | None = None) -> None:
        self.specs[s.name], self.beliefs[s.name] = s, belief or linear()
        self.holds[s.name], self.done[s.name] = 0, 0.0

    def poll(self, name: str, now: float, **cluster_side: Any) -> BoardAnswer:
        """One step of ``name``: publish its row, allocate on the board, read its answer.

        ``cluster_side``: what the steps read off the cluster besides the free units (``ended``,
        ``held_units``, ``total_units``); by default the cluster's own count of held units and
        its size, as the plan step and the watch pass them.
        """
        cluster_side.setdefault("held_units", sum(self.holds.values()))
        cluster_side.setdefault("total_units", CAPACITY)
        s = self.specs[name]
        row = BoardEntry(
            job_id=name,
            unit="cpu",
            spec=job_to_dict(s),
            done=self.done[name],
            units=self.holds[name],
            klass=self.klass.get(name, ""),
        )
        return allocate_on_board(
            self.board,
            publish(row, self.beliefs[name], None),
            now=now,
            free_units=self.free,
            plan_factor=None,
            **cluster_side,
        )

    def step(self, name: str, now: float) -> Action:
        """A poll and the action it leads to, taken at once (the watch with no hold)."""
        answer = self.poll(name, now)
        assert answer.mine is not None
        holds = self.holds[name]
        snap = JobSnapshot(self.specs[name], now, int(self.done[name]), holds, False, None)
        d = steer(
            snap,
            self.beliefs[name],
            answer.mine,
            free_units=self.free,
            held_below=answer.held_below,
            current_class=self.klass.get(name, answer.mine.klass),
        )
        if d.action in (Action.SCALE_UP, Action.SCALE_DOWN):
            self.holds[name] = d.units
        self.klass[name] = answer.mine.klass
        assert sum(self.holds.values()) <= CAPACITY  # never more than the cluster has
        return d.action

    def submit(self, name: str, now: float) -> BoardAnswer:
        """The plan step, the workflow started at its target, the first poll of its watch."""
        plan = self.poll(name, now)
        if plan.mine is not None:
            self.holds[name] = plan.mine.units
            self.step(name, now + 1)  # the row now says what it holds
        return plan

    def run(self, seconds: float) -> None:
        for name, n in self.holds.items():
            self.done[name] = min(self.done[name] + n * seconds, self.specs[name].total_steps)

    def row(self, name: str, now: float) -> BoardEntry:
        with self.board.session(now) as s:
            got = s.get(name)
        assert got is not None
        return got


def test_a_job_published_on_the_board_reads_back_as_the_allocator_saw_it(board: JobBoard) -> None:
    s = spec("a", 1000, 600)
    row = publish(BoardEntry("a", "cpu", job_to_dict(s), done=10.0, units=2), linear(1.5), 1.2)
    with board.session(T0) as session:
        session.put(row)
        back = session.get("a")
    assert back is not None
    j = job_input(back)
    assert j.spec == s and (j.done, j.units) == (10.0, 2) and j.belief_factor == 1.2
    for n in LEVELS:
        assert j.belief.median.step_time(n) == pytest.approx(1 / n)
        assert j.belief.conservative.step_time(n) == pytest.approx(1.5 / n)
        assert j.belief_at is not None  # the promise under a larger factor: 1.8 / 1.2 slower
        assert j.belief_at(1.8).conservative.step_time(n) == pytest.approx(1.5 * 1.5 / n)
    assert (j.belief.knee, j.state) == (4, core_allocator.JobState())
    blind = job_input(BoardEntry("b", "cpu", job_to_dict(spec("b", 1000, 600))))
    assert blind.belief_factor is None and blind.belief.median.step_time(1) == float("inf")


def _b_arrives(c: Cluster) -> BoardAnswer:
    """a alone on 3 units; b arrives 10 s later needing 2: the allocator gives each 2."""
    c.add(spec("a", 1000, 600))
    first = c.submit("a", T0)
    assert first.mine is not None and first.mine.guaranteed and c.holds["a"] == 3
    assert first.allocation.verdicts["a"].kind == "guaranteed"
    c.run(10)
    c.add(spec("b", 1000, 600, at=T0 + 10))
    second = c.poll("b", T0 + 10)
    c.holds["b"] = 1  # submitted, it starts on the one unit that is free
    return second


def test_the_second_job_sees_the_first_and_the_first_gives_units_back(board: JobBoard) -> None:
    c = Cluster(board)
    second = _b_arrives(c)
    assert second.mine is not None and second.mine.guaranteed
    assert set(second.allocation.jobs) == {"a", "b"}  # it sees a
    assert second.capacity == CAPACITY
    assert "next to 1 guaranteed job(s)" in second.allocation.verdicts["b"].reason
    assert second.allocation.jobs["a"].units == 2 and second.mine.units == 2
    a = c.row("a", T0 + 10)  # b's step wrote the whole allocation, a's answer too ...
    assert a.target == 2 and a.heartbeat == T0 + 1  # ... but not a's heartbeat
    assert a.units == 3  # a holds what it holds until its own step acts
    assert c.step("b", T0 + 15) is Action.ON_TRACK  # 1 more needed, none free: it waits
    assert c.step("a", T0 + 20) is Action.SCALE_DOWN  # a's next poll gives it back
    assert c.holds["a"] == 2 and c.row("a", T0 + 20).target == 2
    actions = [c.step(name, T0 + t) for t, name in ((25, "b"), (30, "a"), (35, "b"), (40, "a"))]
    assert actions.count(Action.SCALE_UP) == 1 and Action.SCALE_DOWN not in actions
    assert c.holds == {"a": 2, "b": 2}  # b took it (every step checked nothing over-commits)
    assert [c.step(name, T0 + t) for t, name in ((45, "b"), (50, "a"))] == [Action.ON_TRACK] * 2


def test_the_behind_job_takes_the_units_given_back_at_its_next_poll(board: JobBoard) -> None:
    c = Cluster(board)
    _b_arrives(c)
    c.step("b", T0 + 15)
    assert c.step("a", T0 + 20) is Action.SCALE_DOWN
    assert c.step("b", T0 + 25) is Action.SCALE_UP


def test_a_finished_job_frees_its_units_for_the_next_allocation(board: JobBoard) -> None:
    c = Cluster(board)
    # a is believed twice as slow as it runs: its plan holds all 4 units for 500 s
    c.add(spec("a", 1000, 600), linear(2.0))
    c.submit("a", T0)
    assert c.holds["a"] == 4
    c.add(spec("b", 1000, 600))
    told = c.poll("b", T0 + 5)
    assert told.capacity == CAPACITY
    assert told.mine is not None and not told.mine.guaranteed and told.mine.units == 0
    assert told.allocation.verdicts["b"].kind == "best_effort"
    assert told.allocation.verdicts["b"].counter_offer is not None
    c.poll("b", T0 + 10)  # asked again, still no room: it asks next in a dwell period
    # a really runs at 4 steps per second: done at T0 + 250; its finish step frees the units
    c.done["a"], c.holds["a"] = 1000.0, 0
    finish_on_board(board, "a", now=T0 + 250)
    freed = c.poll("b", T0 + 255)
    assert freed.mine is not None and freed.mine.guaranteed  # asked again: a job ended
    assert freed.allocation.verdicts["b"].kind == "guaranteed"
    assert "a" not in freed.allocation.jobs and freed.capacity == CAPACITY
    assert freed.mine.units >= 3  # 1000 steps in 345 s - margin
    assert not c.row("a", T0 + 255).active


def test_a_rejected_job_leaves_the_board(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 1000, 300))  # needs all 4 units for 250 s
    c.submit("a", T0)
    assert c.holds["a"] == 4
    c.add(spec("r", 1000, 400, policy="reject"))
    answer = c.poll("r", T0 + 2)
    assert answer.capacity == CAPACITY
    assert answer.mine is None and answer.allocation.rejected == ("r",)
    assert answer.allocation.verdicts["r"].kind == "rejected"
    row = c.row("r", T0 + 2)
    assert not row.active and (row.units, row.target) == (0, 0)
    later = c.poll("a", T0 + 3)
    assert set(later.allocation.jobs) == {"a"} and later.allocation.rejected == ()
    assert later.mine is not None and later.mine.units == 4


def test_units_held_by_lower_classes_are_counted_for_preemption(board: JobBoard) -> None:
    with board.session(T0) as s:  # a best-effort job holding 3 units
        e = spec("e", 10**6, 3600)
        s.put(
            BoardEntry(
                "e",
                "cpu",
                {**job_to_dict(e), "best_effort": True},
                units=3,
                klass="qosflow-besteffort",
            )
        )
    c = Cluster(board)
    c.holds["e"] = 3  # the cluster: e holds 3, 1 is free
    c.add(spec("a", 1000, 300))
    answer = c.poll("a", T0 + 1)
    assert answer.mine is not None and answer.mine.guaranteed
    assert answer.held_below == 3
    assert answer.allocation.jobs["e"].units == 0  # the promise takes them


def test_plan_steps_at_the_same_instant_see_each_other(
    board: JobBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3
    barrier = threading.Barrier(n, timeout=0.5)
    real = core_allocator.allocate  # what the provider calls

    def meeting(cluster: Any) -> Any:  # meet the other steps inside, if they could get in
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return real(cluster)

    monkeypatch.setattr(provider, "allocate", meeting)
    url = board.store.url
    seen: dict[str, set[str]] = {}

    def plan(name: str) -> None:
        store = HistoryStore(url)
        try:
            c = Cluster(JobBoard(store, "team"))
            c.add(spec(name, 500, 600))
            seen[name] = set(c.poll(name, T0).allocation.jobs)
        finally:
            store.close()

    steps = [threading.Thread(target=plan, args=(f"j{i}",)) for i in range(n)]
    for t in steps:
        t.start()
    for t in steps:
        t.join(timeout=60)
    assert sorted(len(v) for v in seen.values()) == [1, 2, 3]  # one at a time, each sees more
    with board.session(T0) as s:
        rows = s.entries("cpu")
    assert sorted(e.job_id for e in rows) == ["j0", "j1", "j2"]
    assert all(e.guaranteed for e in rows)


def test_units_a_job_just_released_are_not_counted_twice(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 1000, 1200))
    c.holds["a"] = 3
    c.poll("a", T0)  # its row: 3 units held
    c.holds["a"] = 0  # its step paused it a moment later: the cluster has 4 free units
    c.add(spec("b", 1000, 300))
    answer = c.poll("b", T0 + 1)
    assert answer.capacity == CAPACITY


def test_units_a_job_just_started_on_are_counted(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 1000, 600))
    first = c.poll("a", T0)  # its plan step: a row with 0 units held, target 3
    assert first.mine is not None
    c.holds["a"] = first.mine.units  # submitted: it holds 3, its watch has not polled yet
    c.add(spec("b", 1000, 600, at=T0 + 1))
    answer = c.poll("b", T0 + 1)
    assert answer.capacity == CAPACITY
    assert answer.mine is not None and answer.mine.guaranteed


def test_the_plan_step_allocates_on_the_clusters_own_count_of_held_units(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 1000, 1200))
    c.holds["a"] = 3
    c.poll("a", T0)  # its row: 3 units held; then its step paused it
    c.holds["a"] = 0
    c.add(spec("b", 1000, 600, at=T0 + 1))
    paused = c.poll("b", T0 + 1, held_units=0, total_units=CAPACITY)
    assert paused.capacity == CAPACITY
    assert sum(j.units for j in paused.allocation.jobs.values()) <= CAPACITY
    c.holds["a"] = 3  # resumed, its row still says 3: a pending pod may hold nothing yet
    capped = c.poll("b", T0 + 2, held_units=3, total_units=CAPACITY)
    assert capped.capacity == CAPACITY


def test_a_job_the_cluster_shows_done_leaves_the_board_at_the_next_plan(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 1000, 300))
    c.submit("a", T0)
    c.add(spec("b", 1000, 600))
    assert c.poll("b", T0 + 2).allocation.jobs["a"].units == 4
    # a's workflow succeeded but its finish step has not run: its units are free
    c.holds["a"] = 0
    answer = c.poll("b", T0 + 100, ended=["a", "b"])  # its own id is never ended this way
    assert "a" not in answer.allocation.jobs and answer.mine is not None
    assert not c.row("a", T0 + 100).active and c.row("b", T0 + 100).active


def test_another_jobs_progress_counts_from_its_heartbeat_at_its_believed_speed(
    board: JobBoard,
) -> None:
    s = spec("a", 1000, 600)
    row = publish(BoardEntry("a", "cpu", job_to_dict(s), done=100.0, units=2), linear(), None)
    with board.session(T0) as session:
        session.put(row)
        back = session.get("a")
    assert back is not None
    assert job_input(back, T0 + 30).done == pytest.approx(160.0)  # 2 steps/s for 30 s
    assert job_input(back, T0 + 10_000).done == 1000.0  # never past its end
    assert job_input(back).done == 100.0  # as of its heartbeat when no time is given
    paused = publish(BoardEntry("p", "cpu", job_to_dict(s), done=100.0, units=0), linear(), None)
    with board.session(T0) as session:
        session.put(paused)
        waiting = session.get("p")
    assert waiting is not None
    assert job_input(waiting, T0 + 30).done == 100.0  # holding nothing, it has not moved


def test_a_job_admitted_in_another_jobs_step_stays_admitted_in_its_own(board: JobBoard) -> None:
    c = Cluster(board)
    c.add(spec("a", 600, 900))
    c.submit("a", T0)
    b = spec("b", 4000, 3600, at=T0 + 10)
    c.add(b)
    # b's row reaches the board without an allocation of its own (its step died after writing)
    with board.session(T0 + 10) as session:
        session.put(publish(BoardEntry("b", "cpu", job_to_dict(b)), linear(), None))
    answer = c.poll("a", T0 + 11)  # a's step admits every job the allocator has not seen
    assert "b" in answer.allocation.admitted
    assert c.row("b", T0 + 11).guaranteed  # written to b's row in a's transaction ...
    assert c.row("b", T0 + 11).heartbeat == T0 + 10  # ... without b's heartbeat
    own = c.poll("b", T0 + 12)
    assert own.mine is not None and own.mine.guaranteed  # b's own step does not re-decide it
    assert "b" not in own.allocation.admitted


def test_the_step_whose_profile_ladder_ends_is_told_so(board: JobBoard) -> None:
    """One node is one CPU here: the job climbs to 2 (half the cluster) and ends its ladder.

    It climbs because no size it may plan makes its deadline (100,000 steps at one a second
    take longer than its 60,000 s). The watch records the job's samples in its key's history
    when told (``profiled``).
    """
    s = spec("climber", 100_000, 60_000)
    s = replace(s, resources=replace(s.resources, per_node=1))
    one = TableCurve({n: 1.0 for n in LEVELS})  # measured on 1; past it, no faster yet
    before = Belief(one, one, LEVELS, 1, (1,), (1,))
    c = Cluster(board)
    c.add(s, before)
    c.holds["climber"] = 1
    first = c.poll("climber", T0)
    assert first.mine is not None and first.mine.units == 2 and first.mine.state.profiling
    assert not first.profiled
    c.holds["climber"] = 2
    two = TableCurve({n: 1.0 if n == 1 else 2.0 for n in LEVELS})  # 2 measured: twice as fast
    c.beliefs["climber"] = Belief(two, two, LEVELS, 2, (1, 2), (1, 2))
    second = c.poll("climber", T0 + 600)
    assert second.mine is not None and not second.mine.state.profiling
    assert second.profiled
    third = c.poll("climber", T0 + 660)
    assert not third.profiled  # told once


def test_the_board_keeps_each_jobs_first_ask_for_the_forecast(board: JobBoard) -> None:
    """Kept past the job's row: a job whose row expired and came back is one arrival, not two."""
    c = Cluster(board)
    c.add(spec("nightly", 1_000, 100_000))
    c.poll("nightly", T0)
    with board.session(T0 + 1) as session:
        (first,) = session.arrivals("cpu")
    assert first["name"] == "nightly" and first["remaining_steps"] == 1_000
    c.poll("nightly", T0 + HEARTBEAT_TTL_S + 60)  # its row expired: asked as a new job
    with board.session(T0 + HEARTBEAT_TTL_S + 61) as session:
        assert session.arrivals("cpu") == [first]
