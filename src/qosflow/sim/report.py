"""What a simulation run leaves behind: ``results.csv``, ``jobs.csv`` and three PNG plots.

* ``results.csv`` — one row per policy (:class:`~qosflow.sim.metrics.RunMetrics`);
* ``jobs.csv`` — one row per (policy, job): finish, met, rejected, guaranteed, rescales, lateness;
* ``satisfaction.png`` — deadline satisfaction ratio per policy, the upper bound as a line;
* ``lateness_cdf.png`` — CDF of (finish − deadline) of finished deadline jobs, per policy;
* ``utilisation.png`` — units in use over time as a share of the cluster, per policy.

Numbers are written as fixed-precision text so that two equal runs give byte-identical files.
"""

from __future__ import annotations

import csv
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qosflow.sim.metrics import JobOutcome, RunMetrics


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """Everything the report needs about one policy's run.

    Attributes:
        metrics: The metrics row.
        outcomes: Every job's outcome.
        usage: ``(time, units in use)`` after every decision.
    """

    metrics: RunMetrics
    outcomes: tuple[JobOutcome, ...]
    usage: tuple[tuple[int, int], ...]


JOB_COLUMNS = (
    "policy",
    "job_id",
    "submit",
    "deadline",
    "best_effort",
    "finish",
    "met",
    "rejected",
    "guaranteed",
    "rescales",
    "unit_seconds",
    "lateness_s",
)


def write_results(runs: Sequence[PolicyRun], path: Path) -> None:
    """Write ``results.csv`` (one row per policy)."""
    rows = [r.metrics.row() for r in runs]
    if not rows:
        return
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        out.writeheader()
        out.writerows(rows)


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return ""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3f}"


def write_jobs(runs: Sequence[PolicyRun], path: Path) -> None:
    """Write ``jobs.csv`` (one row per policy and job)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(JOB_COLUMNS)
        for run in runs:
            for o in run.outcomes:
                out.writerow(
                    [
                        run.metrics.policy,
                        o.job_id,
                        _num(o.submit),
                        _num(o.deadline),
                        int(o.best_effort),
                        _num(o.finish),
                        int(o.met),
                        int(o.rejected),
                        int(o.guaranteed),
                        o.rescales,
                        f"{o.gpu_seconds:.0f}",
                        _num(o.lateness),
                    ]
                )


def _save(fig: Any, ax: Any, path: Path, title: str) -> None:
    """Title, legend and a reproducible PNG (no software stamp), then free the figure."""
    import matplotlib.pyplot as plt

    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def plot_satisfaction(
    runs: Sequence[PolicyRun], bound: float | None, path: Path, title: str
) -> None:
    """Bar chart of the satisfaction ratio per policy, with the upper bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r.metrics.policy for r in runs]
    ratios = [r.metrics.ratio for r in runs]
    bars = ax.bar(names, ratios, color="#4C72B0", label="met / deadline jobs")
    for bar, r in zip(bars, runs, strict=True):
        ax.annotate(
            f"{r.metrics.met}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if bound is not None:
        ax.axhline(bound, color="#C44E52", linestyle="--", label=f"upper bound ({bound:.3f})")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("policy")
    ax.set_ylabel("deadline satisfaction ratio")
    _save(fig, ax, path, title)


def plot_lateness(runs: Sequence[PolicyRun], path: Path, title: str) -> None:
    """CDF of finish − deadline (hours) of finished deadline jobs, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        late = np.sort([o.lateness / 3600 for o in run.outcomes if o.lateness is not None])
        if late.size:
            ax.step(
                late,
                np.arange(1, late.size + 1) / late.size,
                where="post",
                label=run.metrics.policy,
            )
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("finish − deadline (hours; < 0 is on time)")
    ax.set_ylabel("share of finished deadline jobs")
    _save(fig, ax, path, title)


def plot_utilisation(runs: Sequence[PolicyRun], capacity: int, path: Path, title: str) -> None:
    """Units in use over time (share of the cluster), one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    start = min((r.usage[0][0] for r in runs if r.usage), default=0)
    for run in runs:
        if not run.usage:
            continue
        t = (np.array([u[0] for u in run.usage]) - start) / 3600
        used = np.array([u[1] for u in run.usage]) / capacity
        ax.step(t, used, where="post", label=run.metrics.policy, linewidth=0.9)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("time since first arrival (hours)")
    ax.set_ylabel("units in use / capacity")
    _save(fig, ax, path, title)


def write_all(
    runs: Sequence[PolicyRun], out: Path, *, capacity: int, bound_ratio: float | None, title: str
) -> list[Path]:
    """Write every file of a run into ``out`` and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [
        out / "results.csv",
        out / "jobs.csv",
        out / "satisfaction.png",
        out / "lateness_cdf.png",
        out / "utilisation.png",
    ]
    write_results(runs, files[0])
    write_jobs(runs, files[1])
    plot_satisfaction(runs, bound_ratio, files[2], f"Deadline satisfaction — {title}")
    plot_lateness(runs, files[3], f"Lateness of finished deadline jobs — {title}")
    plot_utilisation(runs, capacity, files[4], f"Cluster units in use — {title}")
    return files
