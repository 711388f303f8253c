"""Job specifications: pydantic at the boundary, frozen dataclasses inside.

A user states *when* a training run must be done (``deadline``) and the elastic range of units it
may use; qosflow picks the size. ``load_job`` turns YAML/JSON (or dicts) into the frozen
:class:`JobSpec` the core computes on (a cluster's spec: :mod:`qosflow.core.cluster_spec`).
Every invalid input raises :class:`~qosflow.core.errors.SpecError` naming the field path and the
rule (a misspelt field as unknown, with the field it resembles: :mod:`qosflow.core.field_errors`).

Beyond each field's shape, a spec is refused when it makes no sense as a whole: a checkpoint
interval longer than the job (no checkpoint before the end), a margin as long as the time to the
deadline, and (:meth:`qosflow.core.cluster_spec.ClusterSpec.refusal`) resources the cluster it
is planned on cannot give.
The forms a deadline takes (``PT4H``, ``"06:00"``, zone names) are :mod:`qosflow.core.deadline`'s.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from qosflow.core.deadline import deadline_form, resolve_deadline, zone
from qosflow.core.deadline import parse_iso_duration as parse_iso_duration
from qosflow.core.errors import SpecError
from qosflow.core.field_errors import StrictModel, as_mapping, spec_error
from qosflow.core.layout import Layout, PodResource, layout
from qosflow.core.pod import Checkpoint, PodDefaults, PodSettings, checkpoint_problem, with_defaults
from qosflow.core.pod_model import CheckpointModel, PodModel
from qosflow.core.quantity import parse_quantity as parse_quantity
from qosflow.core.words import duration

Unit = Literal["cpu", "gpu", "worker"]
IfNotGuaranteed = Literal["run_best_effort", "reject"]
Launcher = Literal["none", "torchrun"]
PYTHONS = ("python", "python3")
DEFAULT_PER_NODE = 8
"""Units per node when a spec does not say (the speed model's node boundary)."""
DEFAULT_CHECKPOINT_EVERY = 500
"""Steps between checkpoints when a spec does not say (or the job's end, if it comes sooner)."""

_RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# --------------------------------------------------------------------------- frozen core types


@dataclass(frozen=True, slots=True)
class Resources:
    """The elastic range of a job.

    Attributes:
        unit: What a unit is: a CPU core, a GPU or a worker replica.
        levels: Allowed sizes in units, ascending.
        per_node: Units per node; the speed model's node boundary (1 for workers: each is a pod).
        memory_per_unit: Memory per unit (per worker pod) as a Kubernetes quantity (``2Gi``).
        worker_unit: What a worker pod requests (``unit: worker``): CPUs or GPUs.
        per_worker: How many of them each worker pod requests.
    """

    unit: Unit
    levels: tuple[int, ...]
    per_node: int
    memory_per_unit: str
    worker_unit: PodResource = "cpu"
    per_worker: int = 1

    def layout(self, n: int) -> Layout:
        """The pods of size ``n`` (:mod:`qosflow.core.layout`)."""
        return layout(
            self.unit,
            n,
            per_node=self.per_node,
            worker_unit=self.worker_unit,
            per_worker=self.per_worker,
        )

    @property
    def min(self) -> int:
        """Smallest allowed size."""
        return self.levels[0]

    @property
    def max(self) -> int:
        """Largest allowed size."""
        return self.levels[-1]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated deadline job. Times are epoch seconds (UTC).

    Attributes:
        name: RFC 1123 label, also the prefix of every workflow name.
        key: History key; jobs with the same key share observed step times (defaults to name).
        total_steps: Training steps to run.
        submitted_at: When the job was submitted (epoch seconds).
        deadline: When it must be done (epoch seconds).
        resources: The elastic range.
        checkpoint_every_steps: Checkpoint interval in steps.
        best_effort: True when no deadline guarantee is wanted at all.
        if_not_guaranteed: What to do when admission cannot guarantee the deadline.
        margin_seconds: Absolute safety margin before the deadline.
        dwell_seconds: Minimum time between two rescales, and how long a decision must hold.
        image: Container image of the training step (``None``: the connection's default image).
        command: Command of the training step (the reference trainer by default).
        step_seconds_estimate: The user's estimate of seconds per step at
            ``step_seconds_estimate_at`` units: the prior's shape while the key has no
            history (``None``: probe first). Above one node it counts as one measurement
            there, for this job and every later job of the key, until a run measures there.
        step_seconds_estimate_at: The size the estimate was measured at (``None``:
            ``resources.min``).
        launcher: ``torchrun`` runs the command as a data-parallel job over several pods
            (``unit: worker``, or sizes above ``per_node``); ``none``: one process in one pod.
        pod: The pods' Kubernetes settings (environment, volumes, placement...).
        checkpoint: The volume the checkpoints live on (``None``: not declared; a job must have
            one before it is submitted, :func:`qosflow.core.pod.checkpoint_problem`).
    """

    name: str
    key: str
    total_steps: int
    submitted_at: float
    deadline: float
    resources: Resources
    checkpoint_every_steps: int
    best_effort: bool
    if_not_guaranteed: IfNotGuaranteed
    margin_seconds: float
    dwell_seconds: float
    image: str | None
    command: tuple[str, ...]
    step_seconds_estimate: float | None = None
    step_seconds_estimate_at: int | None = None
    launcher: Launcher = "none"
    pod: PodSettings = field(default_factory=PodSettings)
    checkpoint: Checkpoint | None = None


# --------------------------------------------------------------------------- pydantic boundary


def _not_a_bool(value: Any) -> Any:
    """A boolean is not a number: ``total_steps: true`` is a mistake, not 1 step."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not a boolean (got {str(value).lower()})")
    return value


Count = Annotated[int, BeforeValidator(_not_a_bool)]
"""An integer field (steps, units, nodes): a string of digits is read, a boolean refused."""
Seconds = Annotated[float, BeforeValidator(_not_a_bool)]
"""A number of seconds: a boolean refused."""


class ResourcesModel(StrictModel):
    """Boundary model of ``resources``."""

    unit: Unit = "cpu"
    min: Count = Field(default=1, ge=1)
    max: Count = Field(ge=1, le=100_000)
    levels: list[Count] | None = None
    per_node: Count = Field(default=DEFAULT_PER_NODE, ge=1)
    memory_per_unit: str = "2Gi"
    per_worker: dict[Literal["cpu", "gpu"], Count] | None = None

    @field_validator("per_worker")
    @classmethod
    def _per_worker(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is not None and (len(value) != 1 or min(value.values()) < 1):
            raise ValueError(f"must be one of {{cpu: N}} or {{gpu: N}} with N >= 1 (got {value})")
        return value

    def to_resources(self) -> Resources:
        """Freeze, with the rules between fields (worker pods, even splits).

        Raises:
            SpecError: Naming the field and the rule.
        """
        levels = (
            tuple(self.levels) if self.levels is not None else tuple(range(self.min, self.max + 1))
        )
        default: dict[Literal["cpu", "gpu"], int] = {"cpu": 1}
        per_node, worker = self.per_node, dict(self.per_worker or default)
        if self.unit == "worker":
            if "per_node" in self.model_fields_set and per_node != 1:
                raise SpecError(
                    "resources.per_node",
                    "a worker is a pod of its own, so for the speed model every worker is a node: "
                    f"leave per_node out or set it to 1 (got {per_node})",
                )
            per_node = 1
        elif self.per_worker is not None:
            raise SpecError("resources.per_worker", "is for unit: worker only")
        ((kind, count),) = worker.items()
        pod_resource: PodResource = "gpu" if kind == "gpu" else "cpu"
        return Resources(self.unit, levels, per_node, self.memory_per_unit, pod_resource, count)

    @field_validator("memory_per_unit")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if parse_quantity(value) <= 0:
            raise ValueError(f"must be > 0 (got {value!r})")
        return value

    @field_validator("max")
    @classmethod
    def _max_at_least_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min")
        if low is not None and value < low:
            raise ValueError(f"must be >= min (got min={low}, max={value})")
        return value

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must not be empty")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"must be strictly ascending (got {value})")
        low, high = info.data.get("min"), info.data.get("max")
        if low is not None and high is not None and (value[0] < low or value[-1] > high):
            raise ValueError(f"must lie within [min, max] = [{low}, {high}] (got {value})")
        return value


class JobModel(StrictModel):
    """Boundary model of a job spec (YAML/JSON)."""

    name: str = Field(min_length=1, max_length=63)
    key: str | None = Field(default=None, min_length=1, max_length=253)
    total_steps: Count = Field(ge=1, le=10**12)
    deadline: datetime | str
    timezone: str | None = Field(default=None, min_length=1)
    resources: ResourcesModel
    checkpoint_every_steps: Count | None = Field(default=None, ge=1)
    best_effort: bool = False
    if_not_guaranteed: IfNotGuaranteed = "run_best_effort"
    margin_seconds: Seconds = Field(default=30.0, ge=0, allow_inf_nan=False)
    dwell_seconds: Seconds = Field(default=60.0, ge=0, allow_inf_nan=False)
    image: str | None = Field(default=None, min_length=1)
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "qosflow_trainer"])
    step_seconds_estimate: Seconds | None = Field(default=None, gt=0, allow_inf_nan=False)
    step_seconds_estimate_at: Count | None = Field(default=None, ge=1)
    launcher: Launcher | None = None
    pod: PodModel = Field(default_factory=PodModel)
    checkpoint: CheckpointModel | None = None

    @field_validator("name")
    @classmethod
    def _rfc1123(cls, value: str) -> str:
        if not _RFC1123_LABEL.match(value):
            raise ValueError(
                f"must be an RFC 1123 label: lower-case letters, digits and '-', "
                f"starting and ending with a letter or digit (got {value!r})"
            )
        return value

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> datetime | str:
        return deadline_form(value)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str | None) -> str | None:
        if value is not None:
            zone(value)
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value or not all(value):
            raise ValueError("must be a non-empty list of non-empty strings")
        return value

    def to_spec(self, now: datetime, defaults: PodDefaults | None = None) -> JobSpec:
        """Resolve the deadline against ``now``, fill the cluster's defaults, and freeze.

        Raises:
            SpecError: A deadline before ``now``, a margin that leaves no time, a checkpoint
                interval longer than the job, or pod settings that break a rule (a declared
                checkpoint volume that would lose the checkpoints, say).
        """
        pod = self.pod.to_settings()
        checkpoint = None if self.checkpoint is None else self.checkpoint.to_checkpoint(pod)
        if checkpoint is not None:
            problem = checkpoint_problem(pod, checkpoint)
            if problem is not None:
                raise problem
        image = self.image
        if defaults is not None:
            pod, checkpoint = with_defaults(pod, checkpoint, defaults)
            image = image or defaults.image
        resources = self.resources.to_resources()
        launcher = self._launcher(resources)
        return JobSpec(
            name=self.name,
            key=self.key or self.name,
            total_steps=self.total_steps,
            submitted_at=now.timestamp(),
            deadline=self._due(now),
            resources=resources,
            checkpoint_every_steps=self._checkpoint_every(),
            best_effort=self.best_effort,
            if_not_guaranteed=self.if_not_guaranteed,
            margin_seconds=self.margin_seconds,
            dwell_seconds=self.dwell_seconds,
            image=image,
            command=tuple(self.command),
            step_seconds_estimate=self.step_seconds_estimate,
            step_seconds_estimate_at=self._estimate_at(resources),
            launcher=launcher,
            pod=pod,
            checkpoint=checkpoint,
        )

    def _due(self, now: datetime) -> float:
        """The deadline in epoch seconds (infinite for a best-effort job).

        Raises:
            SpecError: A deadline that is not after submission, or a margin that leaves no time.
        """
        deadline = resolve_deadline(self.deadline, timezone=self.timezone, now=now)
        if self.best_effort:
            return math.inf
        submitted, due = now.timestamp(), deadline.timestamp()
        if due <= submitted:
            raise SpecError(
                "deadline",
                f"must be after submission {now.isoformat()} (got {deadline.isoformat()})",
            )
        left, margin = due - submitted, self.margin_seconds
        if margin >= left:
            default = "" if "margin_seconds" in self.model_fields_set else ", the default"
            raise SpecError(
                "margin_seconds",
                f"must be shorter than the {duration(left, against=margin)} from submission to "
                f"the deadline: nothing would be left to train in (got "
                f"{duration(margin, against=left)}{default})",
            )
        return due

    def _checkpoint_every(self) -> int:
        """The checkpoint interval: as given, or every 500 steps (the job's end if sooner).

        Raises:
            SpecError: An interval longer than the job: no checkpoint before the end.
        """
        every = self.checkpoint_every_steps
        if every is None:
            return min(DEFAULT_CHECKPOINT_EVERY, self.total_steps)
        if every > self.total_steps:
            raise SpecError(
                "checkpoint_every_steps",
                f"must be <= total_steps ({self.total_steps}): no checkpoint would be written "
                f"before the end, so a preempted or rescaled job would start again from step 0 "
                f"(got {every})",
            )
        return every

    def _estimate_at(self, resources: Resources) -> int | None:
        """The size the estimate was measured at: one of the job's sizes, with an estimate.

        Raises:
            SpecError: A size without an estimate, or not one the job may run at.
        """
        at = self.step_seconds_estimate_at
        if at is not None and self.step_seconds_estimate is None:
            raise SpecError("step_seconds_estimate_at", f"needs step_seconds_estimate (got {at})")
        if at is not None and at not in resources.levels:
            raise SpecError(
                "step_seconds_estimate_at",
                f"must be one of the job's sizes {list(resources.levels)} (got {at})",
            )
        return at

    def _launcher(self, resources: Resources) -> Launcher:
        """As given; ``torchrun`` by default for workers (each worker is a pod).

        Whether the job's sizes can run as pods is a question for the cluster it is submitted
        to (:func:`qosflow.core.layout.job_problem`): planning takes any sizes.

        Raises:
            SpecError: Workers without torchrun, or torchrun with a command that is not a Python
                program (torchrun runs ``python -m module`` or ``python script.py``).
        """
        launcher = self.launcher or ("torchrun" if resources.unit == "worker" else "none")
        if resources.unit == "worker" and launcher != "torchrun":
            raise SpecError("launcher", "workers are the pods of one torchrun job: use torchrun")
        if launcher == "torchrun" and (
            len(self.command) < 2 or self.command[0].rsplit("/", 1)[-1] not in PYTHONS
        ):
            raise SpecError(
                "command",
                "torchrun runs a Python program: write it as python -m module ... or "
                f"python script.py ... (got {self.command})",
            )
        return launcher


# --------------------------------------------------------------------------- loading


def load_job(data: Any, *, now: datetime, defaults: PodDefaults | None = None) -> JobSpec:
    """Validate a job spec (a mapping of fields) and freeze it.

    Reading a spec file is the front end's job (``qosflow.cli.files.read_spec``).

    Args:
        data: A mapping of the spec's fields.
        now: Submission time; relative deadlines (``PT4H``) and clock times (``"06:00"``) count
            from it.
        defaults: The cluster's defaults for what the spec leaves unset (image, checkpoint
            claim, tolerations...), from the Airflow connection.

    Returns:
        The frozen :class:`JobSpec`.

    Raises:
        SpecError: Naming the field path and the rule, for every invalid input.
    """
    mapping = as_mapping(data, "job spec")
    try:
        model = JobModel.model_validate(mapping)
    except ValidationError as exc:
        raise spec_error(exc, JobModel) from None
    if now.tzinfo is None:
        raise SpecError("now", "must be timezone-aware")
    return model.to_spec(now, defaults)
