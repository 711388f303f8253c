"""Progress reporting in Argo's self-reported format: ``N/M`` lines in ``$ARGO_PROGRESS_FILE``.

Argo's executor reads the **last non-empty line** of the file and ignores values that are not
``N/M`` with ``0 <= N <= M`` and ``M > 0``. Every write here replaces the whole file atomically
(write a temporary file in the same directory, then ``os.replace``), so a reader never sees an
empty or half-written file.

:class:`ProgressFile` rate-limits writes (an injected clock makes that testable) and can keep a
heartbeat thread that rewrites the latest value, so the file is refreshed at least every
``interval`` seconds even when one training step takes longer than that.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from qosflow_trainer.errors import TrainerError
from qosflow_trainer.usage import UsageMeter

PROGRESS_ENV = "ARGO_PROGRESS_FILE"
_PROGRESS = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def format_progress(done: int, total: int) -> str:
    """Render one progress line, validating it as Argo would.

    Args:
        done: Steps done, ``0 <= done <= total``.
        total: Total steps, ``> 0``.

    Returns:
        ``"done/total"`` followed by a newline.

    Raises:
        TrainerError: When the pair is not a valid Argo progress value.
    """
    if total <= 0:
        raise TrainerError("progress.total", f"must be > 0 (got {total})")
    if not 0 <= done <= total:
        raise TrainerError("progress.done", f"must be in [0, {total}] (got {done})")
    return f"{done}/{total}\n"


def parse_progress(text: str) -> tuple[int, int] | None:
    """Parse progress text as Argo does: the last non-empty line, ``N/M`` with ``0 <= N <= M > 0``.

    Returns:
        ``(N, M)``, or ``None`` when the text holds no valid value.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    match = _PROGRESS.match(lines[-1])
    if match is None:
        return None
    done, total = int(match.group(1)), int(match.group(2))
    return (done, total) if 0 <= done <= total and total > 0 else None


def write_progress(path: Path, done: int, total: int) -> None:
    """Atomically replace ``path`` with the single line ``done/total``.

    The temporary file lives in the same directory (``os.replace`` is atomic only within one
    file system) and carries the writer's pid and thread id, so concurrent writers never share it.
    """
    line = format_progress(done, total)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(line)
    os.replace(tmp, path)


class ProgressFile:
    """Rate-limited, thread-safe progress writer for one run.

    Args:
        path: The progress file, or ``None`` to report nowhere (e.g. outside Argo).
        total: Total steps ``M``.
        min_interval: Minimum seconds between two writes of :meth:`update` (``force`` skips it).
        clock: Monotonic clock in seconds (inject a fake one in tests).
        on_error: Called with the ``OSError`` when a write fails (e.g. the directory vanished);
            by default the error propagates. A training job passes a logger so that a progress
            hiccup never kills the training.
    """

    def __init__(
        self,
        path: Path | None,
        total: int,
        *,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        format_progress(0, total)
        self._on_error = on_error
        self.path = path
        self.total = total
        self.min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._latest = 0
        self._last_write: float | None = None
        self.writes = 0

    @property
    def latest(self) -> int:
        """The latest value given to :meth:`update`."""
        return self._latest

    def update(self, done: int, *, force: bool = False) -> bool:
        """Record ``done`` and write it when forced, at 0 or M, or when ``min_interval`` passed.

        Returns:
            Whether the file was written.
        """
        format_progress(done, self.total)
        with self._lock:
            self._latest = done
            now = self._clock()
            due = (
                force
                or done in (0, self.total)
                or self._last_write is None
                or now - self._last_write >= self.min_interval
            )
            if due:
                self._write_locked(now)
            return due

    def flush(self) -> None:
        """Write the latest value now."""
        with self._lock:
            self._write_locked(self._clock())

    def _write_locked(self, now: float) -> None:
        self._last_write = now
        if self.path is None:
            return
        try:
            write_progress(self.path, self._latest, self.total)
        except OSError as exc:
            if self._on_error is None:
                raise
            self._on_error(exc)
            return
        self.writes += 1

    @contextmanager
    def heartbeat(self, interval: float) -> Iterator[None]:
        """Rewrite the latest value every ``interval`` seconds while the block runs."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval):
                self.flush()

        thread = threading.Thread(target=beat, name="qosflow-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


_reporters: dict[tuple[Path, int], ProgressFile] = {}
_reporters_lock = threading.Lock()
_meter: UsageMeter | None = None


def report_progress(
    done: int, total: int, *, path: str | os.PathLike[str] | None = None, min_interval: float = 0.5
) -> bool:
    """Report ``done`` of ``total`` steps to Argo; cheap enough to call every step.

    Writes ``done/total`` atomically to ``path`` (default: ``$ARGO_PROGRESS_FILE``; nothing happens
    when neither is set). Writes at most every ``min_interval`` seconds, except that the first
    value, 0 and ``total`` are always written. While it reports to a file it also writes a usage
    line to standard error every few seconds (:class:`~qosflow_trainer.usage.UsageMeter`): how
    much of its CPU allocation the process got, so a size is not judged by a window in which
    something else held its CPUs.

    Args:
        done: Steps done so far.
        total: Total steps.
        path: Progress file; defaults to the ``ARGO_PROGRESS_FILE`` environment variable.
        min_interval: Minimum seconds between writes.

    Returns:
        Whether the file was written.

    Raises:
        TrainerError: When ``done``/``total`` is not a valid progress value.
    """
    target = path if path is not None else os.environ.get(PROGRESS_ENV)
    if not target:
        format_progress(done, total)
        return False
    global _meter
    key = (Path(target), total)
    with _reporters_lock:
        reporter = _reporters.get(key)
        if reporter is None:
            reporter = ProgressFile(key[0], total, min_interval=min_interval)
            _reporters[key] = reporter
        if _meter is None:
            _meter = UsageMeter()
        meter = _meter
    reporter.min_interval = min_interval
    written = reporter.update(done)
    meter.tick(done)
    return written
