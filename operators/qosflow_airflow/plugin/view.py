"""What the qosflow view shows for one DAG run, built from the run's XComs (pure, no Airflow).

Each ``deadline_training`` group of the run is one :class:`JobView`: the plan (verdict, size,
priority class, reason, counter-offer), progress against the planned schedule at each watch,
every round's decision with its reason and the action that followed (and the finish step's own
actions after the rounds), and the verdict (met or missed, lateness or margin). The XComs are
the steps' own: ``<group>.plan``, ``<group>.round_<k>.watch|decide|rescale|bump`` and
``<group>.finish`` (its return value, or ``report`` when it failed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any

XComKey = tuple[str, str]
"""``(task_id, key)`` of an XCom of the run (map index -1)."""
ACTS = ("rescale", "bump", "continue", "done")


@dataclass(frozen=True, slots=True)
class Decision:
    """One round's decision and what followed.

    Attributes:
        round: The round (1, 2...); 0 for the finish step's own actions after the rounds.
        t: Seconds since planning.
        action: The decided action (``scale_up``, ``at_risk``...; for an action after the rounds,
            how it acted).
        before: The size when it was decided.
        units: The target size.
        reason: Why, in words.
        taken: The branch taken (``rescale``, ``bump``, ``continue``, ``done``), ``""`` if none.
        outcome: What the action did, in words (``""`` when nothing ran).
    """

    round: int
    t: float | None
    action: str
    before: int | None
    units: int | None
    reason: str
    taken: str
    outcome: str


@dataclass(frozen=True, slots=True)
class Progress:
    """Progress at one watch against the planned schedule.

    Attributes:
        round: The round of the watch.
        t: Seconds since planning.
        steps: Steps done then.
        units: Size then.
        planned: Steps the planned schedule had by then (``None``: no schedule).
    """

    round: int
    t: float
    steps: int
    units: int
    planned: int | None

    @property
    def delta(self) -> int | None:
        """Steps ahead of the schedule (negative: behind)."""
        return None if self.planned is None else self.steps - self.planned


@dataclass(frozen=True, slots=True)
class JobView:
    """One job of the run, as the view shows it.

    Attributes:
        group: The task group's id (``training``...).
        job: The job's name.
        plan: The plan XCom (``{}`` when the plan step pushed none).
        states: Task (short id within the group) → state.
        decisions: Rounds' decisions and the actions after them.
        progress: Progress at each watch.
        finish: The finish XCom (``{}`` while the job runs, or when it never reached finish).
    """

    group: str
    job: str
    plan: Mapping[str, Any]
    states: Mapping[str, str | None]
    decisions: Sequence[Decision] = ()
    progress: Sequence[Progress] = ()
    finish: Mapping[str, Any] = field(default_factory=dict)

    @property
    def total_steps(self) -> int | None:
        """The job's steps."""
        steps = (self.plan.get("job") or {}).get("total_steps")
        return None if steps is None else int(steps)

    @property
    def unit(self) -> str:
        """The job's unit (``cpu``, ``gpu``...)."""
        return str(((self.plan.get("job") or {}).get("resources") or {}).get("unit", "units"))

    @property
    def deadline(self) -> float | None:
        """The deadline (epoch seconds)."""
        text = (self.plan.get("job") or {}).get("deadline")
        return None if not text else datetime.fromisoformat(str(text)).timestamp()

    @property
    def verdict(self) -> str:
        """``met``, ``missed``, ``failed``, ``running``, or the state of the step that stopped."""
        if self.finish:
            return str(
                self.finish.get("outcome") or ("met" if self.finish.get("met") else "missed")
            )
        for task in ("plan", "submit", "finish"):
            if self.states.get(task) in ("failed", "upstream_failed"):
                return "failed"
        return "running"


def planned_at(schedule: Sequence[Sequence[float]], t: float) -> int | None:
    """Steps the planned schedule had by ``t`` (linear between its points; ``None``: none)."""
    points = [(float(a), float(b)) for a, b in schedule]
    if len(points) < 2 or points[0][1] >= points[-1][1]:
        return None
    if t <= points[0][0]:
        return int(points[0][1])
    for (t0, n0), (t1, n1) in pairwise(points):
        if t <= t1:
            return int(n0 + (n1 - n0) * (t - t0) / (t1 - t0)) if t1 > t0 else int(n1)
    return int(points[-1][1])


def groups(task_ids: Sequence[str]) -> list[str]:
    """The ``deadline_training`` groups among a run's task ids (a ``plan`` beside a ``finish``)."""
    ids = set(task_ids)
    found = [t[: -len("plan")] for t in ids if t.endswith("plan")]
    return sorted(p.rstrip(".") for p in found if f"{p}finish" in ids)


def _prefix(group: str) -> str:
    return f"{group}." if group else ""


def _round_states(states: Mapping[str, str | None], prefix: str) -> dict[str, str | None]:
    """Task id within the group → state."""
    return {t[len(prefix) :]: s for t, s in states.items() if t.startswith(prefix)}


def job_view(group: str, xcoms: Mapping[XComKey, Any], states: Mapping[str, str | None]) -> JobView:
    """One group's view from the run's XComs and task states."""
    p = _prefix(group)
    plan = _dict(xcoms.get((f"{p}plan", "return_value")))
    finish = _dict(xcoms.get((f"{p}finish", "return_value")) or xcoms.get((f"{p}finish", "report")))
    own = _round_states(states, p)
    start = float(plan.get("planned_at") or 0.0)
    schedule = (plan.get("plan") or {}).get("schedule") or []
    decisions: list[Decision] = []
    progress: list[Progress] = []
    k = 1
    while f"round_{k}.watch" in own or (f"{p}round_{k}.watch", "return_value") in xcoms:
        r = f"{p}round_{k}."
        event = _dict(xcoms.get((f"{r}watch", "return_value")))
        if event.get("decision"):
            decisions.append(_decision(k, start, event, xcoms, r, own))
        row = _progress(k, start, event, schedule)
        if row is not None:
            progress.append(row)
        k += 1
    decisions += [_after(start, a) for a in finish.get("acts") or [] if isinstance(a, Mapping)]
    name = str((plan.get("job") or {}).get("name") or finish.get("job") or group)
    return JobView(group, name, plan, own, decisions, progress, finish)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _rel(t: Any, start: float) -> float | None:
    return None if t is None or not start else float(t) - start


def _decision(
    k: int,
    start: float,
    event: Mapping[str, Any],
    xcoms: Mapping[XComKey, Any],
    r: str,
    own: Mapping[str, str | None],
) -> Decision:
    """Round ``k``'s decision: the decide step's record (or the watch's), and the act's outcome."""
    record = _dict(xcoms.get((f"{r}decide", "return_value")))
    decision = {**_dict(event.get("decision")), **{k_: v for k_, v in record.items() if v}}
    taken = str(record.get("taken") or "")
    if not taken:  # a decide step older than its record: the branch that ran
        taken = next((a for a in ACTS if own.get(f"round_{k}.{a}") == "success"), "")
    act = _dict(xcoms.get((f"{r}{taken}", "return_value"))) if taken in ACTS[:2] else {}
    outcome = str(act.get("reason") or "")
    if taken in ACTS[:2] and not act:
        outcome = f"{taken}: {own.get(f'round_{k}.{taken}') or 'not run'}"
    return Decision(
        k,
        _rel(event.get("time"), start),
        str(decision.get("action")),
        _int(record.get("current_units", event.get("units"))),
        _int(decision.get("units")),
        str(decision.get("reason") or ""),
        taken,
        outcome,
    )


def _after(start: float, act: Mapping[str, Any]) -> Decision:
    """An action the finish step took after the rounds."""
    return Decision(
        0,
        _rel(act.get("time"), start),
        str(act.get("how")),
        _int(act.get("from")) if isinstance(act.get("from"), int) else None,
        _int(act.get("units")),
        str(act.get("reason") or ""),
        "finish",
        str(act.get("reason") or ""),
    )


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _progress(
    k: int, start: float, event: Mapping[str, Any], schedule: Sequence[Sequence[float]]
) -> Progress | None:
    """Where the job stood at round ``k``'s watch."""
    rows = [r for r in event.get("samples") or [] if len(r) >= 3 and None not in r[:3]]
    if not rows or not start:
        return None
    t, steps, units = float(rows[-1][0]), int(rows[-1][1]), int(rows[-1][2])
    return Progress(k, t - start, steps, units, planned_at(schedule, t))


def run_views(
    xcoms: Mapping[XComKey, Any], states: Mapping[str, str | None], only: str | None = None
) -> list[JobView]:
    """Every job of the run (or the one whose group holds task ``only``)."""
    ids = sorted({t for t, _ in xcoms} | set(states))
    found = groups(ids)
    if only:
        mine = [g for g in found if only == g or only.startswith(_prefix(g))]
        found = mine or found
    return [job_view(g, xcoms, states) for g in found]


def seconds(value: float | None) -> str:
    """Seconds as ``1 h 02 min``, ``3 min 05 s`` or ``42 s``."""
    if value is None or not math.isfinite(value):
        return "—"
    s = abs(value)
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{s:.0f} s"
