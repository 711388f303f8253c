"""Command line and environment of ``python -m qosflow_trainer``.

Every option defaults from an environment variable, so an Argo template can configure the trainer
with ``env`` alone; a command-line flag wins over the variable. Each value is checked against its
option's rule (the trainer depends on numpy only, so no pydantic here) and any bad value becomes a
:class:`~qosflow_trainer.errors.TrainerError` naming the option and its variable.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from qosflow_trainer.errors import TrainerError
from qosflow_trainer.model import ModelShape
from qosflow_trainer.progress import PROGRESS_ENV


@dataclass(frozen=True, slots=True)
class Option:
    """One option: its flag, environment variable, default and help."""

    name: str
    env: str
    default: str | None
    help: str


OPTIONS: tuple[Option, ...] = (
    Option("total_steps", "QOSFLOW_TOTAL_STEPS", "1000", "total optimizer steps M"),
    Option("batch_size", "QOSFLOW_BATCH_SIZE", "1024", "examples per step"),
    Option("seed", "QOSFLOW_SEED", "0", "seed of data, teacher and initial weights"),
    Option("checkpoint_dir", "QOSFLOW_CHECKPOINT_DIR", ".qosflow/checkpoints", "checkpoint dir"),
    Option(
        "checkpoint_every", "QOSFLOW_CHECKPOINT_EVERY", "100", "checkpoint every K steps (0: off)"
    ),
    Option("resume", "QOSFLOW_RESUME", "auto", "auto | true | false"),
    Option("width", "QOSFLOW_WIDTH", "512", "hidden units per layer (step cost ~ width^2)"),
    Option("depth", "QOSFLOW_DEPTH", "3", "hidden layers"),
    Option("input_dim", "QOSFLOW_INPUT_DIM", "256", "input features"),
    Option("lr", "QOSFLOW_LR", "0.01", "learning rate"),
    Option("shards", "QOSFLOW_SHARDS", "8", "batch shards computed in parallel (max useful CPUs)"),
    Option("cpu_check_every", "QOSFLOW_CPU_CHECK_EVERY", "5", "re-read allowed CPUs every N steps"),
    Option("keep_checkpoints", "QOSFLOW_KEEP_CHECKPOINTS", "3", "checkpoints kept on disk"),
    Option(
        "log_every", "QOSFLOW_LOG_EVERY", "0", "JSON step event on stderr every N steps (0: off)"
    ),
    Option("progress_file", PROGRESS_ENV, None, "progress file (Argo sets it)"),
    Option("cgroup_cpu_max", "QOSFLOW_CGROUP_CPU_MAX", None, "cpu.max file to read (default: own)"),
)


ALIASES = {"total_steps": ("--steps",)}
_RESUME_WORDS = {
    "1": "true",
    "yes": "true",
    "on": "true",
    "0": "false",
    "no": "false",
    "off": "false",
}
Resume = Literal["auto", "true", "false"]


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """Validated trainer configuration (build it with :func:`parse_config` or :meth:`of`)."""

    total_steps: int
    batch_size: int
    seed: int
    checkpoint_dir: Path
    checkpoint_every: int
    resume: Resume
    width: int
    depth: int
    input_dim: int
    lr: float
    shards: int
    cpu_check_every: int
    keep_checkpoints: int
    log_every: int
    progress_file: Path | None = None
    cgroup_cpu_max: Path | None = None

    @classmethod
    def of(cls, **raw: Any) -> TrainerConfig:
        """Check every value against its rule (strings are parsed) and build the config.

        Raises:
            TrainerError: Naming the option and its variable, for the first invalid value.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TrainerError(unknown[0], "is not a trainer option")
        values: dict[str, Any] = {}
        for name in sorted(known):
            if name not in raw or raw[name] is None:
                if name in ("progress_file", "cgroup_cpu_max"):
                    values[name] = None
                    continue
                raise TrainerError(_label(name), "is required")
            values[name] = _check(name, raw[name])
        return cls(**values)

    @property
    def shape(self) -> ModelShape:
        """The model shape these options describe."""
        return ModelShape(input_dim=self.input_dim, width=self.width, depth=self.depth)

    def fingerprint(self) -> dict[str, int]:
        """What a checkpoint must match to be resumed by this configuration."""
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "width": self.width,
            "depth": self.depth,
            "input_dim": self.input_dim,
            "shards": self.shards,
        }


def _integer(low: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("must be an integer, not a boolean")
        try:
            number = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError("must be an integer") from None
        if number < low:
            raise ValueError(f"must be >= {low}")
        return number

    return parse


def _positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be a number") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError("must be a finite number > 0")
    return number


def _resume(value: Any) -> str:
    if value not in ("auto", "true", "false"):
        raise ValueError("must be one of auto, true, false")
    return str(value)


def _path(value: Any) -> Path:
    text = str(value)
    if not text.strip():
        raise ValueError("must be a non-empty path")
    return Path(text)


_RULES: dict[str, Callable[[Any], Any]] = {
    "total_steps": _integer(1),
    "batch_size": _integer(1),
    "seed": _integer(0),
    "checkpoint_dir": _path,
    "checkpoint_every": _integer(0),
    "resume": _resume,
    "width": _integer(1),
    "depth": _integer(1),
    "input_dim": _integer(1),
    "lr": _positive_float,
    "shards": _integer(1),
    "cpu_check_every": _integer(1),
    "keep_checkpoints": _integer(1),
    "log_every": _integer(0),
    "progress_file": _path,
    "cgroup_cpu_max": _path,
}


def _label(name: str) -> str:
    env = next((o.env for o in OPTIONS if o.name == name), "")
    return f"{name} ({env})" if env else name


def _check(name: str, value: Any) -> Any:
    try:
        return _RULES[name](value)
    except ValueError as exc:
        raise TrainerError(_label(name), f"{exc} (got {value!r})") from None


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (defaults are applied later, from the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m qosflow_trainer",
        description="qosflow reference trainer: numpy MLP on seeded synthetic data.",
        epilog="Exit codes: 0 done, 1 error, 2 bad configuration, 75 checkpointed on SIGTERM.",
    )
    for opt in OPTIONS:
        default = f" [default {opt.default}]" if opt.default is not None else ""
        flags = ["--" + opt.name.replace("_", "-"), *ALIASES.get(opt.name, ())]
        parser.add_argument(
            *flags,
            dest=opt.name,
            default=None,
            help=f"{opt.help}; env {opt.env}{default}",
        )
    parser.add_argument(
        "--ddp",
        action="store_true",
        help="train data-parallel with PyTorch DDP under torchrun (qosflow_trainer.ddp; needs "
        "the torch extra); --shards, --cpu-check-every, --cgroup-cpu-max keep their meaning",
    )
    return parser


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> TrainerConfig:
    """Merge flags over environment variables over defaults, then validate.

    Raises:
        TrainerError: Naming the option and its variable, for any invalid value.
    """
    args = vars(build_parser().parse_args(list(argv)))
    raw: dict[str, str] = {}
    for opt in OPTIONS:
        value = args.get(opt.name)
        if value is None:
            value = environ.get(opt.env) or opt.default
        if value is not None:
            if opt.name == "resume":
                value = value.strip().lower()
                value = _RESUME_WORDS.get(value, value)
            raw[opt.name] = value
    return TrainerConfig.of(**raw)
