"""History store: round trips, idempotent records, two concurrent writer processes, prior, calibration."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qosflow.core.errors import SpecError
from qosflow.core.predict import DEFAULT_FACTOR, calibrate
from qosflow.core.speed import ProgressSample, SpeedModel
from qosflow.store.history import HistoryError, HistoryStore

WRITES = 400  # transactions per writer process
BATCH = 4  # samples per transaction


def stream(
    model: SpeedModel, units: int, steps: int, rng: np.random.Generator, start: float
) -> list[ProgressSample]:
    """A progress stream at ``units`` with 3 % lognormal step-time noise, one sample per 10 steps."""
    t, out = start, [ProgressSample(start, 0, units)]
    for done in range(10, steps + 1, 10):
        t += 10 * model.step_time(units) * float(rng.lognormal(0.0, 0.03))
        out.append(ProgressSample(t, done, units))
    return out


def test_samples_round_trip_newest_first_limit_and_isolation(store_url: str) -> None:
    store = HistoryStore(store_url)
    rows = [ProgressSample(float(i), 10 * i, 2) for i in range(50)]
    store.record_samples("nightly", "cpu", rows)
    store.record_samples("nightly", "gpu", rows[:5])
    store.record_samples("other", "cpu", rows[:7])
    assert store.samples("nightly", "cpu") == rows
    assert store.samples("nightly", "cpu", limit=3) == rows[-3:]
    assert len(store.samples("nightly", "gpu")) == 5
    assert store.count_samples("other") == 7
    assert store.samples("missing", "cpu") == []


def test_a_multi_pod_size_is_recorded_as_pods_times_units(store_url: str) -> None:
    store = HistoryStore(store_url)
    rows = [ProgressSample(0.0, 0, 8), ProgressSample(9.0, 90, 16, pods=2)]
    store.record_samples("ddp", "gpu", rows)
    assert [(s.units, s.pods) for s in store.samples("ddp", "gpu")] == [(8, 1), (16, 2)]


def test_recording_the_same_samples_twice_stores_them_once(store_url: str) -> None:
    store = HistoryStore(store_url)
    rows = [ProgressSample(float(i), i, 1) for i in range(20)]
    store.record_samples("k", "cpu", rows)
    store.record_samples("k", "cpu", [*rows[10:], ProgressSample(99.0, 99, 1)])
    assert store.count_samples("k") == 21


def test_a_users_timing_is_kept_per_key_and_size_newest_first_and_replaced(
    store_url: str,
) -> None:
    store = HistoryStore(store_url)
    store.record_timing("bert", "gpu", units=8, step_seconds=5.2, at=100.0)
    store.record_timing("bert", "gpu", units=16, step_seconds=3.1, at=200.0)
    store.record_timing("bert", "cpu", units=8, step_seconds=9.0, at=300.0)
    store.record_timing("other", "gpu", units=8, step_seconds=1.0, at=400.0)
    assert [(m.units, m.step_time, m.windows) for m in store.timings("bert", "gpu")] == [
        (16, 3.1, 1),
        (8, 5.2, 1),
    ]
    store.record_timing("bert", "gpu", units=8, step_seconds=4.9, at=500.0)  # timed again
    assert [(m.units, m.step_time) for m in store.timings("bert", "gpu")] == [(8, 4.9), (16, 3.1)]
    assert store.timings("missing", "gpu") == []


def test_calibration_uses_the_logged_pairs(tmp_path: Path) -> None:
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    assert store.calibration("k").factor == DEFAULT_FACTOR
    rng = np.random.default_rng(7)
    pairs = [(100.0, float(100.0 * r)) for r in rng.lognormal(0.05, 0.1, size=60)]
    for p, r in pairs:
        store.record_prediction("k", p, r)
    store.record_prediction("other", 100.0, 500.0)
    assert store.predictions("k") == pairs
    got = store.calibration("k")
    assert got == calibrate(pairs)
    assert got.n == 60


def test_prior_fits_the_stored_samples(tmp_path: Path) -> None:
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    assert store.prior("k", "cpu", node_size=8) is None
    truth = SpeedModel(0.02, 0.8, 0.05, 0.0, 0.0, 8)
    rng = np.random.default_rng(3)
    for night, units in enumerate((1, 2, 4)):  # three nightly runs at different sizes
        store.record_samples("k", "cpu", stream(truth, units, 2000, rng, 86_400.0 * night))
    prior = store.prior("k", "cpu", node_size=8)
    assert prior is not None
    for units in (1, 2, 4):
        assert prior.step_time(units) == pytest.approx(truth.step_time(units), rel=0.05)


def test_two_runs_that_overlapped_in_time_are_both_learnt_from(tmp_path: Path) -> None:
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    truth = SpeedModel(0.02, 0.8, 0.05, 0.0, 0.0, 8)
    rng = np.random.default_rng(4)
    # two runs of the key side by side (two DAG runs the same night), at the same and at
    # another size: ordered by time their samples would interleave into nonsense
    store.record_samples("k", "cpu", stream(truth, 2, 2000, rng, 1000.0))
    store.record_samples("k", "cpu", stream(truth, 2, 2000, rng, 1003.0))
    store.record_samples("k", "cpu", stream(truth, 4, 2000, rng, 1005.0))
    laid = store.history("k", "cpu")
    assert [s.steps_done for s in laid] == [s.steps_done for s in store.samples("k", "cpu")]
    assert all(b.time > a.time for a, b in itertools.pairwise(laid))
    prior = store.prior("k", "cpu", node_size=8)
    assert prior is not None
    for units in (2, 4):
        assert prior.step_time(units) == pytest.approx(truth.step_time(units), rel=0.05)


def test_in_memory_url_keeps_one_database() -> None:
    store = HistoryStore("sqlite://")
    store.record_samples("k", "cpu", [ProgressSample(1.0, 1, 1)])
    store.record_prediction("k", 1.0, 1.0)
    assert store.count_samples() == 1
    assert store.predictions("k") == [(1.0, 1.0)]


def test_a_bad_url_is_a_spec_error_and_a_missing_driver_a_history_error() -> None:
    with pytest.raises(SpecError, match=r"history\.url"):
        HistoryStore("not a url")
    with pytest.raises(HistoryError, match="nosuchdriver") as err:
        HistoryStore("postgresql+nosuchdriver://user:secret@db.example/qosflow")
    assert "secret" not in str(err.value)


def _writer(url: str, key: str, barrier: Any, spans: Any) -> None:
    store = HistoryStore(url)
    barrier.wait()
    start = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes on Linux
    for i in range(WRITES):
        batch = [ProgressSample(float(i * BATCH + j), i * BATCH + j, 1 + j) for j in range(BATCH)]
        store.record_samples(key, "cpu", batch)
        store.record_prediction(key, float(i + 1), float(i + 2))
    spans.put((start, time.monotonic()))
    store.close()


@pytest.mark.slow
def test_two_writer_processes_lose_no_row(store_url: str) -> None:
    url = store_url
    # no store is opened here: both writers create the tables at the same time
    # forkserver, not fork: a child forked from this (threaded, Airflow-importing) test process
    # can inherit a lock held by another thread and hang; the barrier still starts both at once
    ctx = mp.get_context("forkserver")
    barrier, spans = ctx.Barrier(2, timeout=120), ctx.Queue()  # a writer that dies frees the other
    procs = [ctx.Process(target=_writer, args=(url, key, barrier, spans)) for key in ("a", "b")]
    for p in procs:
        p.start()
    got = [spans.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert max(s for s, _ in got) < min(e for _, e in got), "the writers did not overlap"
    store = HistoryStore(url)
    for key in ("a", "b"):
        assert store.count_samples(key) == WRITES * BATCH
        assert len(store.predictions(key)) == WRITES
    assert store.samples("a", "cpu", limit=3) == [
        ProgressSample(float(WRITES * BATCH - 3 + j), WRITES * BATCH - 3 + j, 2 + j)
        for j in range(3)
    ]


def test_a_retried_prediction_record_is_stored_once(store_url: str) -> None:
    store = HistoryStore(store_url)
    store.record_prediction("job", 100.0, 110.0)
    store.record_prediction("job", 100.0, 110.0)
    store.record_prediction("job", 100.0, 120.0)
    assert store.predictions("job") == [(100.0, 110.0), (100.0, 120.0)]


BLOCK = {
    "kind": "guaranteed",
    "deadline": 1_800_003_600.0,
    "margin": 60.0,
    "levels": [1, 2],
    "step_time": [1.0, 0.6],
    "total_steps": 100,
    "unit": "gpu",
}


def test_the_promise_ledger_records_renews_and_lets_promises_lapse(store_url: str) -> None:
    from qosflow.store.ledger import PROMISE_TTL_S

    store = HistoryStore(store_url)
    try:
        with store.promise_ledger(1000.0) as ledger:
            assert ledger.pending("gpu") == {}
            ledger.record("a", "gpu", BLOCK)
            ledger.record("b", "cpu", BLOCK)
        with store.promise_ledger(1000.0 + PROMISE_TTL_S / 2) as ledger:
            assert ledger.pending("gpu") == {"a": BLOCK}  # per unit kind
            ledger.record("a", "gpu", {**BLOCK, "total_steps": 50})  # a retried plan renews
        with store.promise_ledger(1000.0 + PROMISE_TTL_S + 1.0) as ledger:
            assert ledger.pending("gpu")["a"]["total_steps"] == 50  # renewed: not lapsed yet
            assert ledger.pending("cpu") == {}  # "b" lapsed
        with pytest.raises(RuntimeError), store.promise_ledger(2000.0) as ledger:
            ledger.record("c", "gpu", BLOCK)
            raise RuntimeError("the plan failed after recording")
        with store.promise_ledger(2000.0) as ledger:
            assert "c" not in ledger.pending("gpu")  # nothing of a failed plan is kept
    finally:
        store.close()


def _plan_step(url: str, name: str, barrier: threading.Barrier, seen: dict[str, list[str]]) -> None:
    store = HistoryStore(url)
    try:
        with store.promise_ledger(1000.0) as ledger:
            pending = sorted(ledger.pending("gpu"))
            # meet the other plan step inside if it could get in; the ledger lets one in at a time
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
            seen[name] = pending
            if not pending:  # the cluster has room for one promise
                ledger.record(name, "gpu", BLOCK)
    finally:
        store.close()


def test_two_plan_steps_at_the_same_instant_cannot_both_promise(store_url: str) -> None:
    url = store_url
    HistoryStore(url).close()
    barrier = threading.Barrier(2, timeout=1.0)
    seen: dict[str, list[str]] = {}
    steps = [threading.Thread(target=_plan_step, args=(url, n, barrier, seen)) for n in "ab"]
    for t in steps:
        t.start()
    for t in steps:
        t.join(timeout=60)
    assert sorted(seen) == ["a", "b"]
    first, second = sorted(seen, key=lambda n: len(seen[n]))
    assert seen[first] == [] and seen[second] == [first]  # the second saw the first's promise
    store = HistoryStore(url)
    try:
        with store.promise_ledger(1000.0) as ledger:
            assert sorted(ledger.pending("gpu")) == [first]
    finally:
        store.close()


def test_a_database_of_an_older_qosflow_gains_the_share_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the samples table as qosflow 0.1 made it
        db.execute(
            "CREATE TABLE qosflow_samples (id INTEGER PRIMARY KEY, key VARCHAR(253) NOT NULL, "
            "unit VARCHAR(16) NOT NULL, time FLOAT NOT NULL, steps_done INTEGER NOT NULL, "
            "units INTEGER NOT NULL)"
        )
        db.execute("INSERT INTO qosflow_samples VALUES (1, 'k', 'cpu', 1.0, 5, 2)")
    store = HistoryStore(f"sqlite:///{path}")
    store.record_samples("k", "cpu", [ProgressSample(2.0, 9, 2, 0.61)])
    assert store.samples("k", "cpu") == [ProgressSample(1.0, 5, 2), ProgressSample(2.0, 9, 2, 0.61)]
    HistoryStore(f"sqlite:///{path}").close()  # opening it again changes nothing


def test_a_folder_that_cannot_be_created_is_a_history_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("a regular file, so no folder can be made under it")
    with pytest.raises(HistoryError, match=r"file\.txt/sub/h\.db.*cannot create folder") as err:
        HistoryStore(f"sqlite:///{tmp_path / 'file.txt' / 'sub' / 'h.db'}")
    assert "Not a directory" in str(err.value)
    with pytest.raises(HistoryError, match=r"cannot create folder .*file\.txt'?: it is a file"):
        HistoryStore(f"sqlite:///{tmp_path / 'file.txt' / 'h.db'}")


@pytest.mark.skipif(
    not Path("/sys/kernel").is_dir(), reason="needs sysfs, where even root cannot mkdir"
)
def test_a_permission_error_on_the_folder_is_a_history_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="cannot create folder '/sys/qosflow-no-such") as err:
        HistoryStore("sqlite:////sys/qosflow-no-such/sub/h.db")
    assert isinstance(err.value.__context__, OSError)  # EPERM for root, EACCES for others


def test_an_unwritable_folder_and_a_folder_as_database_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(HistoryError, match=r"dir\.db'?: not a regular file"):
        HistoryStore(f"sqlite:///{tmp_path / 'dir.db'}")
    import qosflow.store.history as history

    # root may write any folder, so the answer of the permission check is what is faked here
    monkeypatch.setattr(history.os, "access", lambda *_a, **_k: False)
    with pytest.raises(HistoryError, match=r"cannot write folder .*: permission denied"):
        HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")


def test_a_sqlite_url_with_a_password_is_a_spec_error_without_it() -> None:
    with pytest.raises(SpecError, match=r"history\.url") as err:
        HistoryStore("sqlite://user:secret@host/h.db")
    assert "secret" not in str(err.value)


def _filled(path: Path) -> bytes:
    store = HistoryStore(f"sqlite:///{path}")
    store.record_samples("k", "cpu", [ProgressSample(float(i), i, 1) for i in range(300)])
    store.close()  # the last connection checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path.read_bytes()


def test_a_byte_flipped_database_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    data = bytearray(_filled(path))
    size = int.from_bytes(data[16:18], "big")
    leaves = [p * size for p in range(1, len(data) // size) if data[p * size] == 0x0D]
    page = max(leaves, key=lambda at: int.from_bytes(data[at + 3 : at + 5], "big"))  # most cells
    data[page + 8] ^= 0xFF  # the high byte of its first cell pointer: now off the page
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match=r"h\.db'?: the database is corrupt") as err:
        HistoryStore(f"sqlite:///{path}")
    assert "out of range" in str(err.value)


def test_a_database_with_a_damaged_header_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    data = bytearray(_filled(path))
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match="corrupt or not a SQLite database") as err:
        HistoryStore(f"sqlite:///{path}")
    assert "file is not a database" in str(err.value)
    (tmp_path / "ok.db").write_bytes(_filled(tmp_path / "ok.db"))
    assert HistoryStore(f"sqlite:///{tmp_path / 'ok.db'}").count_samples("k") == 300
