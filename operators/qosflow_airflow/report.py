"""The training report: a table and a plot of the "must be done by" line vs actual progress.

Pure: built from what the steps pushed to XCom (the plan's schedule, the watches' samples and
decisions, the actions taken) and the final workflow status. The PNG shows the line the job had
to stay above, the actual progress, the deadline, each decision and action (numbered, with a key
below the plot) and the size over time on a second axis with whole-unit ticks.

**One rule for "behind".** The plan's schedule is the line of the speed believed at planning; each
later decision judged the job with the belief of its own time. Drawing only the plan's line could
show a job above its line while a decision called it at risk (the belief had moved). So the drawn
line is the plan's schedule until the first decision, then, from each decision on, the line *that
decision* implies: at time ``t`` the job must have done ``total - (due - t) / tau`` steps, ``due``
the deadline minus the decision's margin and ``tau`` the step time of its conservative finish
(``(finish - t_k) / (total - steps_k)``). A job is *behind* exactly when its progress is below the
drawn line (:meth:`Report.behind`), which at a decision is exactly when that decision's
conservative finish misses ``due`` — so an ``at_risk`` decision is always drawn below the line,
and the markers' colours follow the same rule.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qosflow.core.words import duration

if TYPE_CHECKING:
    from qosflow.core.cluster import JobStatus
    from qosflow.core.speed import ProgressSample

BEHIND, AHEAD = "tab:red", "tab:green"
"""Marker colours of a decision drawn below / on or above the "must be done by" line."""


@dataclass(frozen=True, slots=True)
class Mark:
    """One decision or action on the timeline.

    Attributes:
        time: When (epoch seconds).
        kind: ``scale_up``, ``bump``, ``restart``...
        units: Size it asked for or left the job at.
        reason: The reason in words.
        steps: Steps done at that time (``None``: read off the progress line).
        finish: A decision's conservative finish (epoch seconds; ``inf`` when no speed was
            known); ``None`` for an action, which judges nothing.
        due: A decision's deadline minus its margin (``None``: no deadline, or an action).
    """

    time: float
    kind: str
    units: int
    reason: str
    steps: float | None = None
    finish: float | None = None
    due: float | None = None

    @property
    def judges(self) -> bool:
        """Whether this mark is a decision with a deadline (it implies a "must be done by" line)."""
        return self.finish is not None and self.due is not None and math.isfinite(self.due)


@dataclass(frozen=True, slots=True)
class Segment:
    """A straight piece of the "must be done by" line, in force from ``t0`` to ``t1``.

    Attributes:
        t0: Start (epoch seconds).
        t1: End.
        due: When the line reaches the total (``inf``: everything is due at once).
        tau: Seconds per step along the line (``inf``: everything is due at once).
        source: ``plan`` (the plan's schedule), ``linear`` (no speed known at planning: a
            straight line from the plan to the deadline) or ``decision``.
    """

    t0: float
    t1: float
    due: float
    tau: float
    source: str = "decision"

    def at(self, t: float, total: int) -> float:
        """Steps that must be done by ``t``, within ``[0, total]``."""
        if not math.isfinite(self.tau) or self.tau <= 0:
            return float(total)
        return min(max(total - (self.due - t) / self.tau, 0.0), float(total))


@dataclass(frozen=True, slots=True)
class Report:
    """Everything the report shows.

    Attributes:
        job: Job name.
        total_steps: Steps of the job.
        start: When the job was planned (epoch seconds).
        deadline: Deadline (epoch seconds).
        finished_at: When it finished, ``None`` if it did not.
        succeeded: Whether the workflow succeeded.
        schedule: Planned ``(time, steps)`` points.
        samples: Observed progress.
        marks: Decisions and actions, in time order.
        message: Failure message, ``""`` when none.
    """

    job: str
    total_steps: int
    start: float
    deadline: float
    finished_at: float | None
    succeeded: bool
    schedule: Sequence[tuple[float, int]]
    samples: Sequence[ProgressSample]
    marks: Sequence[Mark]
    message: str = ""

    @property
    def met(self) -> bool:
        """True when the job succeeded by its deadline."""
        return self.succeeded and self.finished_at is not None and self.finished_at <= self.deadline

    @property
    def margin_s(self) -> float | None:
        """Seconds to spare at the finish (negative when late), ``None`` if it never finished."""
        if self.finished_at is None or math.isinf(self.deadline):
            return None
        return self.deadline - self.finished_at

    @property
    def lateness_s(self) -> float | None:
        """Seconds after the deadline at the finish (negative when early); ``-margin_s``."""
        margin = self.margin_s
        return None if margin is None else -margin

    @property
    def missed(self) -> bool:
        """True when the training succeeded after its deadline (a failure is not a miss)."""
        return self.succeeded and not self.met

    def verdict(self) -> str:
        """One line: met or missed, with the margin."""
        if not self.succeeded:
            return f"{self.job}: FAILED — {self.message or 'the training did not complete'}"
        margin = self.margin_s
        if margin is None:
            return f"{self.job}: finished (best effort, no deadline)"
        word = "met" if self.met else "MISSED"
        side = "early" if margin >= 0 else "late"
        return f"{self.job}: deadline {word}, {duration(abs(margin))} {side}"

    def table(self) -> str:
        """The decisions and actions as a text table, then the verdict."""
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"qosflow report: {self.job}")
        for column in ("#", "t+ (s)", "event", "units", "reason"):
            table.add_column(column)
        for i, mark in enumerate(self.marks, 1):
            t = f"{mark.time - self.start:.0f}"
            table.add_row(str(i), t, mark.kind, str(mark.units), mark.reason)
        buffer = io.StringIO()
        Console(file=buffer, width=140, force_terminal=False, color_system=None).print(table)
        return buffer.getvalue() + self.verdict() + "\n"

    # -- the "must be done by" line ----------------------------------------------------------
    def segments(self) -> list[Segment]:
        """The drawn "must be done by" line: the plan's, then each judging decision's."""
        out: list[Segment] = []
        planned = usable(self.schedule)
        if planned:  # a straight line, floored at 0 steps: its slope is where it is above 0
            rising = [p for p in planned if p[1] > 0] or planned
            (t0, n0), (t1, n1) = (rising if len(rising) > 1 else planned)[-2:]
            tau = (t1 - t0) / (n1 - n0) if n1 > n0 else math.inf
            due = t1 + (self.total_steps - n1) * tau if math.isfinite(tau) else t1
            out.append(Segment(planned[0][0], math.inf, due, tau, "plan"))
        elif not math.isinf(self.deadline):  # speed unknown at planning: the linear reference
            span = self.deadline - self.start
            out.append(
                Segment(self.start, math.inf, self.deadline, span / self.total_steps, "linear")
            )
        for mark in self.marks:
            if not mark.judges:
                continue
            steps = self.steps_at(mark)
            due, finish = float(mark.due or 0.0), float(mark.finish or math.inf)
            left = self.total_steps - (steps or 0.0)
            tau = (finish - mark.time) / left if left > 0 and math.isfinite(finish) else math.inf
            if out and out[-1].t0 >= mark.time:
                out.pop()  # two decisions at one instant: the later one's line
            if out:
                last = out[-1]
                out[-1] = Segment(last.t0, mark.time, last.due, last.tau, last.source)
            out.append(Segment(mark.time, math.inf, due, tau))
        return out

    def line_at(self, t: float) -> float | None:
        """Steps the drawn line says must be done by ``t`` (``None``: no line there)."""
        for seg in reversed(self.segments()):
            if seg.t0 <= t:
                return seg.at(t, self.total_steps)
        return None

    def behind(self, t: float, steps: float) -> bool | None:
        """Whether ``steps`` done at ``t`` is below the drawn line (``None``: no line there)."""
        need = self.line_at(t)
        return None if need is None else steps < need - 1e-9

    def steps_at(self, mark: Mark) -> float | None:
        """Steps done at a mark: its own count, else the drawn progress line's value then."""
        if mark.steps is not None:
            return float(mark.steps)
        before = [s for s in self.samples if s.time <= mark.time]
        after = [s for s in self.samples if s.time > mark.time]
        if not before:
            return None
        a = before[-1]
        if not after:
            return float(a.steps_done)
        b = after[0]  # between two samples: on the straight line drawn between them
        share = (mark.time - a.time) / (b.time - a.time)
        return a.steps_done + share * (b.steps_done - a.steps_done)

    def status(self, mark: Mark) -> bool | None:
        """A judging decision's verdict by the drawn line: ``True`` behind, ``False`` not."""
        steps = self.steps_at(mark)
        if not mark.judges or steps is None:
            return None
        return self.behind(mark.time, steps)

    # -- the figure --------------------------------------------------------------------------
    def png(self) -> bytes:
        """The figure as PNG bytes (written wherever the report is stored)."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        return buffer.getvalue()

    def plot(self, path: Path) -> Path:
        """Write the PNG to a local file and return its path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png())
        return path

    def figure(self) -> Any:
        """The matplotlib figure (see :mod:`qosflow_airflow.report_figure`)."""
        from qosflow_airflow.report_figure import draw

        return draw(self)


def usable(schedule: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The planned schedule, or nothing when planning knew no speed (all steps due at once)."""
    points = list(schedule)
    if len(points) < 2 or points[0][1] >= points[-1][1] or points[0][0] >= points[-1][0]:
        return []
    return points


def when(t: float) -> str:
    """An epoch time as ``YYYY-MM-DD HH:MM UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def build_report(
    plan: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    acts: Sequence[Mapping[str, Any]],
    samples: Sequence[ProgressSample],
    status: JobStatus,
) -> Report:
    """Assemble the report from XCom payloads and the final status."""
    from qosflow.core.cluster import Phase
    from qosflow_airflow.state import job_from_dict

    spec = job_from_dict(plan["job"])
    marks = [decision_mark(e) for e in events if e.get("decision")]
    marks = [m for m in marks if m.kind != "done"]
    marks += [
        Mark(float(a["time"]), str(a["how"]), int(a["units"]), str(a["reason"]))
        for a in acts
        if a.get("how") not in (None, "none")
    ]
    succeeded = status.phase is Phase.SUCCEEDED
    finished = status.finished_at if status.phase.finished else None
    if succeeded and finished is None and samples:
        finished = samples[-1].time
    schedule = [(float(t), int(s)) for t, s in (plan.get("plan") or {}).get("schedule", [])]
    return Report(
        job=spec.name,
        total_steps=spec.total_steps,
        start=float(plan.get("planned_at", spec.submitted_at)),
        deadline=spec.deadline,
        finished_at=finished,
        succeeded=succeeded,
        schedule=schedule,
        samples=list(samples),
        marks=sorted(marks, key=lambda m: m.time),
        message=status.message,
    )


def decision_mark(event: Mapping[str, Any]) -> Mark:
    """A watch's decision as a report mark: when, what, and what it believed.

    The steps are the event's last sample's; the conservative finish (``inf`` when the decision
    knew no speed) and the deadline minus the margin are what the report's "must be done by"
    line is drawn from after this decision (:meth:`~qosflow_airflow.report.Report.segments`).
    """
    decision = event["decision"]
    rows = event.get("samples") or []
    steps = float(rows[-1][1]) if rows and rows[-1][1] is not None else None
    deadline, margin = decision.get("deadline"), decision.get("margin")
    finish = decision.get("conservative_finish")
    return Mark(
        float(event["time"]),
        str(decision["action"]),
        int(decision["units"]),
        str(decision["reason"]),
        steps=steps,
        finish=math.inf if finish is None else float(finish),
        due=None if deadline is None else float(deadline) - float(margin or 0.0),
    )
