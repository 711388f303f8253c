"""From the cluster allocator's answer to the one action a job's own step takes now.

:func:`qosflow.core.allocator.allocate` says what every job *should* hold; each job's watch acts
on its own job only, and only when acting changes something (a round of the unrolled control
loop is spent only by a real action):

* **shrink** (``scale_down``): the target is below what the job holds: give the units back now
  (a target of 0 pauses it: checkpoint and stop; its deadline still counts on the board);
* **grow** (``scale_up``): the target is above what it holds and the extra units are free now
  (for a paused job: resume at the target); when they are not free yet, it waits for the job
  that gives them back (within one poll interval of the allocation changing);
* **bump**: a waiting job whose class rose gets its Argo priority and class patched; a running
  job is restarted into a higher class only when that class preempts *and* lower-priority work
  actually holds the units it needs (otherwise the restart only costs time);
* anything else is ``on_track``: keep watching, spend no round.
"""

from __future__ import annotations

from collections.abc import Callable

from qosflow.core.allocator import JobAllocation
from qosflow.core.decide import Action, Decision, JobSnapshot, margin_for
from qosflow.core.predict import Belief, predict
from qosflow.core.priority import by_name


def steer(
    snap: JobSnapshot,
    belief: Belief,
    allocation: JobAllocation,
    *,
    free_units: int,
    held_below: int,
    current_class: str,
    paused: bool = False,
) -> Decision:
    """The action for one job now.

    Args:
        snap: The job now (``units``: what it holds or, waiting, what it asked for).
        belief: Its speed belief.
        allocation: The allocator's answer for it.
        free_units: Units free on the cluster now.
        held_below: Units held by jobs of a lower class than the allocation's (what preempting
            could free).
        current_class: The PriorityClass its workflow runs with.
        paused: It was paused (target 0) and holds nothing.
    """
    target, margin = allocation.units, margin_for(snap.spec, snap.now)
    holds = 0 if paused else snap.held
    pred = predict(
        belief,
        now=snap.now,
        steps_done=snap.steps_done,
        total_steps=snap.spec.total_steps,
        units=max(target, 1),
        current_units=holds,
        overhead_s=snap.rescale_overhead_s,
    )

    def decision(action: Action, units: int, why: str) -> Decision:
        reason = f"{why}; allocator: {allocation.reason}"
        return Decision(
            action, units, reason, pred.median_finish, pred.conservative_finish,
            snap.spec.deadline, margin, allocation.klass,
        )  # fmt: skip

    if holds and target < holds:
        what = "pause (checkpoint and stop)" if target == 0 else f"give back {holds - target}"
        return decision(Action.SCALE_DOWN, target, f"{what}: the cluster allocator's target")
    if target > holds and (holds or paused):
        extra = target - holds
        if extra <= free_units:
            how = "resume" if paused else f"take {extra} free units"
            return decision(Action.SCALE_UP, target, f"{how}: the target is {target} units")
        return _wait_or_preempt(
            decision, allocation, extra, free_units, held_below, current_class, holds
        )
    wanted, current = by_name(allocation.klass), by_name(current_class)
    rises = wanted is not None and current is not None and wanted.value > current.value
    if snap.queued and rises and not paused:  # a paused job has no workflow to patch
        return decision(Action.BUMP, target or snap.units, f"queued: raise to {allocation.klass}")
    return decision(Action.ON_TRACK, holds or snap.units, "keep: the allocation holds")


def _wait_or_preempt(
    make: Callable[[Action, int, str], Decision],
    allocation: JobAllocation,
    extra: int,
    free_units: int,
    held_below: int,
    current_class: str,
    holds: int,
) -> Decision:
    """Not enough free units for the target: preempt only when it pays, else wait."""
    wanted, current = by_name(allocation.klass), by_name(current_class)
    rises = wanted is not None and current is not None and wanted.value > current.value
    if wanted is not None and wanted.preempts and rises and extra <= free_units + held_below:
        why = (
            f"{extra} more units needed, {free_units} free, {held_below} held by lower classes: "
            f"restart into {allocation.klass} to preempt them"
        )
        return make(Action.BUMP, allocation.units, why)  # restart at the target, preempting
    return make(
        Action.ON_TRACK, holds, f"wait: {extra} more units needed, {free_units} free (others give "
        "them back)"
    )  # fmt: skip
