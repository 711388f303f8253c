"""The watch: live progress of one workflow turned into at most one actionable event.

``Watcher`` is what the deferrable trigger (and the sensor in poke mode) runs on every poll. It
keeps the progress samples, fits the speed model, predicts and decides through the core
(:func:`qosflow.core.planning.belief_for`, :func:`qosflow.core.decide.decide`) and reports **one** event:

* ``done`` when the workflow succeeded;
* ``failed`` when it failed or was stopped by someone else (with the pod's message);
* ``decision`` when an actionable decision (anything but ``on_track``) has held for the dwell time.

It never reads a clock: the time of each observation comes from the cluster (``ClusterView.now``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

from qosflow.core.cluster import Actuator, JobStatus, Phase
from qosflow.core.decide import Action, Decision, JobSnapshot, decide, margin_for
from qosflow.core.fit import Measured
from qosflow.core.planning import belief_for
from qosflow.core.predict import Belief, Calibration
from qosflow.core.spec import JobSpec, Unit
from qosflow.core.speed import ProgressSample, SpeedModel
from qosflow.core.steer import steer
from qosflow.core.usage import UsageReport, merge, share_between
from qosflow_airflow import metrics
from qosflow_airflow.state import DECISION, DONE, FAILED, json_safe, samples_to_rows

if TYPE_CHECKING:
    from qosflow_airflow.board import BoardAnswer

Allocator = Callable[["Watcher", Belief, JobSnapshot], "BoardAnswer"]
"""Runs the cluster allocator on the job board for the watched job (blocking I/O)."""
WatchPurpose = Literal["steer", "await_end"]
"""What a watch is for: steer the job for one round (:class:`Watcher`), or wait for its end
(:class:`EndWatch`, the finish step)."""
#: What a rescale costs (seconds of the job's time): an in-place CPU resize only makes the trainer
#: re-read its CPU set; a checkpoint-restart stops, resubmits, reloads and warms up.
IN_PLACE_OVERHEAD_S = 5.0
RESTART_OVERHEAD_S = 30.0


def rescale_overhead(cluster: Actuator, unit: Unit) -> float:
    """The cost of one rescale on this cluster for this unit kind (blocking: may ask the API)."""
    return IN_PLACE_OVERHEAD_S if cluster.supports_in_place_resize(unit) else RESTART_OVERHEAD_S


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """The one event a watch ends with.

    Attributes:
        status: ``done``, ``failed`` or ``decision``.
        workflow: The watched workflow.
        time: When it was observed (epoch seconds).
        decision: The decision (for ``done``: a ``done`` decision with the finish time).
        message: The failure message, or the decision's reason.
        samples: Progress samples observed during this watch.
        finished_at: When the workflow finished, for ``done`` and ``failed``.
        units: The job's size when the event was taken.
    """

    status: str
    workflow: str
    time: float
    decision: Decision | None
    message: str
    samples: tuple[ProgressSample, ...]
    finished_at: float | None = None
    units: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (the trigger event payload)."""
        return cast(
            "dict[str, Any]",
            json_safe(
                {
                    "status": self.status,
                    "workflow": self.workflow,
                    "time": self.time,
                    "decision": None if self.decision is None else self.decision.to_dict(),
                    "message": self.message,
                    "samples": samples_to_rows(self.samples),
                    "finished_at": self.finished_at,
                    "units": self.units,
                }
            ),
        )


@dataclass(slots=True)
class EndWatch:
    """Waits for the end of a workflow (the finish step): records samples, decides nothing.

    Attributes:
        spec: The job.
        workflow: The workflow to watch.
        history: Samples from earlier rounds (used for the fit, not reported again).
        samples: Progress samples observed during this watch.
        usage: The pod's usage reports seen so far (:mod:`qosflow.core.usage`): each sample gets
            the CPU share the job got over the interval before it, so the fit can leave out
            windows in which something else held the job's CPUs.
    """

    spec: JobSpec
    workflow: str
    history: Sequence[ProgressSample] = ()
    samples: list[ProgressSample] = field(default_factory=list)
    usage: list[UsageReport] = field(default_factory=list)

    def observe(
        self,
        status: JobStatus,
        *,
        now: float,
        free_units: int,
        usage: Sequence[UsageReport] = (),
    ) -> WatchEvent | None:
        """Take one observation of the workflow (and the pod's new usage reports, if any).

        Returns:
            The event when the watch is over, else ``None``.
        """
        if usage:
            self.usage = merge(self.usage, usage)
        self._record(status, now)
        return self._ended(status, now) if status.phase.finished else None

    def observed(self) -> tuple[ProgressSample, ...]:
        """This watch's samples, each with the CPU share of the interval before it (if known)."""
        out: list[ProgressSample] = []
        for i, s in enumerate(self.samples):
            share = s.share
            if share is None and i and self.usage:
                share = share_between(self.usage, self.samples[i - 1].time, s.time)
            out.append(replace(s, share=share) if share != s.share else s)
        return tuple(out)

    def _record(self, status: JobStatus, now: float) -> None:
        if status.steps_done is None or status.phase is Phase.PENDING:
            return
        last = self.samples[-1] if self.samples else None
        if last is None or last.steps_done != status.steps_done or last.units != status.units:
            pods = self.spec.resources.layout(status.units).pods if status.units else 1
            self.samples.append(ProgressSample(now, status.steps_done, status.units, pods=pods))

    def _ended(self, status: JobStatus, now: float) -> WatchEvent:
        finished = status.finished_at if status.finished_at is not None else now
        samples = self.observed()
        if status.phase is Phase.SUCCEEDED:
            margin = margin_for(self.spec, finished)
            done = Decision(
                action=Action.DONE,
                units=status.units,
                reason=f"workflow {status.name} succeeded after {self.spec.total_steps} steps",
                median_finish=finished,
                conservative_finish=finished,
                deadline=self.spec.deadline,
                margin=margin,
            )
            return WatchEvent(
                DONE, self.workflow, now, done, done.reason, samples, finished, status.units
            )
        detail = status.message or f"workflow ended in phase {status.phase.value}"
        message = f"training workflow {status.name} {status.phase.value.lower()}: {detail}"
        return WatchEvent(FAILED, self.workflow, now, None, message, samples, finished)


@dataclass(slots=True)
class Watcher(EndWatch):
    """Steers a workflow for one round: fits, decides, and reports a decision once it has held.

    Attributes (beside :class:`EndWatch`'s):
        last_rescale_at: When the size last changed (for the core's dwell rule).
        prior: Speed model from the history store, if any.
        known: What the history the prior was fitted on measured, by size: those sizes count as
            observed for the probe rule and their medians anchor the belief.
        timings: The key's users' timings above one node, newest first
            (``HistoryStore.timings``): one window each, where no run measured.
        calibration: Conformal calibration from the history store.
        hold_s: How long an actionable decision must hold before it is reported.
        min_samples: Samples at the current size needed before any actionable decision.
        rescale_overhead_s: What a rescale costs here (see :func:`rescale_overhead`).
        allocator: Runs the core's cluster allocator on the job board for this job (blocking
            I/O, see ``qosflow_airflow.board``); ``None``: the job decides for itself alone
            (:func:`qosflow.core.decide.decide`).
        priority_class: The class the job's workflow runs with.
        paused: The job was paused by the allocator (it holds nothing; its last segment was
            stopped): the watch waits for units to come back instead of ending.
        held: The actionable decision being held, since ``held_since``.
    """

    last_rescale_at: float | None = None
    prior: SpeedModel | None = None
    known: tuple[Measured, ...] = ()
    timings: tuple[Measured, ...] = ()
    calibration: Calibration = field(default_factory=Calibration)
    hold_s: float = 0.0
    min_samples: int = 2
    rescale_overhead_s: float = RESTART_OVERHEAD_S
    allocator: Allocator | None = None
    priority_class: str = ""
    paused: bool = False
    held: Decision | None = None
    held_since: float = 0.0

    def observe(
        self,
        status: JobStatus,
        *,
        now: float,
        free_units: int,
        usage: Sequence[UsageReport] = (),
    ) -> WatchEvent | None:
        """Take one observation of the workflow (and the pod's new usage reports, if any).

        Returns:
            The event when the watch is over, else ``None``.
        """
        if self.paused and status.phase is Phase.STOPPED:
            status = replace(status, phase=Phase.PENDING, units=0)  # waiting for its units
        ended = EndWatch.observe(self, status, now=now, free_units=free_units, usage=usage)
        if ended is not None or status.phase.finished:
            return ended
        if not self.paused and not self._enough(status.units) and status.phase is Phase.RUNNING:
            return None
        decision = self.decide(status, now=now, free_units=free_units)
        metrics.predicted(self.spec.key, decision, now=now)
        if decision.action in (Action.ON_TRACK, Action.DONE) or not math.isfinite(
            decision.median_finish
        ):  # nothing to do, or no steady speed measured yet: keep watching
            self.held = None
            return None
        if self.held is None or self.held.action != decision.action:
            self.held, self.held_since = decision, now
        else:
            self.held = decision
        if now - self.held_since < self._hold(decision):
            return None
        return WatchEvent(
            DECISION,
            self.workflow,
            now,
            decision,
            decision.reason,
            self.observed(),
            units=status.units,
        )

    def decide(self, status: JobStatus, *, now: float, free_units: int) -> Decision:
        """The core's decision on everything observed so far.

        With an :attr:`allocator`, the cluster allocator's answer for this job, turned into the
        one action that changes something now (:func:`qosflow.core.steer.steer`); alone, the
        job's own decision (:func:`qosflow.core.decide.decide`).
        """
        belief = belief_for(
            self.spec,
            [*self.history, *self.observed()],
            prior=self.prior,
            calibration=self.calibration,
            known=self.known,
            timings=self.timings,
        )
        snap = JobSnapshot(
            spec=self.spec,
            now=now,
            steps_done=status.steps_done or 0,
            units=status.units,
            queued=status.phase is Phase.PENDING,
            last_rescale_at=self.last_rescale_at,
            rescale_overhead_s=self.rescale_overhead_s,
        )
        if self.allocator is None:
            return decide(snap, belief, free_units=free_units)
        answer = self.allocator(self, belief, snap)
        if answer.mine is None:  # the allocator refused it: its spec says reject
            return decide(snap, belief, free_units=free_units)
        return steer(
            snap,
            belief,
            answer.mine,
            free_units=free_units,
            held_below=answer.held_below,
            current_class=self.priority_class,
            paused=self.paused,
        )

    def _hold(self, decision: Decision) -> float:
        """How long ``decision`` must hold: giving units back to the allocator does not wait.

        The allocator gave them to a job that needs them (its own rules already keep sizes for
        the dwell time), so an ahead job lets go within one poll of the allocation changing;
        growing, and deciding alone, still wait for the decision to hold.
        """
        if self.allocator is not None and decision.action is Action.SCALE_DOWN:
            return 0.0
        return self.hold_s

    def _enough(self, units: int) -> bool:
        seen = [s for s in (*self.history, *self.samples) if s.units == units]
        return len(seen) >= self.min_samples
