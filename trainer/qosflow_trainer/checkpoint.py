r"""Checksummed, atomically written checkpoints, newest valid one first.

File ``ckpt-<step, 10 digits>.qfck`` = magic ``QOSFLOWCKPT1\\n`` + 8-byte little-endian payload
length + 32-byte SHA-256 of the payload + payload (an ``.npz`` of the arrays plus a ``__meta__``
JSON entry). It is written to a temporary file, fsynced, then ``os.replace``-d into place, so a
crash leaves either the old set or the new one. A torn or corrupted file (wrong magic, wrong
length, checksum mismatch, unreadable npz) is detected on load, and :meth:`CheckpointStore.latest`
falls back to the previous checkpoint and reports what it skipped.

A writer killed between creating its temporary file and the rename (SIGKILL, OOM kill, node
loss) leaves ``.ckpt-<step>.qfck.<pid>.tmp`` behind; nothing else would ever delete it, and a
pod that is killed over and over fills its volume with them.
:meth:`CheckpointStore.clean_stale_temps`, called when a run starts, removes those whose writer
cannot still be writing them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from qosflow_trainer.errors import TrainerError

MAGIC = b"QOSFLOWCKPT1\n"
SUFFIX = ".qfck"
_NAME = re.compile(r"^ckpt-(\d{10})\.qfck$")
_TEMP = re.compile(r"^\.ckpt-\d{10}\.qfck\.(\d+)\.tmp$")
STALE_TEMP_AGE_S = 600.0
"""A temporary file not modified for this long is stale whoever wrote it.

A checkpoint write takes well under a second; the bound covers a writer in another pid namespace
(another pod on a shared volume) whose pid happens to be alive here too.
"""
_HEADER = struct.Struct("<Q32s")
_META_KEY = "__meta__"

Arrays = Mapping[str, npt.NDArray[Any]]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One loaded checkpoint."""

    step: int
    arrays: dict[str, npt.NDArray[Any]]
    meta: dict[str, Any]
    path: Path


@dataclass(frozen=True, slots=True)
class Skipped:
    """A checkpoint file that failed validation, and why."""

    path: Path
    reason: str


@dataclass(frozen=True, slots=True)
class Latest:
    """The newest valid checkpoint (:meth:`CheckpointStore.latest`) and what was skipped."""

    checkpoint: Checkpoint | None
    skipped: tuple[Skipped, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Cleaned:
    """What :meth:`CheckpointStore.clean_stale_temps` did.

    Attributes:
        removed: The stale temporary files deleted.
        bytes: Their total size.
        failed: Stale files that could not be deleted, and why.
    """

    removed: tuple[Path, ...] = ()
    bytes: int = 0
    failed: tuple[Skipped, ...] = ()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists in this pid namespace.

    A process of another user counts as alive (``kill`` is refused, but it exists).
    """
    if pid <= 0:  # 0 and negatives address process groups, never one writer
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def encode(step: int, arrays: Arrays, meta: Mapping[str, Any]) -> bytes:
    """Serialise a checkpoint to bytes (header + checksummed npz payload)."""
    buf = io.BytesIO()
    blob = json.dumps({**meta, "step": step}, sort_keys=True).encode()
    entries: dict[str, Any] = {**arrays, _META_KEY: np.frombuffer(blob, dtype=np.uint8)}
    np.savez(buf, **entries)
    payload = buf.getvalue()
    return MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes, path: Path) -> Checkpoint:
    """Validate and deserialise checkpoint bytes.

    Raises:
        TrainerError: Naming the file, when it is torn or corrupt.
    """
    where = f"checkpoint {path.name}"
    if not data.startswith(MAGIC):
        raise TrainerError(where, "bad magic (not a qosflow checkpoint)")
    start = len(MAGIC) + _HEADER.size
    if len(data) < start:
        raise TrainerError(where, "truncated header")
    length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[start:]
    if len(payload) != length:
        raise TrainerError(where, f"torn: payload has {len(payload)} of {length} bytes")
    if hashlib.sha256(payload).digest() != digest:
        raise TrainerError(where, "checksum mismatch")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays.pop(_META_KEY).tobytes().decode())
    except (ValueError, KeyError, OSError) as exc:
        raise TrainerError(where, f"unreadable payload ({exc})") from exc
    return Checkpoint(step=int(meta["step"]), arrays=arrays, meta=meta, path=path)


class CheckpointStore:
    """The checkpoints of one run in one directory.

    Args:
        directory: Where checkpoints live (created on first save).
        keep: How many newest checkpoints to keep; older ones are deleted after each save.
    """

    def __init__(self, directory: Path, *, keep: int = 3) -> None:
        if keep < 1:
            raise TrainerError("keep_checkpoints", f"must be >= 1 (got {keep})")
        self.directory = directory
        self.keep = keep

    def path_for(self, step: int) -> Path:
        """File name of the checkpoint at ``step``."""
        return self.directory / f"ckpt-{step:010d}{SUFFIX}"

    def files(self) -> list[Path]:
        """Checkpoint files, newest (highest step) first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if _NAME.match(p.name)]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def save(self, step: int, arrays: Arrays, meta: Mapping[str, Any]) -> Path:
        """Write the checkpoint of ``step`` atomically and prune old ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path_for(step)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(encode(step, arrays, meta))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        self._fsync_dir()
        for old in self.files()[self.keep :]:
            old.unlink(missing_ok=True)
        return target

    def clean_stale_temps(
        self,
        *,
        now: float | None = None,
        max_age_s: float = STALE_TEMP_AGE_S,
        alive: Callable[[int], bool] = pid_alive,
    ) -> Cleaned:
        """Delete this store's temporary files that no live writer is writing.

        Only names of the form :meth:`save` writes (``.ckpt-<step>.qfck.<pid>.tmp``) are
        considered. One is stale when its pid is this process's own (call this before this
        process saves, i.e. when a run starts: a restarted container often gets its
        predecessor's pid), when no process has that pid, or when it was not modified for
        ``max_age_s`` seconds.

        Args:
            now: Wall-clock time in seconds (``time.time()`` when ``None``), compared with the
                files' modification times.
            max_age_s: Age after which a temporary file is stale even if its pid is alive.
            alive: Whether a pid is alive (:func:`pid_alive`; injectable for tests).

        Returns:
            The files removed, their total size and the stale ones that could not be removed.
        """
        if not self.directory.is_dir():
            return Cleaned()
        wall = time.time() if now is None else now
        removed: list[Path] = []
        failed: list[Skipped] = []
        total = 0
        for path in sorted(self.directory.iterdir()):
            match = _TEMP.match(path.name)
            if match is None:
                continue
            pid = int(match.group(1))
            try:
                stat = path.stat()
                if pid != os.getpid() and alive(pid) and wall - stat.st_mtime <= max_age_s:
                    continue
                path.unlink()
            except FileNotFoundError:  # gone meanwhile (its writer renamed it)
                continue
            except OSError as exc:
                failed.append(Skipped(path, exc.strerror or str(exc)))
                continue
            removed.append(path)
            total += stat.st_size
        return Cleaned(tuple(removed), total, tuple(failed))

    def load(self, path: Path) -> Checkpoint:
        """Load and validate one file (see :func:`decode`)."""
        return decode(path.read_bytes(), path)

    def latest(self) -> Latest:
        """The newest checkpoint that validates; invalid newer files are reported as skipped."""
        skipped: list[Skipped] = []
        for path in self.files():
            try:
                return Latest(self.load(path), tuple(skipped))
            except (TrainerError, OSError) as exc:
                skipped.append(Skipped(path, str(exc)))
        return Latest(None, tuple(skipped))

    def clear(self) -> int:
        """Delete every checkpoint file; returns how many were deleted."""
        files = self.files()
        for path in files:
            path.unlink(missing_ok=True)
        return len(files)

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
