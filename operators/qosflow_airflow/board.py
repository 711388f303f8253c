"""The provider's side of the job board: publish a job, allocate the cluster, read its answer.

Every plan step and every poll of every watch does the same thing (:func:`allocate_on_board`):
under the board's lock it writes its own job's fresh row (progress, size, belief), reads every
active job of the namespace, runs the core's cluster allocator
(:func:`qosflow.core.allocator.allocate`) on that snapshot and writes back what the allocator
decided for every job (target, class, guarantee, reason and the allocator's memory of it: one
allocation is the whole cluster's, as in the simulator; a job admitted in another job's step stays
admitted). It acts on its own job only; the other jobs' steps read the same board and act on
theirs. Only a job's own steps write its progress, size, belief and heartbeat. Capacity is what
qosflow jobs may use: the cluster's free units plus the units qosflow jobs hold now.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypedDict

from qosflow.core.allocator import RANK, Allocation, ClusterInput, JobAllocation, JobInput, allocate
from qosflow.core.forecast import Memory, arrival_from_dict, arrival_to_dict, remember
from qosflow.core.summary import (
    belief_factor,
    belief_from_dict,
    belief_to_dict,
    rescaled,
    state_from_dict,
    state_to_dict,
)
from qosflow.store.board import BoardEntry, BoardSession, JobBoard
from qosflow_airflow.state import job_from_dict

if TYPE_CHECKING:
    from qosflow.core.cluster import Capacity, ClusterView
    from qosflow.core.predict import Belief
    from qosflow.core.spec import Resources
    from qosflow_airflow.admitted import Admitted

SLOT_S = 60.0
"""Fine slot of the capacity timeline the allocator plans guarantees on."""


@dataclass(frozen=True, slots=True)
class BoardAnswer:
    """What one allocation on the board says to the step that ran it.

    Attributes:
        mine: The allocator's answer for this step's own job (``None``: rejected).
        allocation: The whole allocation (every job's answer, the verdicts).
        capacity: Units the allocation shared out.
        held_below: Units held now by jobs of a lower class than this job's allocation.
        profiled: This job's profile ladder ended now (:mod:`qosflow.core.profile`): its
            samples so far belong in its key's history at once.
    """

    mine: JobAllocation | None
    allocation: Allocation
    capacity: int
    held_below: int
    profiled: bool = False


def job_input(entry: BoardEntry, now: float | None = None) -> JobInput:
    """The allocator's view of one board row (its belief as published, re-inflatable).

    The job is known by its row's id (the run's job id), whatever name its spec carries. A row
    says how far its job was at its heartbeat; allocating at ``now``, a running job is taken to
    have gone on since at its believed median speed (:func:`progress_at`), so a job whose step
    wrote a poll ago does not look behind by a poll's worth of steps.
    """
    spec = job_from_dict(entry.spec)
    if spec.name != entry.job_id:
        spec = replace(spec, name=entry.job_id)
    belief = belief_from_dict(entry.belief) if entry.belief else _unknown(spec.resources.levels)
    factor = belief_factor(entry.belief) if entry.belief else None
    done = entry.done if now is None else progress_at(entry, belief, spec.total_steps, now)

    def at(new: float, b: Belief = belief, old: float | None = factor) -> Belief:
        return rescaled(b, old, new)

    return JobInput(
        spec=spec,
        done=done,
        units=entry.units,
        belief=belief,
        state=state_from_dict(entry.state),
        rescale_overhead_s=entry.overhead_s,
        belief_factor=factor,
        belief_at=at,
    )


def progress_at(entry: BoardEntry, belief: Belief, total_steps: int, now: float) -> float:
    """Steps ``entry``'s job has done by ``now``: its row's, plus the time since at its size.

    A waiting or paused job (0 units) has not moved; nor has one whose speed is unknown.
    """
    elapsed = now - entry.heartbeat
    if entry.units <= 0 or elapsed <= 0:
        return entry.done
    step = belief.median.step_time(entry.units)
    if not math.isfinite(step) or step <= 0:
        return entry.done
    return min(entry.done + elapsed / step, float(total_steps))


def _unknown(levels: Sequence[int]) -> Belief:
    """Nothing measured, no prior: no speed anywhere (nothing can be promised)."""
    from qosflow.core.predict import Belief
    from qosflow.core.speed import TableCurve

    none = TableCurve({})
    ordered = tuple(sorted(levels))
    return Belief(none, none, ordered, ordered[0], ())


def publish(entry: BoardEntry, belief: Belief | None, factor: float | None) -> BoardEntry:
    """``entry`` carrying ``belief`` (as tables) when one is known."""
    return replace(entry, belief=belief_to_dict(belief, factor)) if belief is not None else entry


class ClusterSide(TypedDict):
    """What :func:`allocate_on_board` needs to know of the cluster (see its arguments)."""

    free_units: int
    held_units: int
    total_units: int
    ended: tuple[str, ...]


def job_capacity(cluster: ClusterView, resources: Resources) -> tuple[Capacity, int]:
    """The cluster's capacity in the job's units, and the largest size whose pods fit now.

    (:mod:`qosflow.core.placement`: a worker is a pod of ``per_worker`` CPUs or GPUs; pods
    fit whole on nodes, so free units spread over nodes may make a smaller job than their sum.)
    """
    from qosflow.core.placement import job_capacity as in_job_units
    from qosflow.core.placement import placeable, pod_unit

    raw = cluster.capacity(pod_unit(resources))
    return in_job_units(resources, raw), placeable(resources, raw)


def cluster_side(cluster: ClusterView, resources: Resources, active: Admitted) -> ClusterSide:
    """The cluster's side of an allocation, for a step that read ``active`` from it just now.

    The units qosflow jobs hold are the cluster's own count (``active``), not the board rows'
    (a row may lag its job by a poll); the jobs the cluster shows done leave the board. The free
    units are at most what this job's pods can be placed in (:func:`job_capacity`).
    """
    from qosflow_airflow.admitted import succeeded_jobs

    capacity, fits = job_capacity(cluster, resources)
    fragmented = fits < min(capacity.free, resources.max)  # free units its pods cannot use
    return ClusterSide(
        free_units=fits if fragmented else capacity.free,
        held_units=active.held_units + active.own_units,
        total_units=capacity.total,
        ended=tuple(sorted(succeeded_jobs(cluster))),
    )


def allocate_on_board(
    board: JobBoard,
    mine: BoardEntry,
    *,
    now: float,
    free_units: int,
    plan_factor: float | None,
    ended: Collection[str] = (),
    held_units: int | None = None,
    total_units: int | None = None,
) -> BoardAnswer:
    """Write ``mine``, allocate the namespace's cluster, write this job's answer; return it.

    ``mine`` keeps the allocator's memory of the job from its previous row (a step only brings
    what it measured). ``free_units``: the cluster's free units of the job's kind now.
    ``ended``: jobs the cluster shows done (their finish step may not have run): off the board.
    ``held_units``: units qosflow's active workflows hold on the cluster (``None``: what the
    board's rows say they hold; a row may lag its job by a poll); ``total_units``: the cluster's
    size, a cap on free plus held (a pending pod counted as held may hold nothing yet).
    """
    with board.session(now) as session:
        for job_id in ended:
            if job_id != mine.job_id and (row := session.get(job_id)) is not None and row.active:
                session.finish(job_id)
        previous = session.get(mine.job_id)
        if previous is not None:
            mine = replace(
                mine,
                state=previous.state,
                target=previous.target,
                klass=previous.klass or mine.klass,
                guaranteed=previous.guaranteed,
                belief=mine.belief or previous.belief,
            )
        session.put(mine)
        entries = [e for e in session.entries(mine.unit) if e.active]
        held = sum(e.units for e in entries) if held_units is None else held_units
        capacity = free_units + held
        if total_units is not None:
            capacity = min(capacity, total_units)
        memory = Memory.of(arrival_from_dict(a) for a in session.arrivals(mine.unit))
        cluster = ClusterInput(
            now=now,
            capacity=max(capacity, 1),
            slot_s=SLOT_S,
            jobs=tuple(job_input(e, now) for e in entries),
            freed=_freed(session, mine, previous),
            plan_factor=plan_factor,
            arrivals=memory.arrivals,
        )
        out = allocate(cluster)
        kept = remember(memory, out.arrived, now)  # as in the simulator
        if kept is not memory:  # a new arrival (a job whose row expired and came back is not)
            session.keep_arrivals(mine.unit, [arrival_to_dict(a) for a in kept.arrivals])
        answer = out.jobs.get(mine.job_id)
        if answer is not None:
            session.put(_answered(mine, answer))
        else:  # rejected: its spec says reject; it leaves the board
            session.finish(mine.job_id)
        for e in entries:  # the allocation is the cluster's: every job's answer is kept
            if e.job_id != mine.job_id and (other := out.jobs.get(e.job_id)) is not None:
                session.decide(_answered(e, other))
        rank = RANK.get(answer.klass, 99) if answer is not None else -1
        below = sum(e.units for e in entries if RANK.get(e.klass, 99) > rank)
        climbed = previous is not None and bool(previous.state.get("profiling"))
        profiled = climbed and (answer is None or not answer.state.profiling)
        return BoardAnswer(answer, out, cluster.capacity, below, profiled)


def _answered(entry: BoardEntry, answer: JobAllocation) -> BoardEntry:
    """``entry`` carrying the allocator's answer for its job (and its memory of the job)."""
    return replace(
        entry,
        target=answer.units,
        klass=answer.klass,
        guaranteed=answer.guaranteed,
        reason=answer.reason,
        state=state_to_dict(answer.state),
    )


def _freed(session: BoardSession, mine: BoardEntry, previous: BoardEntry | None) -> bool:
    """A job of this kind ended since this job's previous allocation (waiting jobs ask again)."""
    since = previous.heartbeat if previous is not None else math.inf
    return any(
        e.finished_at is not None and e.finished_at > since for e in session.entries(mine.unit)
    )


def finish_on_board(board: JobBoard, job_id: str, *, now: float) -> None:
    """The job ended: its units are free for the others from now on."""
    with board.session(now) as session:
        session.finish(job_id)
