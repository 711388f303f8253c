"""The training report: a table and a plot of planned schedule vs actual progress.

Pure: built from what the steps pushed to XCom (the plan's schedule, the watches' samples and
decisions, the actions taken) and the final workflow status. The PNG shows the planned schedule,
the actual progress, the deadline, each decision marked with its action, and the size over time on
a second axis.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qosflow.core.speed import ProgressSample


@dataclass(frozen=True, slots=True)
class Mark:
    """One decision or action on the timeline.

    Attributes:
        time: When (epoch seconds).
        kind: ``scale_up``, ``bump``, ``restart``...
        units: Size it asked for or left the job at.
        reason: The reason in words.
    """

    time: float
    kind: str
    units: int
    reason: str


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

    def verdict(self) -> str:
        """One line: met or missed, with the margin."""
        if not self.succeeded:
            return f"{self.job}: FAILED — {self.message or 'the training did not complete'}"
        margin = self.margin_s
        if margin is None:
            return f"{self.job}: finished (best effort, no deadline)"
        word = "met" if self.met else "MISSED"
        side = "early" if margin >= 0 else "late"
        return f"{self.job}: deadline {word}, {abs(margin):.0f} s {side}"

    def table(self) -> str:
        """The decisions and actions as a text table, then the verdict."""
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"qosflow report: {self.job}")
        for column in ("t+ (s)", "event", "units", "reason"):
            table.add_column(column)
        for mark in self.marks:
            table.add_row(f"{mark.time - self.start:.0f}", mark.kind, str(mark.units), mark.reason)
        buffer = io.StringIO()
        Console(file=buffer, width=140, force_terminal=False, color_system=None).print(table)
        return buffer.getvalue() + self.verdict() + "\n"

    def plot(self, path: Path) -> Path:
        """Write the PNG and return its path."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        return path

    def figure(self) -> Any:
        """The matplotlib figure: progress vs schedule, deadline, decisions, size over time."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        def rel(t: float) -> float:
            return (t - self.start) / 60.0

        fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
        self._progress_lines(ax, rel)
        if not math.isinf(self.deadline):
            ax.axvline(rel(self.deadline), color="tab:red", linewidth=2, label="deadline")
        for i, mark in enumerate(self.marks):
            ax.axvline(
                rel(mark.time),
                color="tab:orange",
                linestyle=":",
                alpha=0.8,
                label="decision / action" if i == 0 else None,
            )
            ax.annotate(
                f"{mark.kind}→{mark.units}",
                (rel(mark.time), self.total_steps),
                rotation=90,
                fontsize=7,
                va="top",
                ha="right",
            )
        if self.finished_at is not None:
            ax.axvline(rel(self.finished_at), color="tab:green", linewidth=1.5, label="finished")
        ax.set_xlabel("minutes since planning")
        ax.set_ylabel("training steps done")
        ax.set_ylim(0, self.total_steps * 1.05)
        when = datetime.fromtimestamp(self.start, UTC).strftime("%Y-%m-%d %H:%M UTC")
        ax.set_title(f"{self.job} ({when}) — {self.verdict().split(': ', 1)[-1]}")
        handles, labels = self._size_axis(ax, rel)
        ax.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.13),
            ncol=3,
            fontsize=8,
            frameon=False,
        )
        fig.tight_layout()
        return fig

    def _progress_lines(self, ax: Any, rel: Callable[[float], float]) -> None:
        """The planned schedule (or the linear reference) and the actual progress."""
        planned = _usable(self.schedule)
        if planned:
            ax.plot(
                [rel(t) for t, _ in planned],
                [n for _, n in planned],
                "--",
                color="tab:gray",
                label="planned schedule (must be done by)",
            )
        elif not math.isinf(self.deadline):  # speed unknown at planning: the linear reference
            ax.plot(
                [0.0, rel(self.deadline)],
                [0, self.total_steps],
                "--",
                color="tab:gray",
                label="linear schedule to the deadline (speed unknown at planning)",
            )
        if self.samples:
            ax.plot(
                [rel(s.time) for s in self.samples],
                [s.steps_done for s in self.samples],
                "-",
                color="tab:blue",
                linewidth=2,
                label="actual progress",
            )

    def _size_axis(self, ax: Any, rel: Callable[[float], float]) -> tuple[list[Any], list[str]]:
        """The size over time on a second axis; the legend entries of both axes."""
        sizes = _size_steps(self.samples)
        handles, labels = ax.get_legend_handles_labels()
        if sizes:
            ax2 = ax.twinx()
            ax2.step(
                [rel(t) for t, _ in sizes],
                [u for _, u in sizes],
                where="post",
                color="tab:purple",
                alpha=0.6,
                label="size (units)",
            )
            ax2.set_ylabel("size (units)")
            ax2.set_ylim(0, max(u for _, u in sizes) + 1)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        return handles, labels


def _usable(schedule: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The planned schedule, or nothing when planning knew no speed (all steps due at once)."""
    points = list(schedule)
    if len(points) < 2 or points[0][1] >= points[-1][1] or points[0][0] >= points[-1][0]:
        return []
    return points


def _size_steps(samples: Sequence[ProgressSample]) -> list[tuple[float, int]]:
    points: list[tuple[float, int]] = []
    for s in samples:
        if not points or points[-1][1] != s.units:
            points.append((s.time, s.units))
    if points and samples:
        points.append((samples[-1].time, samples[-1].units))
    return points
