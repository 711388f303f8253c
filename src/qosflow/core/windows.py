"""From progress samples to steady windows: what counts as a measurement of a size.

A run is a stretch of samples at one size; its warm-up is dropped; every few intervals make a
window with one median step time and the CPU share the job got (:mod:`qosflow.core.usage`).
:func:`usable` says which windows are evidence: not the contended ones, and for a key's history
not the stale ones once newer ones exist.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qosflow.core.speed import FloatArray, ProgressSample

WARMUP_STEPS = 20
"""Steps dropped after every (re)start, unless :data:`WARMUP_S` passes first."""
WARMUP_S = 60.0
"""Seconds dropped after every (re)start, unless :data:`WARMUP_STEPS` pass first."""
WINDOW_INTERVALS = 5
"""Consecutive sample intervals per window; each window yields one median step time."""
CLEAN_SHARE = 0.8
"""A window in which the job got less than this share of the CPU time it asked for is contended."""
MIN_SHORT_WINDOW_S = 5.0
"""Seconds a run too short for one full window must span before its intervals make one.

A sample's time is when the watch read the progress, not when the steps were done: the trainer
rewrites its progress file about once a second (Argo patches it into the workflow every few
seconds to a minute), so a read can find no new line and the next one a single new line, and
the two intervals fold into one that reads half the true speed. Over a full window the median
of :data:`WINDOW_INTERVALS` intervals absorbs that; a run's first two or three second-long
intervals after a rescale do not, and a size must not be judged on them. Five seconds are five
of the trainer's progress writes.
"""
SETTLED_WINDOWS = 3
"""Clean windows a size needs before its measurement may rule out scaling (see :func:`usable`)."""
STALE_S = 30 * 86400.0
"""A key's history windows older than this (before the plan or watch) give way to newer ones."""


@dataclass(frozen=True, slots=True)
class Window:
    """One steady window: the median step time over a few consecutive sample intervals.

    Attributes:
        units: Size.
        step_time: Median seconds per step.
        steps: Steps done in the window.
        share: Time-weighted share of the asked-for CPU time the job got (1.0 when unreported);
            below :data:`CLEAN_SHARE` the window is contended.
        end: Time of the window's last sample.
    """

    units: int
    step_time: float
    steps: int
    share: float = 1.0
    end: float = 0.0

    @property
    def clean(self) -> bool:
        """True unless the job could not use its size during the window."""
        return self.share >= CLEAN_SHARE


def _segments(samples: Sequence[ProgressSample]) -> list[list[ProgressSample]]:
    """Split samples into runs at one size; a size change or a step counter reset starts a run."""
    runs: list[list[ProgressSample]] = []
    usable = (s for s in samples if math.isfinite(s.time) and s.steps_done >= 0)
    for s in sorted(usable, key=lambda s: s.time):
        last = runs[-1][-1] if runs else None
        if last is None or s.units != last.units or s.steps_done < last.steps_done:
            runs.append([s])
        else:
            runs[-1].append(s)
    return runs


def _chunk_medians(values: FloatArray, idx: npt.NDArray[np.int64], chunks: int) -> FloatArray:
    """Median of ``values`` within each chunk ``idx`` (vectorised; ``idx`` sorted ascending)."""
    order = np.lexsort((values, idx))
    ordered = values[order]
    counts = np.bincount(idx, minlength=chunks)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return np.asarray(
        0.5 * (ordered[first + (counts - 1) // 2] + ordered[first + counts // 2]), dtype=np.float64
    )


def _segment_windows(
    run: list[ProgressSample], warmup_steps: int, warmup_s: float, per_window: int
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Median step time, steps, CPU share and end time of each window of one run."""
    empty = np.empty(0)
    t = np.array([s.time for s in run], dtype=np.float64)
    k = np.array([s.steps_done for s in run], dtype=np.float64)
    got = np.array([1.0 if s.share is None else s.share for s in run], dtype=np.float64)
    got = np.clip(np.nan_to_num(got, nan=1.0), 0.0, 1.0)
    steady = (k - k[0] >= warmup_steps) | (t - t[0] >= warmup_s)
    t, k, got = t[steady], k[steady], got[steady]
    ends = np.flatnonzero(np.diff(k) > 0) + 1  # stalls are folded into the next moving interval
    if ends.size == 0:
        return empty, empty, empty, empty
    starts = np.concatenate(([0], ends[:-1]))
    dt, dk = t[ends] - t[starts], k[ends] - k[starts]
    # a sample's share covers the interval before it: weigh each raw interval by its length
    cum_got = np.concatenate(([0.0], np.cumsum(np.diff(t) * got[1:])))
    weighted = cum_got[ends] - cum_got[starts]
    ok = dt > 0
    taus, steps, dt, weighted, last = dt[ok] / dk[ok], dk[ok], dt[ok], weighted[ok], t[ends][ok]
    if taus.size == 0 or (taus.size < per_window and float(dt.sum()) < MIN_SHORT_WINDOW_S):
        return empty, empty, empty, empty
    # chunks of per_window intervals; a short tail (at most half a window) joins the chunk before
    chunks = max(1, 1 + len(range(per_window, taus.size - per_window // 2, per_window)))
    idx = np.minimum(np.arange(taus.size) // per_window, chunks - 1)
    sums = np.asarray(np.bincount(idx, weights=steps, minlength=chunks), dtype=np.float64)
    span = np.bincount(idx, weights=dt, minlength=chunks)
    share = np.bincount(idx, weights=weighted, minlength=chunks) / span
    tail = np.concatenate((np.flatnonzero(np.diff(idx)), [idx.size - 1]))
    return _chunk_medians(taus, idx, chunks), sums, share, last[tail]


def window_arrays(
    samples: Sequence[ProgressSample], warmup_steps: int, warmup_s: float, per_window: int
) -> tuple[FloatArray, ...]:
    """Units, median step time, steps, CPU share and end time of every steady window."""
    cols: list[list[FloatArray]] = [[], [], [], [], []]
    for run in _segments(samples):
        if len(run) >= 2 and run[0].units >= 1:
            parts = _segment_windows(run, warmup_steps, warmup_s, max(per_window, 1))
            size = np.full(parts[0].size, float(run[0].units))
            for col, part in zip(cols, (size, *parts), strict=True):
                col.append(part)
    if not cols[0]:
        return tuple(np.empty(0) for _ in cols)
    return tuple(np.concatenate(col) for col in cols)


def windows(
    samples: Sequence[ProgressSample],
    *,
    warmup_steps: int = WARMUP_STEPS,
    warmup_s: float = WARMUP_S,
    per_window: int = WINDOW_INTERVALS,
) -> list[Window]:
    """Steady windows of a progress stream, warm-up after every (re)start dropped.

    A run is a stretch of samples at one size; a size change or a reset of the step counter (a
    restart from a checkpoint) starts a new run, whose first ``warmup_steps`` steps or
    ``warmup_s`` seconds (whichever ends first) are dropped. Each window is the median of the
    step times ``dt / dsteps`` of ``per_window`` consecutive intervals, with the time-weighted CPU
    share the job got over them (:attr:`ProgressSample.share`). A run with fewer steady intervals
    than that makes one window only once they span :data:`MIN_SHORT_WINDOW_S`.
    """
    units, taus, steps, share, end = window_arrays(samples, warmup_steps, warmup_s, per_window)
    return [
        Window(int(u), t, int(k), g, e)
        for u, t, k, g, e in zip(
            units.tolist(), taus.tolist(), steps.tolist(), share.tolist(), end.tolist(), strict=True
        )
    ]


def stale_before(now: float | None) -> float | None:
    """The time before which a key's history is stale, for a plan or watch at ``now``."""
    return None if now is None else now - STALE_S


def usable(
    units: FloatArray,
    share: FloatArray,
    end: FloatArray,
    *,
    stale_before: float | None = None,
) -> npt.NDArray[np.bool_]:
    """Which windows count as evidence of the job's speed.

    * A **contended** window (the job got less than :data:`CLEAN_SHARE` of the CPU time it asked
      for) measured the host, not the job: it is left out, unless every window is contended (the
      job has to be planned on something, and then it is planned on what it really got).
    * With ``stale_before`` (a key's history, read by a plan or watch at ``stale_before +
      STALE_S``), windows that ended earlier are left out as soon as newer ones exist: old
      evidence gives way to new, and a size only old runs measured is probed again.

    How *much* evidence a size needs before it may rule out scaling is the knee's business
    (:data:`SETTLED_WINDOWS`, ``qosflow.core.predict``), not a reason to drop windows.
    """
    keep = share >= CLEAN_SHARE
    if not keep.any():
        keep = np.ones_like(keep)
    if stale_before is not None:
        fresh = keep & (end >= stale_before)
        if fresh.any():
            keep = fresh
    return keep
