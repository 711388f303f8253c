"""The job board in the shared store: rows, the lock that serialises writers, the timeouts.

Every test runs against SQLite and against the PostgreSQL server (``store_url``); time is the
``now`` each session is opened with, so no test waits for a timeout to pass.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from qosflow.store.board import FINISHED_TTL_S, HEARTBEAT_TTL_S, BoardEntry, JobBoard
from qosflow.store.history import HistoryStore

NOW = 1_800_000_000.0
CAPACITY = 4


def entry(job_id: str, *, submitted: float = NOW, unit: str = "cpu", **kw: Any) -> BoardEntry:
    spec = {
        "name": job_id,
        "submitted_at": submitted,
        "resources": {"unit": unit, "levels": [1, 2]},
    }
    return BoardEntry(job_id=job_id, unit=unit, spec=spec, **kw)


@pytest.fixture
def store(store_url: str) -> Iterator[HistoryStore]:
    s = HistoryStore(store_url)
    yield s
    s.close()


def ids(board: JobBoard, now: float, unit: str = "cpu") -> list[str]:
    with board.session(now) as s:
        return [e.job_id for e in s.entries(unit)]


def test_a_row_round_trips_and_each_board_sees_only_its_namespace(store: HistoryStore) -> None:
    board, other = JobBoard(store, "team-a"), JobBoard(store, "team-b")
    full = entry(
        "late",
        submitted=NOW + 5,
        done=123.5,
        units=2,
        target=4,
        klass="qosflow-high",
        guaranteed=True,
        reason="guaranteed; minimal share 2; 4 units (qosflow-high)",
        belief={"levels": [1, 2], "median": [1.0, None], "knee": 1, "factor": 1.15},
        state={"seen": True, "guaranteed": True, "floor": 1.15, "asked_at": None},
        overhead_s=12.5,
        heartbeat=1.0,  # stamped with the session's time on the way in
    )
    with board.session(NOW) as s:
        s.put(full)
        s.put(entry("early", submitted=NOW - 5))
        s.put(entry("gpu-job", unit="gpu"))
    with other.session(NOW) as s:
        s.put(entry("late", units=1))
    with board.session(NOW + 1) as s:
        assert s.get("late") == replace(full, heartbeat=NOW)
        assert s.get("missing") is None
        assert [e.job_id for e in s.entries("cpu")] == ["early", "late"]  # arrival order
        assert [e.job_id for e in s.entries("gpu")] == ["gpu-job"]
        assert all(e.active for e in s.entries("cpu"))
    with other.session(NOW + 1) as s:
        assert [(e.job_id, e.units) for e in s.entries("cpu")] == [("late", 1)]


def test_a_put_replaces_the_row_and_renews_its_heartbeat(store: HistoryStore) -> None:
    board = JobBoard(store, "ns")
    with board.session(NOW) as s:
        s.put(entry("a", units=1, target=2))
    with board.session(NOW + 30) as s:
        s.put(replace(s.get("a") or entry("a"), units=2, done=50.0))
    with board.session(NOW + 31) as s:
        (row,) = s.entries("cpu")
        assert (row.units, row.target, row.done, row.heartbeat) == (2, 2, 50.0, NOW + 30)


def test_a_session_that_fails_writes_nothing(store: HistoryStore) -> None:
    board = JobBoard(store, "ns")
    with pytest.raises(RuntimeError), board.session(NOW) as s:
        s.put(entry("a", target=2))
        raise RuntimeError("the step failed after writing")
    assert ids(board, NOW) == []


def test_a_finished_job_frees_its_units_and_stays_a_while(store: HistoryStore) -> None:
    board = JobBoard(store, "ns")
    with board.session(NOW) as s:
        s.put(entry("a", units=3, target=3, guaranteed=True))
    with board.session(NOW + 10) as s:
        s.finish("a")
        s.finish("never-there")  # nothing to do
    with board.session(NOW + 20) as s:
        row = s.get("a")
        assert row is not None and not row.active
        assert (row.finished_at, row.units, row.target, row.guaranteed) == (NOW + 10, 0, 0, True)
        s.finish("a")  # finishing again keeps the first end
    with board.session(NOW + 30) as s:
        assert (s.get("a") or entry("x")).finished_at == NOW + 10


def test_a_job_whose_run_died_leaves_the_board_after_the_heartbeat_ttl(store: HistoryStore) -> None:
    board = JobBoard(store, "ns")
    with board.session(NOW) as s:
        s.put(entry("dead", units=2, target=2))
        s.put(entry("alive", units=2, target=2))
        s.put(entry("paused", units=0, target=0, guaranteed=True))  # stopped, still counts
    with board.session(NOW + HEARTBEAT_TTL_S / 2) as s:  # the live ones' steps keep writing
        for job_id in ("alive", "paused"):
            s.put(s.get(job_id) or entry(job_id))
    assert ids(board, NOW + HEARTBEAT_TTL_S) == ["alive", "dead", "paused"]  # not stale yet
    later = NOW + HEARTBEAT_TTL_S + 1
    assert ids(board, later) == ["alive", "paused"]
    with board.session(later) as s:
        paused = s.get("paused")
        assert paused is not None and paused.active and paused.guaranteed
    assert ids(board, NOW + 1.5 * HEARTBEAT_TTL_S + 1) == []  # nobody wrote since


def test_a_finished_row_outlives_the_heartbeat_ttl_and_leaves_after_its_own(
    store: HistoryStore,
) -> None:
    assert FINISHED_TTL_S > HEARTBEAT_TTL_S
    board = JobBoard(store, "ns")
    with board.session(NOW) as s:
        s.put(entry("a", units=1))
        s.finish("a")
    assert ids(board, NOW + HEARTBEAT_TTL_S + 1) == ["a"]  # waiting jobs still learn it ended
    assert ids(board, NOW + FINISHED_TTL_S) == ["a"]
    assert ids(board, NOW + FINISHED_TTL_S + 1) == []


# --------------------------------------------------------------------------- writers at once


def _step(url: str, job_id: str, barrier: threading.Barrier, seen: dict[str, int]) -> None:
    store = HistoryStore(url)
    try:
        board = JobBoard(store, "ns")
        with board.session(NOW) as s:
            taken = sum(e.target for e in s.entries("cpu") if e.active)
            # meet the other steps inside if they could get in: the lock lets one in at a time
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
            seen[job_id] = taken
            s.put(entry(job_id, target=min(2, CAPACITY - taken)))
    finally:
        store.close()


def test_steps_deciding_at_the_same_instant_take_turns(store_url: str) -> None:
    HistoryStore(store_url).close()
    barrier = threading.Barrier(3, timeout=0.5)
    seen: dict[str, int] = {}
    steps = [threading.Thread(target=_step, args=(store_url, n, barrier, seen)) for n in "abc"]
    for t in steps:
        t.start()
    for t in steps:
        t.join(timeout=60)
    assert sorted(seen.values()) == [0, 2, 4]  # each saw what the ones before it took
    store = HistoryStore(store_url)
    try:
        with JobBoard(store, "ns").session(NOW) as s:
            targets = sorted(e.target for e in s.entries("cpu"))
    finally:
        store.close()
    assert targets == [0, 2, 2]


ROUNDS = 25
WRITER = """
import json, sys
from qosflow.store.board import BoardEntry, JobBoard
from qosflow.store.history import HistoryStore

url, job_id, rounds, capacity, now = sys.argv[1:3] + [int(a) for a in sys.argv[3:5]] + [float(sys.argv[5])]
store = HistoryStore(url)
board = JobBoard(store, "ns")
print("ready", flush=True)
sys.stdin.readline()  # every writer starts at once
over = 0
for i in range(rounds):
    want = 0 if i % 2 else 1 + i % 3  # take some, give them back, take again
    with board.session(now) as s:  # read, decide, write, as a step does
        taken = sum(e.target for e in s.entries("cpu") if e.active)
        over += taken > capacity
        mine = max(0, min(want, capacity - taken))
        s.put(BoardEntry(job_id, "cpu", {"name": job_id, "submitted_at": now}, target=mine))
store.close()
print(json.dumps({"job": job_id, "over": over}), flush=True)
"""


@pytest.mark.slow
def test_writer_processes_at_once_never_give_out_more_than_the_capacity(store_url: str) -> None:
    HistoryStore(store_url).close()
    n = 3
    # plain interpreters (only the store imported): they start fast, and none inherits a lock
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                store_url,
                f"j{i}",
                str(ROUNDS),
                str(CAPACITY),
                str(NOW),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * n, [err for _, err in outs]
    got = sorted((json.loads(out)["job"], json.loads(out)["over"]) for out, _ in outs)
    assert got == [(f"j{i}", 0) for i in range(n)]  # no writer ever saw more than the capacity
    store = HistoryStore(store_url)
    try:
        with JobBoard(store, "ns").session(NOW) as s:
            rows = s.entries("cpu")
    finally:
        store.close()
    assert sorted(e.job_id for e in rows) == [f"j{i}" for i in range(n)]
    assert sum(e.target for e in rows) <= CAPACITY
