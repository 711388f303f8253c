"""The Policy Protocol and the per-decision snapshot types of the simulator.

How a policy plugs in
---------------------
A policy is any object with a ``name``, an ``overhead`` model and a ``decide`` method::

    class MyPolicy:
        name = "my-policy"
        overhead: OverheadModel = NoOverhead()

        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            ...

The engine (:func:`qosflow.sim.engine.simulate`) calls ``decide`` at every decision point: at
most once per scheduling slot, when jobs arrive (arrivals inside a slot are coalesced to the slot
boundary), when a job completes, and when the policy asked to be woken (``SlotDecision.wake_at``).
The :class:`SlotSnapshot` is frozen: the time, the cluster size, the jobs that arrived since the
last decision, and every active job (admitted or waiting) with its progress and the speeds the
policy is allowed to *believe* (oracle tables or fitted models, never the noisy truth).

A policy may also name the simulator's timekeeping it was written for, as a ``completion``
attribute (``"exact"``, the default when it has none, or ``"artifact"``: ElasticFlow's end events
and accounting, see :class:`qosflow.sim.engine.SimConfig`); ``SimConfig.completion`` overrides it.

The policy answers with a :class:`SlotDecision`: units per job from now on (jobs left out get 0
and wait), jobs it refuses (they leave the system and count as deadline misses), jobs it
guarantees (for the guarantee-violation metric), and optionally when it wants to decide again.
The engine checks the allocation (levels, capacity), places it on nodes (buddy placement),
charges the ``overhead`` model and advances time. A policy may keep private state between calls
(ElasticFlow keeps its plans); it must be deterministic given the snapshots it saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Completion = Literal["exact", "artifact"]
"""The simulator's timekeeping: exact completions, or ElasticFlow's (``SimConfig.completion``)."""


@dataclass(frozen=True, slots=True)
class JobView:
    """What a policy sees of one active job at a decision.

    Attributes:
        job_id: Trace id.
        submit: Arrival (absolute seconds).
        deadline: Absolute deadline; ``inf`` for best effort.
        total: Job size in iterations.
        done: Iterations done so far (observed progress).
        units: Units the job holds now (0 when waiting).
        requested: Units the user asked for (``num_gpu``; rigid policies use it).
        speeds: Believed iterations per second by allowed unit count (ascending keys).
        max_units: The generic cap (largest allowed count, <= 64 and <= batch size).
        model: Model name.
        batch_size: Global batch size.
        best_effort: True when the job has no deadline.
        admitted: True once a policy guaranteed the job.
        started: True once the job has held units at least once.
    """

    job_id: str
    submit: float
    deadline: float
    total: int
    done: float
    units: int
    requested: int
    speeds: Mapping[int, float]
    max_units: int
    model: str
    batch_size: int
    best_effort: bool = False
    admitted: bool = False
    started: bool = False

    @property
    def remaining(self) -> float:
        """Iterations still to run."""
        return max(self.total - self.done, 0.0)


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """The frozen world a policy decides on.

    Attributes:
        now: Current time (integer seconds).
        slot: Scheduling slot length in seconds.
        capacity: Total units in the cluster.
        node_size: Units per node.
        decision: Index of this decision (0, 1, ...).
        arrivals: Ids of the jobs that arrived since the previous decision (in trace order).
        completed: Ids of the jobs that completed since the previous decision.
        jobs: Every active job (arrived, not finished, not refused), in arrival order.
        switches: Switches the nodes are spread over (equal shares, node ids restart at each).
    """

    now: int
    slot: int
    capacity: int
    node_size: int
    decision: int
    arrivals: tuple[str, ...]
    completed: tuple[str, ...]
    jobs: tuple[JobView, ...]
    switches: int = 1


@dataclass(frozen=True, slots=True)
class SlotDecision:
    """A policy's answer at one decision.

    Attributes:
        allocation: Units per job from now on; jobs left out hold 0 units.
        rejected: Jobs refused now; they leave and count as deadline misses.
        admitted: Jobs guaranteed now (counted for guarantee violations).
        wake_at: When the policy wants its next decision (kept only if earlier than every pending
            event, as ElasticFlow adds its next scale point).
        planned_finish: The policy's planned completion per job (ElasticFlow's accounting).
        reasons: Optional reason per job, in words (kept in the run log).
        profiled: Jobs whose profile ladder ended now (:mod:`qosflow.core.profile`): their
            progress so far goes to their key's history at once, as the watch records it.
    """

    allocation: Mapping[str, int]
    rejected: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()
    wake_at: int | None = None
    planned_finish: Mapping[str, float] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    profiled: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placed:
    """One running job at a decision, as the overhead model sees it.

    Attributes:
        job_id: Trace id.
        units: Units it holds after the decision.
        previous_units: Units it held before the decision.
        nodes: Node indices it was placed on (one per node, ascending).
        first_rank: Global index of its first unit (node * node_size + offset).
    """

    job_id: str
    units: int
    previous_units: int
    nodes: tuple[int, ...]
    first_rank: int


@runtime_checkable
class OverheadModel(Protocol):
    """Seconds of lost progress each running job pays at a decision."""

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """Return the overhead in whole seconds per running job (jobs left out pay 0)."""
        ...


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy the engine can run (see the module docstring)."""

    name: str
    overhead: OverheadModel

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        """Decide the allocation at one decision point."""
        ...


@dataclass(frozen=True, slots=True)
class NoOverhead:
    """No progress is ever lost (the artifact's EDF)."""

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """Charge nothing."""
        return {}


STEP_LATENCY_S = 15
"""Seconds from an allocation change to the Airflow steps acting on it (see :class:`StepLatency`)."""


@dataclass(slots=True)
class StepLatency:
    """What the Airflow steps add to every size change: the latency of a round.

    On a deployment the allocator runs at every poll of every watch; a change reaches the job
    when its watch next polls (half the 5 s poll interval on average) and the branch and the
    rescale task have started (two task starts, a few seconds each on LocalExecutor). The
    simulator charges that as lost progress to every job whose size changes (start, rescale,
    pause), on top of the environment's own overhead: pessimistic, since the job really keeps
    running at its old size meanwhile.

    Attributes:
        inner: The environment's overhead model (restart costs).
        seconds: Latency of one round.
    """

    inner: OverheadModel
    seconds: int = STEP_LATENCY_S

    def reset(self) -> None:
        """Reset the inner model (start of a run)."""
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """The inner model's charge plus ``seconds`` for every job whose size changed."""
        out = dict(self.inner.charge(placed, decision=decision, capacity=capacity))
        for p in placed:
            if p.units != p.previous_units:
                out[p.job_id] = out.get(p.job_id, 0) + self.seconds
        return out


@dataclass(frozen=True, slots=True)
class RescaleOverhead:
    """A fixed cost whenever a job starts or changes size (checkpoint-restart).

    Attributes:
        seconds: Lost seconds per start or rescale.
    """

    seconds: int = 30

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """Charge ``seconds`` to every job whose size changed at this decision."""
        return {p.job_id: self.seconds for p in placed if p.units != p.previous_units}
