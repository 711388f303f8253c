"""Job and cluster specifications: pydantic at the boundary, frozen dataclasses inside.

A user states *when* a training run must be done (``deadline``) and the elastic range of units it
may use; qosflow picks the size. ``load_job`` and ``load_cluster`` turn YAML/JSON (or dicts) into
the frozen :class:`JobSpec` / :class:`ClusterSpec` the core computes on. Every invalid input raises
:class:`~qosflow.core.errors.SpecError` naming the field path and the rule.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from qosflow.core.errors import SpecError
from qosflow.core.pod import Checkpoint, PodDefaults, PodSettings, checkpoint_problem, with_defaults
from qosflow.core.pod_model import CheckpointModel, PodModel

Unit = Literal["cpu", "gpu", "worker"]
IfNotGuaranteed = Literal["run_best_effort", "reject"]

_RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ISO_DURATION = re.compile(
    r"^P(?!$)(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)
_QUANTITY = re.compile(
    r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity such as ``2Gi``, ``500m`` or ``1.5G``.

    Args:
        text: The quantity string.

    Returns:
        The value in base units.

    Raises:
        ValueError: When the string is not a Kubernetes quantity.
    """
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity like 2Gi or 512Mi (got {text!r})")
    try:
        return Decimal(match["num"]) * _SUFFIX[match["suffix"]]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"not a number (got {text!r})") from exc


def parse_iso_duration(text: str) -> timedelta:
    """Parse an ISO-8601 duration of days, hours, minutes and seconds (``PT4H``, ``P1DT30M``).

    Raises:
        ValueError: When the text is not such a duration.
    """
    match = _ISO_DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"must be an ISO-8601 duration like PT4H (got {text!r})")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return timedelta(**parts)


# --------------------------------------------------------------------------- frozen core types


@dataclass(frozen=True, slots=True)
class Resources:
    """The elastic range of a job.

    Attributes:
        unit: What a unit is: a CPU core, a GPU or a worker replica.
        levels: Allowed sizes in units, ascending.
        per_node: Units per node; the speed model's node boundary.
        memory_per_unit: Memory per unit as a Kubernetes quantity (``2Gi``).
    """

    unit: Unit
    levels: tuple[int, ...]
    per_node: int
    memory_per_unit: str

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
        step_seconds_estimate: The user's estimate of seconds per step at ``resources.min`` units,
            used only while neither history nor progress is known (``None``: probe first).
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
    pod: PodSettings = field(default_factory=PodSettings)
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous cluster: ``nodes`` × ``units_per_node`` units of one kind."""

    nodes: int
    units_per_node: int
    unit: Unit

    @property
    def total_units(self) -> int:
        """All units of the cluster."""
        return self.nodes * self.units_per_node


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class ResourcesModel(_Strict):
    """Boundary model of ``resources``."""

    unit: Unit = "cpu"
    min: Count = Field(default=1, ge=1)
    max: Count = Field(ge=1, le=100_000)
    levels: list[Count] | None = None
    per_node: Count = Field(default=8, ge=1)
    memory_per_unit: str = "2Gi"

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


class JobModel(_Strict):
    """Boundary model of a job spec (YAML/JSON)."""

    name: str = Field(min_length=1, max_length=63)
    key: str | None = Field(default=None, min_length=1, max_length=253)
    total_steps: Count = Field(ge=1, le=10**12)
    deadline: datetime | str
    resources: ResourcesModel
    checkpoint_every_steps: Count = Field(default=500, ge=1)
    best_effort: bool = False
    if_not_guaranteed: IfNotGuaranteed = "run_best_effort"
    margin_seconds: Seconds = Field(default=30.0, ge=0, allow_inf_nan=False)
    dwell_seconds: Seconds = Field(default=60.0, ge=0, allow_inf_nan=False)
    image: str | None = Field(default=None, min_length=1)
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "qosflow_trainer"])
    step_seconds_estimate: Seconds | None = Field(default=None, gt=0, allow_inf_nan=False)
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
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError(f"must be timezone-aware (got {value.isoformat()!r})")
            return value
        if not isinstance(value, str):
            raise ValueError(f"must be an ISO-8601 instant or duration (got {value!r})")
        if value.startswith("P"):
            parse_iso_duration(value)
            return value
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"must be an ISO-8601 instant with a timezone or a duration like PT4H (got {value!r})"
            ) from None
        if parsed.tzinfo is None:
            raise ValueError(f"must be timezone-aware, e.g. end in +00:00 (got {value!r})")
        return parsed

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value or not all(value):
            raise ValueError("must be a non-empty list of non-empty strings")
        return value

    def to_spec(self, now: datetime, defaults: PodDefaults | None = None) -> JobSpec:
        """Resolve relative deadlines against ``now``, fill the cluster's defaults, and freeze.

        Raises:
            SpecError: A deadline before ``now``, or pod settings that break a rule (a declared
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
        res = self.resources
        levels = tuple(res.levels) if res.levels is not None else tuple(range(res.min, res.max + 1))
        if isinstance(self.deadline, str):
            deadline = now + parse_iso_duration(self.deadline)
        else:
            deadline = self.deadline
        submitted, due = now.timestamp(), deadline.timestamp()
        if not self.best_effort and due <= submitted:
            raise SpecError(
                "deadline",
                f"must be after submission {now.isoformat()} (got {deadline.isoformat()})",
            )
        return JobSpec(
            name=self.name,
            key=self.key or self.name,
            total_steps=self.total_steps,
            submitted_at=submitted,
            deadline=math.inf if self.best_effort else due,
            resources=Resources(res.unit, levels, res.per_node, res.memory_per_unit),
            checkpoint_every_steps=self.checkpoint_every_steps,
            best_effort=self.best_effort,
            if_not_guaranteed=self.if_not_guaranteed,
            margin_seconds=self.margin_seconds,
            dwell_seconds=self.dwell_seconds,
            image=image,
            command=tuple(self.command),
            step_seconds_estimate=self.step_seconds_estimate,
            pod=pod,
            checkpoint=checkpoint,
        )


class ClusterModel(_Strict):
    """Boundary model of a cluster spec."""

    nodes: Count = Field(ge=1, le=100_000)
    units_per_node: Count = Field(ge=1, le=4096)
    unit: Unit = "cpu"

    def to_spec(self) -> ClusterSpec:
        """Freeze."""
        return ClusterSpec(self.nodes, self.units_per_node, self.unit)


# --------------------------------------------------------------------------- loading


def _first_error(exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    kind, ctx, got = err["type"], err.get("ctx", {}), err.get("input")
    rules: dict[str, Callable[[], str]] = {
        "greater_than_equal": lambda: f"must be >= {ctx.get('ge')} (got {got!r})",
        "greater_than": lambda: f"must be > {ctx.get('gt')} (got {got!r})",
        "less_than_equal": lambda: f"must be <= {ctx.get('le')} (got {got!r})",
        "missing": lambda: "is required",
        "extra_forbidden": lambda: "is not a known field (check the spelling)",
        "string_too_long": lambda: (
            f"must be at most {ctx.get('max_length')} characters (got {len(str(got))})"
        ),
        "string_too_short": lambda: f"must be at least {ctx.get('min_length')} character(s)",
        "literal_error": lambda: f"must be one of {ctx.get('expected')} (got {got!r})",
        "int_parsing": lambda: f"must be an integer (got {got!r})",
        "int_from_float": lambda: f"must be a whole number (got {got!r})",
        "int_type": lambda: f"must be an integer (got {got!r})",
        "bool_parsing": lambda: f"must be true or false (got {got!r})",
        "list_type": lambda: f"must be a list (got {got!r})",
        "model_type": lambda: f"must be a mapping (got {got!r})",
        "dict_type": lambda: f"must be a mapping (got {got!r})",
    }
    make = rules.get(kind)
    if make is not None:
        return SpecError(path, make())
    message = str(err["msg"]).removeprefix("Value error, ")
    return SpecError(path, message)


def _as_mapping(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError("", f"a {what} must be a mapping of fields (got {type(data).__name__})")
    return data


def load_job(data: Any, *, now: datetime, defaults: PodDefaults | None = None) -> JobSpec:
    """Validate a job spec (a mapping of fields) and freeze it.

    Reading a spec file is the front end's job (``qosflow.cli.files.read_spec``).

    Args:
        data: A mapping of the spec's fields.
        now: Submission time; relative deadlines (``PT4H``) count from it.
        defaults: The cluster's defaults for what the spec leaves unset (image, checkpoint
            claim, tolerations...), from the Airflow connection.

    Returns:
        The frozen :class:`JobSpec`.

    Raises:
        SpecError: Naming the field path and the rule, for every invalid input.
    """
    mapping = _as_mapping(data, "job spec")
    try:
        model = JobModel.model_validate(mapping)
    except ValidationError as exc:
        raise _first_error(exc) from None
    if now.tzinfo is None:
        raise SpecError("now", "must be timezone-aware")
    return model.to_spec(now, defaults)


def load_cluster(data: Any) -> ClusterSpec:
    """Validate a cluster spec: a mapping, or ``"NODESxUNITS"`` like ``"16x8"``.

    Raises:
        SpecError: Naming the field path and the rule.
    """
    if isinstance(data, str) and re.fullmatch(r"\d+x\d+", data):
        nodes, per = data.split("x")
        data = {"nodes": int(nodes), "units_per_node": int(per)}
    mapping = _as_mapping(data, "cluster spec")
    try:
        return ClusterModel.model_validate(mapping).to_spec()
    except ValidationError as exc:
        raise _first_error(exc) from None
