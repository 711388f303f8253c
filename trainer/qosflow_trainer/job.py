"""One run of the reference trainer: resume, train, follow the CPU budget, checkpoint, report.

Output contract (stable: the local cluster, the Argo templates and the tests rely on it):

* ``$ARGO_PROGRESS_FILE`` holds ``N/M`` — written at start, at least every second while running
  (a heartbeat thread covers slow steps) and ``M/M`` at the end.
* **stdout** gets exactly one JSON line when the run ends: ``{"event": "done", "steps": M,
  "loss": ...}`` (also written to ``<checkpoint_dir>/result.json``) or ``{"event": "stopped",
  "steps": N, "checkpoint": ...}`` after a SIGTERM.
* **stderr** gets JSON event lines: ``cleaned_temp`` (stale temporary checkpoint files of killed
  writers, removed at start), ``start``, ``resume`` (with skipped corrupt files),
  ``threads`` (whenever the thread pool is resized), ``checkpoint``, ``step`` every
  ``log_every`` steps and, while a progress file is set, ``usage`` every few seconds (the CPU
  time the process got against the time it waited for a CPU: :mod:`qosflow_trainer.usage`).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from qosflow_trainer.checkpoint import CheckpointStore
from qosflow_trainer.config import TrainerConfig
from qosflow_trainer.cpus import CpuFollower
from qosflow_trainer.errors import TrainerError
from qosflow_trainer.model import Params, Task, init_params, loss, train_step
from qosflow_trainer.preemption import EXIT_CHECKPOINTED, EXIT_OK, install_checkpoint_handler
from qosflow_trainer.progress import ProgressFile
from qosflow_trainer.usage import UsageMeter
from qosflow_trainer.workers import WorkerPool

RESULT_FILE = "result.json"


def one_blas_thread() -> Any:
    """Limit the loaded BLAS/OpenMP pools to one thread each; their threadpoolctl controller.

    ``None`` without threadpoolctl (``qosflow-trainer`` depends on numpy only): the limit then
    comes from :data:`qosflow_trainer.cpus.BLAS_THREAD_VARIABLES`, which ``python -m
    qosflow_trainer`` sets before numpy loads.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    controller = ThreadpoolController()
    controller.limit(limits=1)
    return controller


def emit(stream: TextIO, event: str, **fields: Any) -> None:
    """Write one JSON event line and flush."""
    stream.write(json.dumps({"event": event, **fields}, sort_keys=True) + "\n")
    stream.flush()


@dataclass(slots=True)
class _State:
    step: int
    params: Params
    saved_step: int = -1


class TrainingJob:
    """The reference training run for one configuration.

    Args:
        config: Validated options.
        stdout: Where the final JSON line goes.
        stderr: Where event lines go.
        clock: Monotonic clock (seconds) for progress rate limiting and timings.
    """

    def __init__(
        self,
        config: TrainerConfig,
        *,
        stdout: TextIO = sys.stdout,
        stderr: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.stdout = stdout
        self.stderr = stderr
        self.clock = clock
        self.store = CheckpointStore(config.checkpoint_dir, keep=config.keep_checkpoints)
        self.task = Task(config.shape, config.seed)
        self._progress_failed = False
        self.workers = WorkerPool(1)
        blas = one_blas_thread()  # one BLAS thread per worker: see qosflow_trainer.workers
        self.follower = CpuFollower(
            cpu_max=config.cgroup_cpu_max, controller=blas, apply=self.workers.resize
        )

    def _clean_temps(self) -> None:
        cleaned = self.store.clean_stale_temps()
        if cleaned.removed or cleaned.failed:
            fields: dict[str, Any] = {"files": len(cleaned.removed), "bytes": cleaned.bytes}
            if cleaned.failed:
                fields["failed"] = [f"{s.path.name}: {s.reason}" for s in cleaned.failed]
            emit(self.stderr, "cleaned_temp", **fields)

    def _start_state(self) -> tuple[_State, int | None]:
        cfg = self.config
        if cfg.resume == "false":
            removed = self.store.clear()
            if removed:
                emit(self.stderr, "discarded", checkpoints=removed)
            return _State(0, init_params(cfg.shape, cfg.seed)), None
        latest = self.store.latest()
        for skip in latest.skipped:
            emit(self.stderr, "skipped_checkpoint", path=str(skip.path), reason=skip.reason)
        ckpt = latest.checkpoint
        if ckpt is None:
            if cfg.resume == "true":
                raise TrainerError(
                    "resume (QOSFLOW_RESUME)", f"no valid checkpoint in {cfg.checkpoint_dir}"
                )
            return _State(0, init_params(cfg.shape, cfg.seed)), None
        stored = {k: ckpt.meta.get(k) for k in cfg.fingerprint()}
        if stored != cfg.fingerprint():
            raise TrainerError(
                "checkpoint_dir (QOSFLOW_CHECKPOINT_DIR)",
                f"{ckpt.path.name} belongs to another run ({stored} != {cfg.fingerprint()})",
            )
        if ckpt.step > cfg.total_steps:
            raise TrainerError(
                "total_steps (QOSFLOW_TOTAL_STEPS)",
                f"checkpoint is at step {ckpt.step}, beyond {cfg.total_steps}",
            )
        emit(self.stderr, "resume", step=ckpt.step, path=str(ckpt.path))
        return _State(ckpt.step, ckpt.arrays, saved_step=ckpt.step), ckpt.step

    def _save(self, state: _State) -> Path:
        path = self.store.path_for(state.step)
        if state.saved_step != state.step:
            path = self.store.save(state.step, state.params, self.config.fingerprint())
            state.saved_step = state.step
            emit(self.stderr, "checkpoint", step=state.step, path=str(path))
        return path

    def _progress_error(self, exc: OSError) -> None:
        if not self._progress_failed:
            self._progress_failed = True
            emit(self.stderr, "progress_error", error=str(exc))

    def _follow_cpus(self, step: int) -> None:
        threads = self.follower.check()
        if threads is not None:
            emit(
                self.stderr,
                "threads",
                step=step,
                threads=threads,
                workers=self.workers.threads,
                blas=self.follower.pool_sizes(),
            )

    def run(self) -> int:
        """Train to ``total_steps`` (or until SIGTERM) and return the exit code."""
        cfg = self.config
        self._clean_temps()
        state, resumed_from = self._start_state()
        (cfg.checkpoint_dir / RESULT_FILE).unlink(missing_ok=True)  # exists iff this run finished
        started = self.clock()
        emit(self.stderr, "start", step=state.step, total=cfg.total_steps, seed=cfg.seed)
        progress = ProgressFile(
            cfg.progress_file, cfg.total_steps, clock=self.clock, on_error=self._progress_error
        )
        progress.update(state.step, force=True)
        meter = UsageMeter(stream=self.stderr) if cfg.progress_file is not None else None

        def on_stop() -> None:
            path = self._save(state)
            progress.update(state.step, force=True)
            emit(self.stdout, "stopped", steps=state.step, checkpoint=str(path))

        handler = install_checkpoint_handler(on_stop, signals=(signal.SIGTERM, signal.SIGINT))
        try:
            with progress.heartbeat(1.0):
                self._loop(state, progress, handler.critical, meter)
            handler.disarm()  # finishing now: a late SIGTERM must not cut the result short
            return self._finish(state, progress, resumed_from, started)
        except SystemExit as exc:
            if exc.code == EXIT_CHECKPOINTED:
                return EXIT_CHECKPOINTED
            raise
        finally:
            handler.uninstall()
            self.workers.close()

    def _finish(
        self, state: _State, progress: ProgressFile, resumed_from: int | None, started: float
    ) -> int:
        cfg = self.config
        self._save(state)
        progress.update(state.step, force=True)
        result: dict[str, Any] = {
            "steps": state.step,
            "loss": loss(state.params, self.task.eval_x, self.task.eval_y),
            "seed": cfg.seed,
            "resumed_from": resumed_from,
            "seconds": round(self.clock() - started, 3),
        }
        cfg.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (cfg.checkpoint_dir / RESULT_FILE).write_text(
            json.dumps({"event": "done", **result}, sort_keys=True) + "\n"
        )
        emit(self.stdout, "done", **result)
        return EXIT_OK

    def _loop(
        self,
        state: _State,
        progress: ProgressFile,
        critical: Callable[[], Any],
        meter: UsageMeter | None,
    ) -> None:
        cfg = self.config
        while state.step < cfg.total_steps:
            with critical():
                if state.step % cfg.cpu_check_every == 0 or self.follower.threads == 0:
                    self._follow_cpus(state.step)
                batch_loss = train_step(
                    state.params,
                    self.task,
                    state.step,
                    cfg.batch_size,
                    lr=cfg.lr,
                    shards=cfg.shards,
                    mapper=self.workers,
                )
                state.step += 1
                if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                    self._save(state)
            progress.update(state.step)
            if meter is not None:
                meter.tick(state.step)
            if cfg.log_every and state.step % cfg.log_every == 0:
                emit(
                    self.stderr,
                    "step",
                    step=state.step,
                    loss=batch_loss,
                    threads=self.follower.threads,
                    t=self.clock(),
                )
