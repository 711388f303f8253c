"""Checkpoint on SIGTERM, then exit with :data:`EXIT_CHECKPOINTED`.

Argo stops a workflow (and Kubernetes evicts or preempts a pod) by sending SIGTERM to the
container, then SIGKILL after the pod's grace period (30 s by default). qosflow rescales by
stop -> checkpoint -> resubmit with resume, so a training loop must turn SIGTERM into a checkpoint.

:func:`install_checkpoint_handler` does that: on SIGTERM it calls ``save_fn()`` and raises
``SystemExit(EXIT_CHECKPOINTED)``. A SIGTERM that arrives inside a
:meth:`CheckpointHandler.critical` block (an optimizer update, a checkpoint being written) is held
until the block ends, so the checkpoint never captures a half-updated model. A second SIGTERM
while saving is ignored.

Exit codes of the reference trainer (and the default here):

* ``0`` — finished all steps;
* ``1`` — unexpected error;
* ``2`` — bad configuration (usage error, or ``resume=true`` without a valid checkpoint);
* ``75`` (``EX_TEMPFAIL`` in ``sysexits.h``: "temporary failure, retry later") — stopped by
  SIGTERM **after** writing a checkpoint; resubmitting with resume continues from it. An exit by
  SIGKILL shows as 137 instead, so 75 proves the checkpoint was written.

Under ``python -m qosflow_trainer.launch`` (torchrun) the pod's exit code is the launcher's, and
torchrun reports a SIGTERM it forwarded as an error whatever its workers did. So a worker that
exits 75 after a checkpoint also leaves a mark in ``$QOSFLOW_STOPPED_DIR`` (set by the launcher;
:func:`mark_checkpointed_exit`), and the launcher exits 75 when every local worker did.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CHECKPOINTED = 75
STOPPED_DIR_ENV = "QOSFLOW_STOPPED_DIR"
"""Where a worker of ``qosflow_trainer.launch`` marks a checkpointed exit (one file per local rank)."""


def _mark_path(environ: Mapping[str, str]) -> Path | None:
    directory = environ.get(STOPPED_DIR_ENV)
    if not directory:
        return None
    return Path(directory) / f"local-rank-{environ.get('LOCAL_RANK', '0')}"


def mark_checkpointed_exit(environ: Mapping[str, str] | None = None) -> None:
    """Tell the launcher that this worker exits with :data:`EXIT_CHECKPOINTED` after a save.

    A no-op unless ``$QOSFLOW_STOPPED_DIR`` is set (``python -m qosflow_trainer.launch`` sets it).
    """
    path = _mark_path(os.environ if environ is None else environ)
    if path is not None:
        path.write_text(f"{EXIT_CHECKPOINTED}\n", encoding="ascii")


def clear_checkpointed_exit(environ: Mapping[str, str] | None = None) -> None:
    """Remove this worker's mark (a restarted worker has not checkpointed its own stop yet)."""
    path = _mark_path(os.environ if environ is None else environ)
    if path is not None:
        path.unlink(missing_ok=True)


_Handler = Callable[[int, FrameType | None], Any] | int | None


class CheckpointHandler:
    """Turns a stop signal into ``save_fn()`` + ``SystemExit(exit_code)``.

    Use :func:`install_checkpoint_handler` to create one. Attributes:
        requested: Whether a stop signal has arrived.
        exit_code: The exit status used after saving.
    """

    def __init__(
        self, save_fn: Callable[[], object], *, exit_code: int, signals: Sequence[int]
    ) -> None:
        self._save_fn = save_fn
        self.exit_code = exit_code
        self._signals = tuple(signals)
        self._depth = 0
        self._saving = False
        self.requested = False
        self._armed = True
        self._previous: dict[int, _Handler] = {}

    def install(self) -> None:
        """Register the signal handlers (must run in the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("install_checkpoint_handler must be called from the main thread")
        clear_checkpointed_exit()
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Restore the handlers that were registered before :meth:`install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def disarm(self) -> None:
        """Ignore stop signals from now on (e.g. while writing the final result of a run)."""
        self._armed = False

    @contextmanager
    def critical(self) -> Iterator[None]:
        """Hold a stop signal until the block ends (blocks may nest)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.requested and self._armed and not self._saving:
            self._save_and_exit()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._armed:
            return
        self.requested = True
        if self._depth == 0 and not self._saving:
            self._save_and_exit()

    def _save_and_exit(self) -> None:
        self._saving = True
        self._save_fn()
        if self.exit_code == EXIT_CHECKPOINTED:
            mark_checkpointed_exit()
        raise SystemExit(self.exit_code)


def install_checkpoint_handler(
    save_fn: Callable[[], object],
    *,
    exit_code: int = EXIT_CHECKPOINTED,
    signals: Sequence[int] = (signal.SIGTERM,),
) -> CheckpointHandler:
    """On SIGTERM, call ``save_fn()`` then exit with ``exit_code`` (75 by default).

    Wrap each optimizer step in ``with handler.critical():`` so the save happens between steps.
    ``save_fn`` must finish within the pod's termination grace period.

    Args:
        save_fn: Writes a checkpoint of the current state.
        exit_code: Exit status after a successful save.
        signals: Signals to handle (default SIGTERM only; SIGINT keeps raising KeyboardInterrupt).

    Returns:
        The installed handler; ``handler.requested`` tells whether a stop was asked for.
    """
    handler = CheckpointHandler(save_fn, exit_code=exit_code, signals=signals)
    handler.install()
    return handler
