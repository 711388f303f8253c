"""``python -m qosflow_trainer --ddp``: the reference trainer, data-parallel with PyTorch DDP.

One process per rank, started by torchrun (``python -m qosflow_trainer.launch`` in each worker pod
builds the torchrun command). It trains the numpy trainer's optimisation (same data, weights,
loss and momentum SGD; :mod:`qosflow_trainer.ddp_model` says how the batch is split) with gloo on
CPUs, NCCL when CUDA is available, and the numpy trainer's options and variables
(``QOSFLOW_TOTAL_STEPS``, ``QOSFLOW_CHECKPOINT_DIR``, ``QOSFLOW_CHECKPOINT_EVERY``,
``QOSFLOW_RESUME``, ``--width``, ...). Without torchrun's ``RANK``/``WORLD_SIZE`` it runs as a
world of one.

* **Threads**: each process uses ``allowed_cpus() // LOCAL_WORLD_SIZE`` threads (at least 1) and
  re-reads the budget every ``cpu_check_every`` steps, so one thread per worker on a 2-core
  machine is one pod of 1 CPU per worker.
* **Checkpoints**: global rank 0 alone writes them (the numpy trainer's checksummed ``.qfck``
  files: weights, momentum buffers, step, fingerprint; temporary file, fsync, rename) to the
  checkpoint directory, which must be one volume shared by every pod; every ``checkpoint_every``
  steps and when the ranks stop. Every rank resumes from the newest valid one, at any world size:
  the ranks check that they all found the same step.
* **Stopping**: SIGTERM (torchrun's agent forwards it to its workers) or SIGINT only sets a flag.
  Before each step the ranks all-reduce their flags, so all of them stop at the same step even
  when only one pod was told to; rank 0 saves that step, all wait for the save, and all exit
  ``75``. Nothing trained is lost; a SIGKILL loses at most ``checkpoint_every`` steps.
* **Progress**: global rank 0 alone reports ``N/M`` to ``$ARGO_PROGRESS_FILE``
  (:func:`~qosflow_trainer.report_progress`, every step, rate-limited), ``M/M`` at the end.
* **Events**: every rank writes JSON lines to stderr, each with ``rank`` and ``world_size``:
  ``start`` (``step``, ``total``, ``threads``, ``backend``), ``resume`` (``step``, ``path``,
  ``from_world_size``), ``skipped_checkpoint``, ``checkpoint`` (rank 0), ``threads``, ``step``
  (every ``log_every`` steps, with this rank's share of the batch loss), ``stopped`` and ``done``
  (``steps``, the final evaluation ``loss``). Rank 0 also writes the final ``done`` or ``stopped``
  line on stdout and ``done`` to ``<checkpoint_dir>/result.json``, as the numpy trainer does.

Exit codes: ``0`` done, ``1`` unexpected error (e.g. a peer died), ``2`` bad configuration or
PyTorch missing, ``75`` stopped after rank 0's checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from qosflow_trainer.checkpoint import Checkpoint, CheckpointStore
from qosflow_trainer.config import TrainerConfig, parse_config
from qosflow_trainer.cpus import CpuFollower, allowed_cpus
from qosflow_trainer.ddp_model import (
    batch_parts,
    build_model,
    load_momentum,
    rank_batch,
    rank_parts,
    scaled_loss,
    to_arrays,
)
from qosflow_trainer.errors import TrainerError, missing_torch
from qosflow_trainer.job import RESULT_FILE, emit
from qosflow_trainer.model import Task, init_params, loss
from qosflow_trainer.preemption import (
    EXIT_CHECKPOINTED,
    EXIT_OK,
    EXIT_USAGE,
    clear_checkpointed_exit,
    mark_checkpointed_exit,
)
from qosflow_trainer.progress import report_progress

if TYPE_CHECKING:
    from qosflow_trainer.model import Params

MOMENTUM = 0.9
_WORLD_DEFAULTS = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


@dataclass(frozen=True, slots=True)
class World:
    """Where this process stands in the job: torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_*``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    launched: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> World:
        """Read torchrun's variables; without ``RANK`` this is a world of one process.

        Raises:
            TrainerError: Naming the variable, when one is not a valid number.
        """
        if "RANK" not in environ:
            return cls()
        values: dict[str, int] = {}
        for name, default in _WORLD_DEFAULTS.items():
            text = environ.get(name, default)
            try:
                values[name] = int(text)
            except ValueError:
                raise TrainerError(name, f"must be an integer (got {text!r})") from None
        if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
            raise TrainerError("RANK", f"must be in [0, WORLD_SIZE) (got {values})")
        if not 0 <= values["LOCAL_RANK"] < values["LOCAL_WORLD_SIZE"]:
            raise TrainerError("LOCAL_RANK", f"must be in [0, LOCAL_WORLD_SIZE) (got {values})")
        return cls(
            rank=values["RANK"],
            world_size=values["WORLD_SIZE"],
            local_rank=values["LOCAL_RANK"],
            local_world_size=values["LOCAL_WORLD_SIZE"],
            launched=True,
        )


class StopFlag:
    """SIGTERM and SIGINT set :attr:`requested`; the ranks act on it at a step boundary."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> StopFlag:
        """Register the handlers (main thread only); returns ``self``."""
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous handlers."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


@dataclass(slots=True)
class _State:
    step: int
    model: Any  # the DDP-wrapped model
    optimizer: Any
    saved_step: int = -1


class DdpJob:
    """One rank of the data-parallel reference run.

    Args:
        config: Validated options (the numpy trainer's).
        world: This process's rank and world.
        stop: The stop flag (installed before PyTorch loads, so an early SIGTERM is not lost).
        stdout: Where rank 0's final JSON line goes.
        stderr: Where every rank's event lines go.
        clock: Monotonic clock (seconds) for timings.
    """

    def __init__(
        self,
        config: TrainerConfig,
        world: World,
        stop: StopFlag,
        *,
        stdout: TextIO = sys.stdout,
        stderr: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.world = world
        self.stop = stop
        self.stdout = stdout
        self.stderr = stderr
        self.clock = clock
        self.store = CheckpointStore(config.checkpoint_dir, keep=config.keep_checkpoints)
        self.task = Task(config.shape, config.seed)
        parts = batch_parts(config.batch_size, config.shards)
        self.parts = rank_parts(parts, world.world_size, world.rank)
        self.device: Any = None
        self._progress_failed = False

    @property
    def leader(self) -> bool:
        """Whether this is global rank 0 (checkpoints, progress, result)."""
        return self.world.rank == 0

    def _emit(self, event: str, **fields: Any) -> None:
        emit(self.stderr, event, rank=self.world.rank, world_size=self.world.world_size, **fields)

    def run(self) -> int:
        """Join the process group, resume, train to ``total_steps`` or a stop; the exit code."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise missing_torch("python -m qosflow_trainer --ddp") from None
        backend = self._init_process_group(torch, dist)
        try:
            started = self.clock()
            ckpt = self._agreed_checkpoint(torch, dist)
            state = self._build(torch, ckpt)
            follower = self._follower(torch)
            self._emit(
                "start",
                step=state.step,
                total=self.config.total_steps,
                seed=self.config.seed,
                threads=follower.threads,
                backend=backend,
                local_rank=self.world.local_rank,
                pid=os.getpid(),
            )
            self._progress(state.step, force=True)
            if self._loop(torch, dist, state, follower):
                return self._stopped(dist, state)
            return self._finish(dist, state, ckpt, started)
        finally:
            dist.destroy_process_group()

    def _init_process_group(self, torch: Any, dist: Any) -> str:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(self.world.local_rank)
            self.device = torch.device("cuda", self.world.local_rank)
        else:
            self.device = torch.device("cpu")
        if self.world.launched:  # env://: torchrun set MASTER_ADDR, MASTER_PORT, RANK, ...
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return backend

    def _agreed_checkpoint(self, torch: Any, dist: Any) -> Checkpoint | None:
        """The checkpoint to resume from; every rank reads it and all must find the same step."""
        cfg = self.config
        if self.leader:
            self._clean_temps()
            if cfg.resume == "false" and (removed := self.store.clear()):
                self._emit("discarded", checkpoints=removed)
        dist.barrier()
        ckpt = None if cfg.resume == "false" else self._newest()
        step = ckpt.step if ckpt is not None else 0
        seen = torch.tensor([step, -step], dtype=torch.int64, device=self.device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        high, low = int(seen[0]), -int(seen[1])
        if (high, low) != (step, step):
            raise TrainerError(
                "checkpoint_dir (QOSFLOW_CHECKPOINT_DIR)",
                f"the ranks found different newest checkpoints (steps {low} to {high}): "
                "it must be one volume shared by every worker pod",
            )
        if ckpt is not None:
            self._emit(
                "resume",
                step=ckpt.step,
                path=str(ckpt.path),
                from_world_size=ckpt.meta.get("world_size"),
            )
        return ckpt

    def _newest(self) -> Checkpoint | None:
        cfg = self.config
        latest = self.store.latest()
        for skip in latest.skipped:
            self._emit("skipped_checkpoint", path=str(skip.path), reason=skip.reason)
        ckpt = latest.checkpoint
        if ckpt is None:
            if cfg.resume == "true":
                raise TrainerError(
                    "resume (QOSFLOW_RESUME)", f"no valid checkpoint in {cfg.checkpoint_dir}"
                )
            return None
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
        return ckpt

    def _clean_temps(self) -> None:
        cleaned = self.store.clean_stale_temps()
        if cleaned.removed or cleaned.failed:
            fields: dict[str, Any] = {"files": len(cleaned.removed), "bytes": cleaned.bytes}
            if cleaned.failed:
                fields["failed"] = [f"{s.path.name}: {s.reason}" for s in cleaned.failed]
            self._emit("cleaned_temp", **fields)

    def _build(self, torch: Any, ckpt: Checkpoint | None) -> _State:
        from torch.nn.parallel import DistributedDataParallel

        cfg = self.config
        params: Params = ckpt.arrays if ckpt is not None else init_params(cfg.shape, cfg.seed)
        model = build_model(cfg.shape, params, device=self.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=MOMENTUM)
        if ckpt is not None:
            load_momentum(model, optimizer, params)
        cuda = self.device.type == "cuda"
        ddp = DistributedDataParallel(model, device_ids=[self.world.local_rank] if cuda else None)
        step = ckpt.step if ckpt is not None else 0
        return _State(step, ddp, optimizer, saved_step=step if ckpt is not None else -1)

    def _follower(self, torch: Any) -> CpuFollower:
        share = self.world.local_world_size
        cpu_max = self.config.cgroup_cpu_max
        follower = CpuFollower(
            reader=lambda: max(1, allowed_cpus(cpu_max=cpu_max) // share),
            apply=torch.set_num_threads,
        )
        follower.check()
        return follower

    def _loop(self, torch: Any, dist: Any, state: _State, follower: CpuFollower) -> bool:
        """Train until ``total_steps``; ``True`` when the ranks agreed to stop first."""
        cfg = self.config
        flag = torch.zeros(1, dtype=torch.int64, device=self.device)
        while state.step < cfg.total_steps:
            flag.fill_(1 if self.stop.requested else 0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag.item()):
                return True
            if state.step % cfg.cpu_check_every == 0 and (n := follower.check()) is not None:
                self._emit("threads", step=state.step, threads=n)
            share = self._train_step(torch, state)
            state.step += 1
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                self._save(state)
            self._progress(state.step)
            if cfg.log_every and state.step % cfg.log_every == 0:
                self._emit("step", step=state.step, loss_share=share, t=self.clock())
        return False

    def _train_step(self, torch: Any, state: _State) -> float:
        cfg = self.config
        x, y = rank_batch(self.task, state.step, cfg.batch_size, cfg.shards, self.parts)
        xt = torch.from_numpy(x).to(self.device)
        yt = torch.from_numpy(y).to(self.device)
        state.optimizer.zero_grad(set_to_none=True)
        value = scaled_loss(
            state.model(xt), yt, batch_size=cfg.batch_size, world_size=self.world.world_size
        )
        torch.autograd.backward(value)
        state.optimizer.step()
        return float(value.item()) / self.world.world_size

    def _save(self, state: _State) -> Path:
        path = self.store.path_for(state.step)
        if self.leader and state.saved_step != state.step:
            meta = {**self.config.fingerprint(), "world_size": self.world.world_size}
            arrays = to_arrays(state.model.module, state.optimizer)
            path = self.store.save(state.step, arrays, {**meta, "trainer": "ddp"})
            state.saved_step = state.step
            self._emit("checkpoint", step=state.step, path=str(path))
        return path

    def _progress(self, step: int, *, force: bool = False) -> None:
        target = self.config.progress_file
        if not self.leader or target is None:
            return
        try:
            report_progress(step, self.config.total_steps, path=target, **_forced(force))
        except OSError as exc:
            if not self._progress_failed:
                self._progress_failed = True
                self._emit("progress_error", error=str(exc))

    def _stopped(self, dist: Any, state: _State) -> int:
        path = self._save(state)
        dist.barrier()  # exit 75 only once rank 0's checkpoint is on disk
        self._emit("stopped", step=state.step, checkpoint=str(path))
        if self.leader:
            self._progress(state.step, force=True)
            emit(self.stdout, "stopped", steps=state.step, checkpoint=str(path))
        mark_checkpointed_exit()
        return EXIT_CHECKPOINTED

    def _finish(self, dist: Any, state: _State, ckpt: Checkpoint | None, started: float) -> int:
        cfg = self.config
        self._save(state)
        arrays = to_arrays(state.model.module, state.optimizer)
        result: dict[str, Any] = {
            "steps": state.step,
            "loss": loss(arrays, self.task.eval_x, self.task.eval_y),
            "seed": cfg.seed,
            "resumed_from": ckpt.step if ckpt is not None else None,
            "seconds": round(self.clock() - started, 3),
            "world_size": self.world.world_size,
        }
        if self.leader:
            self._progress(state.step, force=True)
            cfg.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"event": "done", **result}, sort_keys=True)
            (cfg.checkpoint_dir / RESULT_FILE).write_text(line + "\n")
            emit(self.stdout, "done", **result)
        self._emit("done", **{k: v for k, v in result.items() if k != "world_size"})
        dist.barrier()
        return EXIT_OK


def _forced(force: bool) -> dict[str, float]:
    return {"min_interval": 0.0} if force else {}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options (the numpy trainer's), run this rank, return the exit code."""
    stop = StopFlag().install()  # before PyTorch loads: a SIGTERM meanwhile is acted on later
    clear_checkpointed_exit()
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
        world = World.from_env(os.environ)
        if world.rank == 0:
            (config.checkpoint_dir / RESULT_FILE).unlink(missing_ok=True)
        return DdpJob(config, world, stop).run()
    except TrainerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    finally:
        stop.uninstall()


if __name__ == "__main__":
    sys.exit(main())
