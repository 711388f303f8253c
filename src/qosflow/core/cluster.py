"""The environment Protocols: what a cluster shows (``ClusterView``) and what it does (``Actuator``).

Implemented by ``qosflow_argo.ArgoCluster`` (Argo Server REST + the Kubernetes API, for real
clusters and the embedded local cluster alike, over HTTP). The Airflow steps and the CLI build
snapshots from it and call the pure core; the simulator builds its snapshots from its own event
loop (:mod:`qosflow.sim.policy`) and calls the same core functions.

Naming: the workflow of segment ``k`` of job ``name`` is ``f"{name}-s{k}"`` (:func:`workflow_name`),
so a retried submit finds the workflow it already created instead of creating a second one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from qosflow.core.layout import Layout, PodResource, layout
from qosflow.core.pod import Checkpoint, PodSettings
from qosflow.core.spec import Unit
from qosflow.core.usage import UsageReport

LABEL_JOB = "qosflow.dev/job"
LABEL_SEGMENT = "qosflow.dev/segment"
LABEL_MANAGED = "qosflow.dev/managed"
ANNOTATION_DEADLINE = "qosflow.dev/deadline"
ANNOTATION_PLAN = "qosflow.dev/plan"


def workflow_name(job: str, segment: int) -> str:
    """Deterministic workflow name of a job segment (idempotent submits rely on it)."""
    return f"{job}-s{segment}"


class Phase(StrEnum):
    """Workflow phase, as Argo reports it (``Error`` folded into ``FAILED``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = (
        "Stopped"  # ended by a stop for checkpoint-restart (Argo: Failed + spec.shutdown=Stop)
    )

    @property
    def finished(self) -> bool:
        """True once the workflow will never make progress again."""
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED)


class ResizeState(StrEnum):
    """Outcome of an in-place resize (Kubernetes pod conditions, 1.33+)."""

    DONE = "Done"
    IN_PROGRESS = "InProgress"
    DEFERRED = "Deferred"
    INFEASIBLE = "Infeasible"
    UNSUPPORTED = "Unsupported"


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """Everything needed to launch one training segment.

    Attributes:
        job: Job name (RFC 1123 label).
        segment: Segment number; 0 for the first launch, +1 for every checkpoint-restart.
        units: Size of this segment in resource units.
        unit: Kind of unit (cpu | gpu | worker).
        total_steps: Steps of the whole job (the trainer stops there).
        resume: Resume from the newest checkpoint.
        priority_class: Kubernetes PriorityClass name for the pod.
        priority: Argo ``spec.priority`` (orders waiting workflows).
        image: Container image (``None``: none was named; the submit is refused).
        command: Container command.
        memory_per_unit: Memory per unit (Kubernetes quantity).
        deadline: Job deadline, epoch seconds (``inf`` for best effort).
        checkpoint_dir: Where the trainer keeps checkpoints (shared by all segments).
        checkpoint_every_steps: Checkpoint interval.
        plan: JSON text of the plan, stored as an annotation.
        pod: The pods' Kubernetes settings (environment, volumes, placement...).
        checkpoint: The volume ``checkpoint_dir`` lies on (mounted at ``checkpoint.path``).
        launcher: ``torchrun``: the segment is a data-parallel job of :attr:`layout`'s pods.
        per_node: Units per node (a size above it is several pods); 0: one pod of any size.
        worker_unit: What a worker pod requests (``unit: worker``).
        per_worker: How many of them.
    """

    job: str
    segment: int
    units: int
    unit: Unit
    total_steps: int
    resume: bool
    priority_class: str
    priority: int
    image: str | None
    command: tuple[str, ...]
    memory_per_unit: str
    deadline: float
    checkpoint_dir: str
    checkpoint_every_steps: int
    plan: str = "{}"
    pod: PodSettings = field(default_factory=PodSettings)
    checkpoint: Checkpoint | None = None
    launcher: str = "none"
    per_node: int = 0
    worker_unit: PodResource = "cpu"
    per_worker: int = 1

    @property
    def name(self) -> str:
        """The deterministic workflow name."""
        return workflow_name(self.job, self.segment)

    @property
    def layout(self) -> Layout:
        """The segment's pods (:mod:`qosflow.core.layout`)."""
        per_node = self.per_node or max(self.units, 1)
        return layout(
            self.unit,
            self.units,
            per_node=per_node,
            worker_unit=self.worker_unit,
            per_worker=self.per_worker,
        )


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One workflow (one job segment) as the cluster reports it.

    Attributes:
        name: Workflow name.
        job: Job name (label ``qosflow.dev/job``).
        segment: Segment number.
        phase: Workflow phase.
        steps_done: Progress N of ``N/M`` of the training node, ``None`` before any report.
        total_steps: M of ``N/M``.
        units: Units currently allocated (after any in-place resize).
        priority_class: Pod PriorityClass.
        priority: Argo ``spec.priority``.
        message: The failure message of the workflow or pod, ``""`` when none.
        started_at: Epoch seconds when the pod started running.
        finished_at: Epoch seconds when it finished.
        pod_name: Name of the training pod, once it exists.
        resize: State of the last in-place resize, when any.
    """

    name: str
    job: str
    segment: int
    phase: Phase
    steps_done: int | None
    total_steps: int | None
    units: int
    priority_class: str = ""
    priority: int = 0
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    pod_name: str | None = None
    resize: ResizeState | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    """Free and total units of one kind (node allocatable minus pod requests).

    Attributes:
        unit: Kind of unit.
        total: All allocatable units.
        free: Units not requested by any non-terminal pod.
        free_per_node: Free units per node, by node name.
    """

    unit: Unit
    total: int
    free: int
    free_per_node: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResizeResult:
    """What an in-place resize achieved."""

    state: ResizeState
    units: int
    message: str = ""


@runtime_checkable
class ClusterView(Protocol):
    """What policies may observe of a cluster."""

    def now(self) -> float:
        """Current time in epoch seconds (virtual in the simulator)."""
        ...

    def capacity(self, unit: Unit) -> Capacity:
        """Free and total capacity of one unit kind."""
        ...

    def status(self, name: str) -> JobStatus:
        """Status of one workflow; raises ``NotFoundError`` when it does not exist."""
        ...

    def list_jobs(self, job: str | None = None) -> list[JobStatus]:
        """All qosflow workflows (label ``qosflow.dev/managed``), optionally of one job."""
        ...


@runtime_checkable
class Actuator(Protocol):
    """What policies may do to a cluster. Every call is idempotent."""

    def submit(self, request: SubmitRequest) -> JobStatus:
        """Create the segment's workflow; if it already exists, return it (never a second one)."""
        ...

    def stop(self, name: str, *, message: str = "") -> JobStatus:
        """Ask the training pod to checkpoint and exit (SIGTERM, grace period); wait until ended."""
        ...

    def resize(self, name: str, units: int) -> ResizeResult:
        """Change the running pod's units in place (CPU only); report Deferred/Infeasible."""
        ...

    def supports_in_place_resize(self, unit: Unit) -> bool:
        """Whether ``resize`` can work for this unit kind on this cluster."""
        ...

    def set_priority(
        self, name: str, *, priority: int, priority_class: str | None = None
    ) -> JobStatus:
        """Merge-patch ``spec.priority`` (and the class for pods created later)."""
        ...


@runtime_checkable
class UsageView(Protocol):
    """A cluster that can show what a training pod reported about its CPU time (its log)."""

    def usage(self, pod_name: str, *, tail_lines: int = 200) -> list[UsageReport]:
        """The usage reports in the pod's recent log (:mod:`qosflow.core.usage`); ``[]`` when none."""
        ...
