"""The report's figure, drawn from a :class:`~qosflow_airflow.report.Report`.

Nothing is judged here that the report does not say: the "must be done by" line is
:meth:`Report.segments`, a decision's marker colour is :meth:`Report.status` (the same rule).
Decisions and actions are numbered; the numbers sit in lanes at the top of the plot, a label
taking the lowest lane where it keeps clear of its neighbours (:func:`lanes`), and a key under
the plot says what each number was. The size axis has whole-unit ticks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from qosflow_airflow.report import AHEAD, BEHIND, Mark, Report, when

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LANES = 6
"""Rows of decision labels at the top of the plot."""
LABEL_GAP = 0.04
"""Least distance (share of the plot's width) between two labels in one lane."""
LANE_STEP = 0.065
"""Height of a lane (share of the plot's height)."""
ACTION = "tab:gray"
LINE_LABELS = {
    "plan": "planned schedule (must be done by)",
    "linear": "linear schedule to the deadline (speed unknown at planning)",
    "decision": "must be done by, as each decision believed",
}
KEY_COLUMNS = 2
KEY_ROW_IN = 0.17
"""Height of one row of the key, in inches."""


def lanes(xs: Sequence[float], gap: float = LABEL_GAP, count: int = LANES) -> list[int]:
    """The lane of each label at ``xs`` (shares of the width, ascending): never closer than ``gap``.

    Each label takes the lowest lane whose last label is at least ``gap`` to its left; when every
    lane is taken it goes where the last label is furthest left (more than ``count`` labels within
    ``gap`` of each other cannot all keep clear).
    """
    last: list[float] = []
    out: list[int] = []
    for x in xs:
        free = [i for i, left in enumerate(last) if x - left >= gap]
        if free:
            lane = free[0]
        elif len(last) < count:
            last.append(-math.inf)
            lane = len(last) - 1
        else:
            lane = min(range(len(last)), key=last.__getitem__)
        last[lane] = x
        out.append(lane)
    return out


def key_line(report: Report, number: int, mark: Mark) -> str:
    """One entry of the key: number, time, what, size, and for a decision where it stood."""
    t = mark.time - report.start
    status = report.status(mark)
    where = "" if status is None else f"  ({_words(status)})"
    return f"{number:>2}  t+{int(t // 60)}:{int(t % 60):02d}  {mark.kind} → {mark.units}{where}"


def _words(status: bool | None) -> str:
    """A mark's place against the line, in words (the legend's and the key's)."""
    if status is None:
        return "action taken"
    return "behind the line" if status else "on or above the line"


def draw(report: Report) -> Figure:
    """The figure: the line, progress, deadline, numbered decisions, size, and the key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(report.marks) / KEY_COLUMNS)
    key_in = rows * KEY_ROW_IN + (0.1 if rows else 0.0)
    fig, ax = plt.subplots(figsize=(9, 5 + key_in), dpi=110)
    start = report.start

    def rel(t: float) -> float:
        return (t - start) / 60.0

    _lines(ax, report, rel)
    _marks(ax, report, rel)
    ax.set_xlabel("minutes since planning")
    ax.set_ylabel("training steps done")
    ax.set_ylim(0, report.total_steps * 1.05)
    ax.set_title(f"{report.job} ({when(start)}) — {report.verdict().split(': ', 1)[-1]}")
    handles, labels = _size_axis(ax, report, rel)
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    _key(fig, report, key_in)
    fig.tight_layout(rect=(0.0, (key_in + 0.05) / (5 + key_in) if rows else 0.0, 1.0, 1.0))
    return fig


def _lines(ax: Axes, report: Report, rel: Callable[[float], float]) -> None:
    """The "must be done by" line (one piece per judge), progress, deadline and finish."""
    end, named = _end(report), set[str]()
    for seg in report.segments():
        t1 = min(seg.t1, end)
        if t1 < seg.t0:
            continue
        kinks = (seg.due - report.total_steps * seg.tau, seg.due)  # where it leaves 0, meets total
        ts = sorted({seg.t0, t1, *(k for k in kinks if math.isfinite(k) and seg.t0 < k < t1)})
        ax.plot(
            [rel(t) for t in ts],
            [seg.at(t, report.total_steps) for t in ts],
            "--",
            color="tab:gray",
            alpha=1.0 if seg.source != "decision" else 0.8,
            label=None if seg.source in named else LINE_LABELS[seg.source],
        )
        named.add(seg.source)
    if report.samples:
        ax.plot(
            [rel(s.time) for s in report.samples],
            [s.steps_done for s in report.samples],
            "-",
            color="tab:blue",
            linewidth=2,
            label="actual progress",
        )
    if not math.isinf(report.deadline):
        ax.axvline(rel(report.deadline), color="tab:red", linewidth=2, label="deadline")
    if report.finished_at is not None:
        ax.axvline(rel(report.finished_at), color="tab:green", linewidth=1.5, label="finished")
    ax.set_xlim(min(0.0, rel(report.start)), rel(end) * 1.03 + 0.05)


def _end(report: Report) -> float:
    """The last instant the plot shows."""
    times = [report.start + 1.0]
    times += [report.deadline] if not math.isinf(report.deadline) else []
    times += [report.finished_at] if report.finished_at is not None else []
    times += [s.time for s in report.samples[-1:]] + [m.time for m in report.marks[-1:]]
    return max(times)


def _marks(ax: Axes, report: Report, rel: Callable[[float], float]) -> None:
    """A dotted line, a marker on the progress line and a numbered label per mark."""
    x0, x1 = ax.get_xlim()
    shares = [(rel(m.time) - x0) / (x1 - x0) for m in report.marks]
    labelled: set[str] = set()
    for number, (mark, lane) in enumerate(zip(report.marks, lanes(shares), strict=True), 1):
        x, status = rel(mark.time), report.status(mark)
        color = ACTION if status is None else (BEHIND if status else AHEAD)
        ax.axvline(
            x,
            color="tab:orange",
            linestyle=":",
            alpha=0.6,
            label=None if number > 1 else "decision / action",
        )
        steps = report.steps_at(mark)
        if steps is not None:
            label = _words(status) if status is None else f"decision: {_words(status)}"
            ax.plot(
                [x],
                [steps],
                "s" if status is None else "o",
                color=color,
                markersize=6,
                label=None if label in labelled else label,
            )
            labelled.add(label)
        ax.annotate(
            str(number),
            (x, 0.965 - lane * LANE_STEP),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="center",
            fontsize=7,
            gid=f"mark-{number}",
            bbox={"boxstyle": "circle,pad=0.25", "fc": "white", "ec": color, "lw": 1.0},
        )


def _size_axis(
    ax: Axes, report: Report, rel: Callable[[float], float]
) -> tuple[list[Any], list[str]]:
    """The size over time on a second axis (whole units); the legend entries of both axes."""
    from matplotlib.ticker import MaxNLocator

    sizes = size_steps(report.samples)
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
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    return handles, labels


def _key(fig: Figure, report: Report, key_in: float) -> None:
    """The numbered key under the plot, in columns."""
    if not report.marks:
        return
    lines = [key_line(report, i, m) for i, m in enumerate(report.marks, 1)]
    rows = math.ceil(len(lines) / KEY_COLUMNS)
    height = fig.get_figheight()
    for col in range(KEY_COLUMNS):
        chunk = lines[col * rows : (col + 1) * rows]
        if chunk:
            fig.text(
                0.03 + col * 0.5,
                (key_in - 0.02) / height,
                "\n".join(chunk),
                va="top",
                ha="left",
                fontsize=7,
                family="monospace",
                gid=f"key-{col}",
            )


def size_steps(samples: Sequence[Any]) -> list[tuple[float, int]]:
    """``(time, units)`` where the size changed, and the last sample's (for a step plot)."""
    points: list[tuple[float, int]] = []
    for s in samples:
        if not points or points[-1][1] != s.units:
            points.append((s.time, s.units))
    if points and samples:
        points.append((samples[-1].time, samples[-1].units))
    return points
