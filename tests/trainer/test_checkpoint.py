from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow_trainer.checkpoint import (
    MAGIC,
    STALE_TEMP_AGE_S,
    CheckpointStore,
    Cleaned,
    decode,
    encode,
    pid_alive,
)
from qosflow_trainer.errors import TrainerError

ARRAYS = {"w0": np.arange(12.0).reshape(3, 4), "b0": np.array([1.5, -2.0])}
BLOB = encode(7, ARRAYS, {"seed": 3})


def test_roundtrip_keeps_arrays_step_and_meta(tmp_path: Path) -> None:
    ckpt = decode(BLOB, tmp_path / "x")
    assert ckpt.step == 7 and ckpt.meta["seed"] == 3
    assert set(ckpt.arrays) == {"w0", "b0"}
    np.testing.assert_array_equal(ckpt.arrays["w0"], ARRAYS["w0"])


@settings(max_examples=60)
@given(cut=st.integers(min_value=0, max_value=len(BLOB) - 1))
def test_any_truncation_is_detected(cut: int) -> None:
    with pytest.raises(TrainerError, match="checkpoint x"):
        decode(BLOB[:cut], Path("x"))


@settings(max_examples=60)
@given(pos=st.integers(min_value=len(MAGIC), max_value=len(BLOB) - 1), bit=st.integers(0, 7))
def test_any_bit_flip_after_the_magic_is_detected(pos: int, bit: int) -> None:
    data = bytearray(BLOB)
    data[pos] ^= 1 << bit
    with pytest.raises(TrainerError):
        decode(bytes(data), Path("x"))


def test_bad_magic_is_rejected() -> None:
    with pytest.raises(TrainerError, match="bad magic"):
        decode(b"PK\x03\x04" + BLOB[4:], Path("x"))


def test_latest_falls_back_past_corrupt_files_and_reports_them(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5)
    for step in (10, 20, 30):
        store.save(step, ARRAYS, {"seed": 3})
    newest = store.path_for(30)
    newest.write_bytes(newest.read_bytes()[:-5])
    middle = store.path_for(20)
    data = bytearray(middle.read_bytes())
    data[-1] ^= 0xFF
    middle.write_bytes(bytes(data))
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 10
    assert [s.path for s in latest.skipped] == [newest, middle]
    assert "torn" in latest.skipped[0].reason and "checksum" in latest.skipped[1].reason


def test_no_valid_checkpoint_gives_none(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "absent").latest().checkpoint is None
    store = CheckpointStore(tmp_path)
    store.path_for(5).write_bytes(b"junk")
    latest = store.latest()
    assert latest.checkpoint is None and len(latest.skipped) == 1


def test_save_is_atomic_keeps_newest_and_ignores_foreign_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    (tmp_path / "notes.txt").write_text("keep me")
    for step in (1, 2, 3, 12):
        store.save(step, ARRAYS, {})
    assert [p.name for p in store.files()] == ["ckpt-0000000012.qfck", "ckpt-0000000003.qfck"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".qfck") == ["notes.txt"]
    assert store.clear() == 2 and store.files() == []


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="keep_checkpoints"):
        CheckpointStore(tmp_path, keep=0)


def _dead_pid() -> int:
    """A pid no process can have: one above the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def _temp(store: CheckpointStore, step: int, pid: int, size: int = 100) -> Path:
    store.directory.mkdir(parents=True, exist_ok=True)
    path = store.directory / f".{store.path_for(step).name}.{pid}.tmp"
    path.write_bytes(b"x" * size)
    return path


def test_stale_temps_of_dead_writers_are_removed_live_ones_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(5, ARRAYS, {})
    dead = _temp(store, 10, _dead_pid(), size=300)
    own = _temp(store, 11, os.getpid(), size=20)  # a restarted container's reused pid
    live = _temp(store, 12, os.getppid())
    old_live = _temp(store, 13, os.getppid(), size=7)
    os.utime(old_live, (old_live.stat().st_mtime - STALE_TEMP_AGE_S - 1,) * 2)
    foreign = [tmp_path / ".notes.123.tmp", tmp_path / f".ckpt-1.qfck.{_dead_pid()}.tmp"]
    for path in foreign:
        path.write_text("not ours")
    cleaned = store.clean_stale_temps()
    assert cleaned.removed == (dead, own, old_live) and cleaned.bytes == 327
    assert cleaned.failed == ()
    assert live.exists() and all(p.exists() for p in foreign)
    assert [p.step for p in map(store.load, store.files())] == [5]


def test_stale_temp_age_uses_the_given_clock_and_alive_check(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = _temp(store, 1, 4242)
    mtime = path.stat().st_mtime
    assert store.clean_stale_temps(now=mtime + 59, max_age_s=60, alive=lambda _: True).removed == ()
    assert store.clean_stale_temps(now=mtime + 61, max_age_s=60, alive=lambda _: True).removed == (
        path,
    )
    assert CheckpointStore(tmp_path / "absent").clean_stale_temps() == Cleaned()


def test_pid_alive() -> None:
    assert pid_alive(os.getpid()) and pid_alive(os.getppid())
    assert not pid_alive(_dead_pid())
    assert not pid_alive(0) and not pid_alive(-1) and not pid_alive(2**80)
