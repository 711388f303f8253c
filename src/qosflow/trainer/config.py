"""Command line and environment of ``python -m qosflow.trainer``.

Every option defaults from an environment variable, so an Argo template can configure the trainer
with ``env`` alone; a command-line flag wins over the variable. Values are validated by a pydantic
model and any bad value becomes a :class:`~qosflow.trainer.errors.TrainerError` naming the option and its
variable.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qosflow.trainer.errors import TrainerError
from qosflow.trainer.model import ModelShape
from qosflow.trainer.progress import PROGRESS_ENV


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


class TrainerConfig(BaseModel):
    """Validated trainer configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    checkpoint_dir: Path
    checkpoint_every: int = Field(ge=0)
    resume: Literal["auto", "true", "false"]
    width: int = Field(ge=1)
    depth: int = Field(ge=1)
    input_dim: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    shards: int = Field(ge=1)
    cpu_check_every: int = Field(ge=1)
    keep_checkpoints: int = Field(ge=1)
    log_every: int = Field(ge=0)
    progress_file: Path | None = None
    cgroup_cpu_max: Path | None = None

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


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (defaults are applied later, from the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m qosflow.trainer",
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
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        env = next((o.env for o in OPTIONS if o.name == name), "")
        got = raw.get(name)
        raise TrainerError(f"{name} ({env})", f"{err['msg']} (got {got!r})") from None
