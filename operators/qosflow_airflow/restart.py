"""Checkpoint-restart of a running job into a new segment: stop → verify → resubmit with resume.

Used by the rescale step (new size) and the priority bump (new PriorityClass, which a running pod
cannot change). It only talks to the ``Actuator``/``ClusterView`` Protocols, so it is the same code
on a real cluster, the local cluster and in tests. Guarantees:

* never two segments running: the old segment is stopped and seen ended before the next is created,
  and a running segment other than the old one aborts the restart;
* never losing progress: the new segment resumes from the checkpoint, and the stop must report a
  step count no lower than the last one observed;
* idempotent: a retried step that finds the next segment already created re-attaches to it, and
  so does the loser of two tries racing (both stop the old segment, one creates the next): it finds
  the winner's segment instead of failing; the state then says where the job was stopped
  (``resumed_from``: the old segment's last step), not how far the new segment has come;
* not stalled by a stop that ends ``Failed``: when the stopped segment still reported progress at
  or beyond what was observed (it checkpointed on SIGTERM), the next segment resumes from it; only
  a segment that failed with no usable progress raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qosflow.core.cluster import Actuator, ClusterView, JobStatus, Phase, SubmitRequest
from qosflow.core.errors import ClusterError
from qosflow_airflow.state import TrainingState

SHUTDOWN = "Stopped with strategy"
"""How Argo (and the local cluster) words the message of a workflow ended by a stop."""


class Cluster(ClusterView, Actuator, Protocol):
    """A cluster that can be both observed and acted on (``ArgoCluster``)."""


@dataclass(frozen=True, slots=True)
class Restart:
    """What a checkpoint-restart did.

    Attributes:
        state: The state after the restart (the new segment, or the old one if it had finished).
        status: The new segment's status, or the old one's if no restart was needed.
        resumed_from: Step count the old segment stopped at (its last checkpoint), also on a
            re-attach.
        finished: True when the old segment had already finished the job (nothing resubmitted).
    """

    state: TrainingState
    status: JobStatus
    resumed_from: int
    finished: bool


def submit_request(
    state: TrainingState, *, segment: int, resume: bool, plan: str | None = None
) -> SubmitRequest:
    """The submit request of a segment of the state's job, at the state's size and priority.

    The plan annotation is ``plan`` when given, else the state's (every segment carries it, so
    later admissions see the job's guarantee whichever segment runs).
    """
    spec = state.spec
    return SubmitRequest(
        job=state.name,
        segment=segment,
        units=state.units,
        unit=spec.resources.unit,
        total_steps=spec.total_steps,
        resume=resume,
        priority_class=state.priority_class,
        priority=state.priority,
        image=spec.image,
        command=spec.command,
        memory_per_unit=spec.resources.memory_per_unit,
        deadline=spec.deadline,
        checkpoint_dir=state.checkpoint_dir,
        checkpoint_every_steps=spec.checkpoint_every_steps,
        plan=state.plan if plan is None else plan,
        pod=spec.pod,
        checkpoint=spec.checkpoint,
        launcher=spec.launcher,
        per_node=spec.resources.per_node,
        worker_unit=spec.resources.worker_unit,
        per_worker=spec.resources.per_worker,
    )


def _existing(cluster: ClusterView, job: str, segment: int) -> JobStatus | None:
    for status in cluster.list_jobs(job):
        if status.segment == segment:
            return status
    return None


def _usable(state: TrainingState, before: JobStatus, stopped: JobStatus) -> int:
    """The step the next segment resumes from; raise when the stop left nothing usable."""
    seen = before.steps_done or 0
    at = stopped.steps_done
    if stopped.phase is Phase.FAILED and (at is None or at <= 0 or at < seen):
        raise ClusterError(
            f"{state.workflow} failed while stopping with no usable checkpoint "
            f"(last step {at}, {seen} observed before): {stopped.message or 'no message'}"
        )
    if not stopped.phase.finished:
        raise ClusterError(f"{state.workflow} did not stop (phase {stopped.phase.value})")
    at = at or 0
    if at < seen:
        raise ClusterError(
            f"{state.workflow} stopped at step {at}, behind the {seen} already observed: "
            "refusing to resume from a stale checkpoint"
        )
    return at


def _reattach(
    cluster: ClusterView, state: TrainingState, new_state: TrainingState
) -> Restart | None:
    """The next segment, when another try (a retry, or a racing one) already created it."""
    nxt = _existing(cluster, state.name, new_state.segment)
    if nxt is None:
        return None
    old = cluster.status(state.workflow)  # where the job was stopped, not the new one's progress
    at = old.steps_done or 0
    return Restart(new_state.evolve(resumed_from=at), nxt, at, finished=False)


def checkpoint_restart(
    cluster: Cluster,
    state: TrainingState,
    *,
    units: int,
    priority_class: str,
    priority: int,
    reason: str,
) -> Restart:
    """Stop the current segment (it checkpoints on SIGTERM) and resume in the next one.

    A stop that ends ``Failed`` (the pod exited non-zero after its SIGTERM checkpoint) still
    resumes when the segment reported progress at or beyond the last observed step. A try that
    finds the next segment made by another try re-attaches to it.

    Raises:
        ClusterError: When the old segment failed with no usable progress or reported less
            progress than before; retryable when a segment other than the next is still running.
    """
    spec = state.spec
    job = state.name
    nxt = state.segment + 1
    new_state = state.evolve(
        segment=nxt,
        workflow=f"{job}-s{nxt}",
        units=units,
        priority_class=priority_class,
        priority=priority,
        last_rescale_at=cluster.now(),
    )
    again = _reattach(cluster, state, new_state)
    if again is not None:  # a retried try: the next segment exists already
        return again
    before = cluster.status(state.workflow)
    if before.phase is Phase.SUCCEEDED:
        return Restart(state, before, before.steps_done or spec.total_steps, finished=True)
    if before.phase is Phase.FAILED and SHUTDOWN not in before.message:
        # failed on its own, not stopped by us (nor by a racing try): not ours to resume
        raise ClusterError(f"{state.workflow} failed: {before.message or 'no message'}")
    stopped = before if before.phase.finished else cluster.stop(state.workflow, message=reason)
    if stopped.phase is Phase.SUCCEEDED:
        return Restart(state, stopped, stopped.steps_done or spec.total_steps, finished=True)
    at = _usable(state, before, stopped)
    running = [s.name for s in cluster.list_jobs(job) if not s.phase.finished]
    if running == [new_state.workflow]:  # a racing try created it between our checks
        return Restart(new_state.evolve(resumed_from=at), cluster.status(running[0]), at, False)
    if running:
        raise ClusterError(
            f"segments still running: {', '.join(running)}; not resubmitting", retryable=True
        )
    status = cluster.submit(submit_request(new_state, segment=nxt, resume=True))
    return Restart(new_state.evolve(resumed_from=at), status, at, finished=False)


def checkpoint_pause(cluster: Cluster, state: TrainingState, *, reason: str) -> Restart:
    """Stop the current segment (it checkpoints on SIGTERM) and submit nothing: a pause.

    The cluster allocator gave the job 0 units: its deadline still counts on the job board, and
    its own watch resumes it (:func:`checkpoint_restart` from the stopped segment) when units
    come back. The state keeps the stopped workflow and says 0 units.

    Raises:
        ClusterError: When the segment failed with no usable progress.
    """
    before = cluster.status(state.workflow)
    if before.phase is Phase.SUCCEEDED:
        return Restart(state, before, before.steps_done or state.spec.total_steps, finished=True)
    if before.phase is Phase.FAILED and SHUTDOWN not in before.message:
        raise ClusterError(f"{state.workflow} failed: {before.message or 'no message'}")
    stopped = before if before.phase.finished else cluster.stop(state.workflow, message=reason)
    if stopped.phase is Phase.SUCCEEDED:
        return Restart(state, stopped, stopped.steps_done or state.spec.total_steps, finished=True)
    at = _usable(state, before, stopped)
    paused = state.evolve(units=0, last_rescale_at=cluster.now(), resumed_from=at)
    return Restart(paused, stopped, at, finished=False)


def newest_segment(cluster: ClusterView, state: TrainingState) -> TrainingState:
    """``state`` moved on to the job's newest segment on the cluster.

    A retried finish step starts from the rounds' state (a failed try's XCom and defer kwargs are
    gone), but its earlier try may have resized the job in place, restarted it into later
    segments or paused it. The cluster still knows: the job's workflows carry its label. A newest
    segment that we stopped and did not follow with another is a pause (0 units), resumed by the
    watch as usual.
    """
    later = [s for s in cluster.list_jobs(state.name) if s.segment >= state.segment]
    if not later:
        return state
    newest = max(later, key=lambda s: s.segment)
    if newest.segment == state.segment:  # the same segment, maybe resized in place since
        moved = state.evolve(units=newest.units or state.units)
    else:
        moved = state.evolve(
            segment=newest.segment,
            workflow=newest.name,
            units=newest.units or state.units,
            priority_class=newest.priority_class or state.priority_class,
            priority=newest.priority or state.priority,
        )
    stopped = newest.phase is Phase.STOPPED or (
        newest.phase is Phase.FAILED and SHUTDOWN in newest.message
    )
    if stopped:
        return moved.evolve(units=0, resumed_from=newest.steps_done or 0)
    return moved
