"""The decision: what to do with one deadline job this round, with the reason in words.

Rules (DESIGN §3):

* the minimal satisfactory share ``n*`` is the smallest allowed level, at most the knee, whose
  conservative finish is at or before ``deadline - margin``; ``margin = max(margin_seconds, 5 % of
  the time left)``;
* ``scale_up`` at once to ``n*`` when the extra units are free (at most one level beyond the
  largest observed size: a probe); ``bump`` (raise priority) when they are not free or the job is
  still queued;
* ``scale_down`` only when a smaller level (below the observed sizes: judged by a linear
  slow-down) finishes by ``deadline - 2 * margin``, the dwell
  time since the last rescale has passed, and the units given back for the rest of the run are
  worth more than ``3 x overhead x current units``;
* when no size is known to make it but levels up to the knee are still unexplored, probe upwards
  (``scale_up``/``bump`` one level beyond the largest observed size): beyond the observed sizes
  the belief is deliberately pessimistic, so "cannot make it" is not yet known;
* at most one rescale per dwell period; ``at_risk`` when even the fastest plannable size
  (:meth:`~qosflow.core.predict.Belief.fastest_plannable`: up to the knee, probe-limited, the
  shortest conservative step time) cannot make it (its ``units`` is then the size to run at now:
  that size within the free units, or the current size during the dwell);
* ``done`` once every step is done; ``on_track`` otherwise (including "hold": a needed rescale
  waits for the dwell to pass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal

from qosflow.core.errors import SpecError
from qosflow.core.predict import Belief, Prediction, finish_on, predict, restart_charge
from qosflow.core.spec import JobSpec
from qosflow.core.speed import knee
from qosflow.core.words import duration as _dur
from qosflow.core.words import unit_time

MARGIN_SHARE = 0.05
"""Share of the time left kept as margin (when larger than the absolute margin)."""
BENEFIT_FACTOR = 3.0
"""A scale-down must give back more than this many times the rescale cost in unit-seconds."""


class Action(StrEnum):
    """What the act step does."""

    DONE = "done"
    ON_TRACK = "on_track"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    BUMP = "bump"
    AT_RISK = "at_risk"


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """One job as the policy sees it this round.

    Attributes:
        spec: The job.
        now: Current time (epoch seconds).
        steps_done: Steps done so far.
        units: Size it holds (running) or asked for (queued).
        queued: True while it waits for capacity (no pod running).
        last_rescale_at: When it was last rescaled, ``None`` if never.
        rescale_overhead_s: Cost of a rescale (checkpoint, restart, warm-up) in seconds.
    """

    spec: JobSpec
    now: float
    steps_done: int
    units: int
    queued: bool
    last_rescale_at: float | None
    rescale_overhead_s: float = 30.0

    @property
    def held(self) -> int:
        """Units it holds: ``units`` while running, 0 while queued."""
        return 0 if self.queued else self.units


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of :func:`decide`.

    Attributes:
        action: What to do.
        units: Target size (for ``on_track``/``done``: the current size).
        reason: One sentence with the numbers behind it.
        median_finish: Median finish at ``units`` (epoch seconds).
        conservative_finish: Conservative finish at ``units``.
        deadline: The job's deadline.
        margin: The safety margin used.
        priority_class: The class the job should run with (the cluster allocator's), when one
            was decided; ``None``: the acting step works it out from the job's laxity.
    """

    action: Action
    units: int
    reason: str
    median_finish: float
    conservative_finish: float
    deadline: float
    margin: float
    priority_class: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for XCom); non-finite times become ``None``."""
        return {
            "action": self.action.value,
            "units": self.units,
            "reason": self.reason,
            "median_finish": _json_time(self.median_finish),
            "conservative_finish": _json_time(self.conservative_finish),
            "deadline": _json_time(self.deadline),
            "margin": self.margin,
            "priority_class": self.priority_class,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """Inverse of :meth:`to_dict`.

        Raises:
            SpecError: Naming the field when ``d`` is not a decision.
        """
        try:
            action = Action(d["action"])
        except (KeyError, ValueError):
            raise SpecError(
                "decision.action", f"must be one of {[a.value for a in Action]}"
            ) from None
        try:
            return cls(
                action,
                int(d["units"]),
                str(d["reason"]),
                _from_json_time(d["median_finish"]),
                _from_json_time(d["conservative_finish"]),
                _from_json_time(d["deadline"]),
                float(d["margin"]),
                None if d.get("priority_class") is None else str(d["priority_class"]),
            )
        except KeyError as exc:
            raise SpecError(f"decision.{exc.args[0]}", "is required") from None
        except (TypeError, ValueError) as exc:
            raise SpecError("decision", f"malformed: {exc}") from None


def _json_time(t: float) -> float | None:
    return t if math.isfinite(t) else None


def _from_json_time(v: Any) -> float:
    return math.inf if v is None else float(v)


def margin_for(spec: JobSpec, now: float) -> float:
    """Safety margin: ``max(spec.margin_seconds, 5 % of the time left)``."""
    left = spec.deadline - now
    if not math.isfinite(left):
        return float(spec.margin_seconds)
    share = MARGIN_SHARE * left if left > 0.0 else 0.0  # max() is slow at millions of calls
    return float(spec.margin_seconds if spec.margin_seconds >= share else share)


def _at(belief: Belief, snap: JobSnapshot, n: int) -> Prediction:
    """Prediction at ``n`` units, with the restart the plan charges for a change of size."""
    return predict(
        belief,
        now=snap.now,
        steps_done=snap.steps_done,
        total_steps=snap.spec.total_steps,
        units=n,
        current_units=snap.held,
        overhead_s=snap.rescale_overhead_s,
    )


def minimal_share(belief: Belief, snap: JobSnapshot) -> int | None:
    """Smallest level up to the knee whose conservative finish is by ``deadline - margin``.

    The finish is :func:`_at`'s conservative one, taken with
    :func:`~qosflow.core.predict.finish_on` without a :class:`~qosflow.core.predict.Prediction`
    per level (the allocator asks for every job at every decision).
    """
    belief = _within_spec(belief, snap.spec)
    target = snap.spec.deadline - margin_for(snap.spec, snap.now)
    remaining = max(snap.spec.total_steps - snap.steps_done, 0)
    held, overhead = snap.held, snap.rescale_overhead_s if remaining else 0.0
    for n in belief.levels:
        if n > belief.knee:
            break
        start = snap.now + restart_charge(overhead, held, n)
        if finish_on(belief.conservative, start, remaining, n) <= target:
            return n
    return None


def _decision(
    action: Action, pred: Prediction, reason: str, snap: JobSnapshot, margin: float
) -> Decision:
    return Decision(
        action,
        pred.units,
        reason,
        pred.median_finish,
        pred.conservative_finish,
        snap.spec.deadline,
        margin,
    )


def _in_dwell(snap: JobSnapshot) -> bool:
    last = snap.last_rescale_at
    return last is not None and snap.now - last < snap.spec.dwell_seconds


def _finish_words(pred: Prediction, snap: JobSnapshot) -> str:
    return (
        f"conservative finish at {pred.units} units in {_dur(pred.conservative_finish - snap.now)} "
        f"(median {_dur(pred.median_finish - snap.now)})"
    )


def _budget_words(snap: JobSnapshot, margin: float, finish: float | None = None) -> str:
    left = snap.spec.deadline - snap.now
    return f"{_dur(left, against=finish)} left to the deadline, margin {_dur(margin)}"


def _versus(pred: Prediction, snap: JobSnapshot, margin: float, verb: str) -> str:
    """``finish ... <verb> ... left``: the two durations never print equal when they differ."""
    finish, left = pred.conservative_finish - snap.now, snap.spec.deadline - snap.now
    return (
        f"conservative finish at {pred.units} units in {_dur(finish, against=left)} "
        f"(median {_dur(pred.median_finish - snap.now)}) {verb} "
        f"{_budget_words(snap, margin, finish)}"
    )


def _probe_words(belief: Belief, target: int, need: int | None) -> str:
    top = max(belief.observed) if belief.observed else None
    if top is None or (need is not None and target >= need):
        return ""
    wanted = f"{need} needed" if need is not None else "no observed size makes it"
    return f" (probe: one level beyond the largest observed size {top}; {wanted})"


_Case = Literal[
    "done", "best_effort", "measuring", "queued", "unmeasured", "dwell", "free", "busy",
    "at_risk", "shrink", "too_big", "meets",
]  # fmt: skip
"""Which case of the rules chose a decision (the key of its words)."""
_Choice = tuple[Action, int, _Case]
"""An action, its size and the case of the rule that chose them."""


def _conservative(belief: Belief, snap: JobSnapshot, n: int) -> float:
    """:func:`_at`'s conservative finish at ``n``, without a :class:`Prediction`.

    Only for a job with steps left (:func:`_choose` asks it past the ``done`` case).
    """
    start = snap.now + restart_charge(snap.rescale_overhead_s, snap.held, n)
    return finish_on(belief.conservative, start, max(snap.spec.total_steps - snap.steps_done, 0), n)


def _grow_to(snap: JobSnapshot, belief: Belief, need: int | None) -> tuple[int, int]:
    """``(goal, target)`` of a scale-up towards ``need`` (``None``: the probe limit).

    The target stops at the probe limit, or at the current size when that is larger.
    """
    goal = need if need is not None else belief.probe_limit
    return goal, min(goal, max(belief.probe_limit, snap.units))


def _grow(snap: JobSnapshot, belief: Belief, need: int | None, free_units: int) -> _Choice:
    """Scale up towards ``need`` (``None``: probe upwards because no size is known to make it)."""
    target = _grow_to(snap, belief, need)[1]
    if snap.queued:
        return Action.BUMP, target, "queued"
    if target <= snap.units:  # the current size is not measured yet: the probe rule waits
        return Action.ON_TRACK, snap.units, "unmeasured"
    if _in_dwell(snap):
        return Action.ON_TRACK, snap.units, "dwell"
    if target - snap.units <= free_units:
        return Action.SCALE_UP, target, "free"
    return Action.BUMP, target, "busy"


def _shrink(snap: JobSnapshot, belief: Belief, margin: float) -> int | None:
    """The smaller size a scale-down gives the job, or ``None`` (module docstring)."""
    if _in_dwell(snap) or snap.queued:
        return None
    # never below the observed range on the strength of the prior alone: belief_from_fit makes
    # the conservative step time there at least a linear slow-down from the smallest observed size
    top = max(belief.observed) if belief.observed else belief.levels[-1]
    goal = snap.spec.deadline - 2.0 * margin
    remaining = max(snap.spec.total_steps - snap.steps_done, 0)
    for n in belief.levels:
        if n >= snap.units or n > top:
            return None
        start = snap.now + restart_charge(snap.rescale_overhead_s, snap.held, n)
        if finish_on(belief.conservative, start, remaining, n) > goal:
            continue
        freed = (snap.units - n) * max(
            finish_on(belief.median, start, remaining, n) - snap.now, 0.0
        )
        return n if freed > BENEFIT_FACTOR * snap.rescale_overhead_s * snap.units else None
    return None


def _at_risk(snap: JobSnapshot, belief: Belief, free_units: int) -> int:
    """Even the fastest plannable size misses: the size to run at now (as fast as reachable)."""
    cap = belief.fastest_plannable(snap.units)
    reach = cap if snap.queued else min(cap, snap.units + max(free_units, 0))
    if _in_dwell(snap) and not snap.queued:
        return snap.units
    fits = [n for n in belief.levels if n <= reach]
    return fits[-1] if fits else belief.levels[0]


def _choose(
    snap: JobSnapshot, belief: Belief, margin: float, share: int | bool | None, free_units: int
) -> tuple[Action, int, _Case, int | None]:
    """The rules of the module docstring: the action, the size, the case and the minimal share.

    Builds no :class:`Prediction`: :func:`decide` builds one at the chosen size, and the cluster
    allocator, which reads only the size (:func:`decided_units`), none.
    """
    spec = snap.spec
    if snap.steps_done >= spec.total_steps:
        return Action.DONE, snap.units, "done", None
    if not math.isfinite(spec.deadline):
        return Action.ON_TRACK, snap.units, "best_effort", None
    if not belief.any_speed:
        return Action.ON_TRACK, snap.units, "measuring", None
    need = minimal_share(belief, snap) if share is False else share
    if need is None and snap.units < belief.probe_limit < belief.knee:
        return (*_grow(snap, belief, None, free_units), None)  # unexplored: may make it
    if need is None:
        return Action.AT_RISK, _at_risk(snap, belief, free_units), "at_risk", None
    if need > snap.units:
        return (*_grow(snap, belief, need, free_units), need)
    if need < snap.units:
        down = _shrink(snap, belief, margin)
        if down is not None:
            return Action.SCALE_DOWN, down, "shrink", need
        # the current size (above the knee) misses; a smaller one makes it, not by twice the margin
        if _conservative(belief, snap, snap.units) > spec.deadline - margin:
            return Action.AT_RISK, snap.units if _in_dwell(snap) else need, "too_big", need
    return Action.ON_TRACK, snap.units, "meets", need


def _grow_words(
    case: _Case, snap: JobSnapshot, belief: Belief, margin: float, need: int | None, free_units: int
) -> str:
    """Why a job grows, or holds where it would grow (the cases of :func:`_grow`)."""
    goal, target = _grow_to(snap, belief, need)
    why = _versus(_at(belief, snap, snap.units), snap, margin, "misses")
    probe = _probe_words(belief, target, need)
    if case == "queued":
        return f"queued; {why}; raise priority to start at {target} units{probe}"
    if case == "unmeasured":
        return (
            f"hold: {why}; {snap.units} units are not measured yet and the probe rule "
            f"allows at most one level beyond the largest observed size ({goal} needed)"
        )
    if case == "dwell":
        ago = snap.now - (snap.last_rescale_at or snap.now)
        return (
            f"hold: {why}; the last rescale was {_dur(ago)} ago, within the "
            f"{_dur(snap.spec.dwell_seconds)} dwell, so scale to {target} units in "
            f"{_dur(snap.spec.dwell_seconds - ago)}{probe}"
        )
    extra = target - snap.units
    if case == "free":
        pred = _at(belief, snap, target)
        return (
            f"{why}; {extra} of {free_units} free units make it {target}{probe}: "
            f"{_finish_words(pred, snap)}"
        )
    return (
        f"{why}; {target} units needed but only {free_units} of the {extra} extra are "
        f"free: raise priority{probe}"
    )


def _words(
    case: _Case,
    pred: Prediction,
    snap: JobSnapshot,
    belief: Belief,
    margin: float,
    need: int | None,
    free_units: int,
) -> str:
    """The reason in words for the case :func:`_choose` took; ``pred`` is at the chosen size."""
    if case in ("queued", "unmeasured", "dwell", "free", "busy"):
        return _grow_words(case, snap, belief, margin, need, free_units)
    if case == "best_effort":
        return f"best-effort job without a deadline; {_finish_words(pred, snap)}"
    if case == "shrink":
        freed = (snap.units - pred.units) * max(pred.median_finish - snap.now, 0.0)
        cost = BENEFIT_FACTOR * snap.rescale_overhead_s * snap.units
        return (
            f"{_versus(pred, snap, margin, 'beats')} by twice the margin; "
            f"giving back {snap.units - pred.units} units frees "
            f"{unit_time(freed, against=cost)} (> {unit_time(cost, against=freed)} rescale cost)"
        )
    if case == "at_risk":
        cap = belief.fastest_plannable(snap.units)
        best = _at(belief, snap, cap)
        reason = (
            f"at risk: even at {cap} units (knee {belief.knee}, probe limit {belief.probe_limit}) "
            f"the {_versus(best, snap, margin, 'misses')}"
        )
        if _in_dwell(snap) and not snap.queued:
            return (
                reason
                + f"; holding {pred.units} units within the {_dur(snap.spec.dwell_seconds)} dwell"
            )
        if pred.units != cap:
            return reason + f"; {pred.units} units reachable now: {_finish_words(pred, snap)}"
        return reason
    if case == "too_big":
        here = _at(belief, snap, snap.units)
        return (
            f"{_versus(here, snap, margin, 'misses')} (above the knee at "
            f"{belief.knee}); {need} units would make it, but not by twice the margin; "
            f"running at {pred.units} units: {_finish_words(pred, snap)}"
        )
    return _versus(pred, snap, margin, "meets")


def _within_spec(belief: Belief, spec: JobSpec) -> Belief:
    """The belief restricted to the spec's levels (a caller may have built it on more sizes)."""
    if belief.levels == spec.resources.levels:  # the common case, without building sets
        return belief
    allowed = set(spec.resources.levels)
    if set(belief.levels) <= allowed:
        return belief
    levels = tuple(n for n in belief.levels if n in allowed) or tuple(spec.resources.levels)
    return replace(belief, levels=levels, knee=knee(belief.median, levels))


def decided_units(
    snap: JobSnapshot, belief: Belief, *, free_units: int, share: int | bool | None = False
) -> int:
    """:func:`decide`'s size alone, without its predictions and words.

    The cluster allocator reads only the size a running job's own rules keep it at, for every
    job at every decision; the same rules choose it (:func:`_choose`).
    """
    belief = _within_spec(belief, snap.spec)
    return _choose(snap, belief, margin_for(snap.spec, snap.now), share, free_units)[1]


def decide(
    snap: JobSnapshot,
    belief: Belief,
    *,
    free_units: int,
    share: int | bool | None = False,
    explain: bool = True,
) -> Decision:
    """Decide this round's action for one job.

    Args:
        snap: The job now.
        belief: Its speed belief.
        free_units: Units available to this job beyond what it holds (the resource status).
        share: Its :func:`minimal_share` when the caller computed it already (``False``: not
            computed).
        explain: Put the reason into words (``False``: the reason is empty, except for a job
            that is done or still measuring; a caller that reads only the size calls
            :func:`decided_units`).

    Returns:
        The :class:`Decision`; its ``units`` is always one of ``belief.levels`` unless the job keeps
        a current size outside them (``on_track``/``done``).
    """
    spec = snap.spec
    belief = _within_spec(belief, spec)
    margin = margin_for(spec, snap.now)
    action, units, case, need = _choose(snap, belief, margin, share, free_units)
    pred = _at(belief, snap, units)
    if case == "done":
        reason = f"all {spec.total_steps} steps are done"
    elif case == "measuring":
        reason = (
            f"measuring: no steady progress window yet at {snap.units} units, so no size can be "
            "promised; no rescale on a blind guess"
        )
    else:
        reason = _words(case, pred, snap, belief, margin, need, free_units) if explain else ""
    return _decision(action, pred, reason, snap, margin)
