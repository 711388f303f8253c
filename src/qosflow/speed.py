"""The step-time model: how many seconds one training step takes at ``n`` resource units.

``tau(n) = t0 + t1/n + t2*[n>1](n-1)/n + t3*(n-1) + t4*[n>node_size]`` with every parameter >= 0:

* ``t0`` — fixed per-step cost (data loading, optimiser, a parameter-server round trip);
* ``t1`` — work split across units (a fixed global batch computed in parallel);
* ``t2`` — ring all-reduce bandwidth cost, growing towards ``t2`` as ``n`` grows;
* ``t3`` — per-unit latency or fan-in contention (the retrogression at large ``n``);
* ``t4`` — the step paid once the job spans more than one node.

:func:`fit` turns progress samples ``(time, steps_done, units)`` into windows (warm-up after every
(re)start dropped, median step time per window), aggregates them per size, adds prior pseudo-rows
(history, or a pessimistic default shape) whose weight decays as windows accumulate, and solves a
weighted ``scipy.optimize.nnls``. A fit that cannot be made is a :class:`FitResult` with
``success=False`` — never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

FloatArray = npt.NDArray[np.float64]

WARMUP_STEPS = 20
"""Steps dropped after every (re)start, unless :data:`WARMUP_S` passes first."""
WARMUP_S = 60.0
"""Seconds dropped after every (re)start, unless :data:`WARMUP_STEPS` pass first."""
WINDOW_INTERVALS = 5
"""Consecutive sample intervals per window; each window yields one median step time."""
BOOTSTRAP = 100
"""Parameter bootstrap replicas per fit."""
PRIOR_SIGMA = 0.25
"""Relative uncertainty of a prior pseudo-row (the prior's shape is believed to within 25 %)."""
PRIOR_DECAY = 10.0
"""Prior pseudo-rows weigh ``1 / (PRIOR_SIGMA * sqrt(1 + windows / PRIOR_DECAY))``."""
SIGMA_FLOOR = 0.02
"""Smallest relative noise assumed for an observed size (guards against over-confident rows)."""
SIGMA_DEFAULT = 0.05
"""Relative noise assumed for a size observed in one window only."""
PRIOR_YIELD = 0.1
"""Factor on the prior rows' weight each time the fit contradicts an observed size."""
CLEAN_SHARE = 0.8
"""A window in which the job got less than this share of the CPU time it asked for is contended."""
SETTLED_WINDOWS = 3
"""Clean windows a size needs before its measurement may rule out scaling (see :func:`usable`)."""
STALE_S = 30 * 86400.0
"""A key's history windows older than this (before the plan or watch) no longer settle a size."""

# Pessimistic default shape, normalised to tau(1) = 1: speed-up 1.5x at 2, 1.9x at 4, 2.3x at 8.
_DEFAULT_SHAPE = (0.3, 0.7, 0.05, 0.0, 0.02)


@runtime_checkable
class SpeedCurve(Protocol):
    """Anything that knows the seconds per step at ``n`` units."""

    def step_time(self, n: int) -> float:
        """Seconds per step at ``n`` units (``inf`` when the job cannot run there)."""
        ...


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """One progress observation: ``steps_done`` steps were done at ``time`` running on ``units``.

    Attributes:
        time: When it was observed (epoch seconds, or simulated seconds).
        steps_done: Steps done by then.
        units: Size the job ran at.
        share: Of the CPU time the job's threads asked for over the interval that ends here, the
            share they got (``cpu / (cpu + run-queue wait + throttled)``, see
            :mod:`qosflow.usage`); ``None`` when the job did not report it (counted as clean).
    """

    time: float
    steps_done: int
    units: int
    share: float | None = None


def features(n: npt.ArrayLike, node_size: int) -> FloatArray:
    """Feature rows ``[1, 1/n, [n>1](n-1)/n, n-1, [n>node_size]]`` of sizes ``n`` (shape ``(k, 5)``)."""
    units = np.atleast_1d(np.asarray(n, dtype=np.float64))
    return np.column_stack(
        (
            np.ones_like(units),
            1.0 / units,
            np.where(units > 1, (units - 1.0) / units, 0.0),
            units - 1.0,
            (units > node_size).astype(np.float64),
        )
    )


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """The fitted step-time model; every parameter is in seconds and non-negative.

    Attributes:
        t0: Fixed per-step cost.
        t1: Parallelisable work (seconds at one unit).
        t2: All-reduce bandwidth cost (reached as ``n`` grows).
        t3: Per-additional-unit latency / contention.
        t4: Cost of crossing the node boundary.
        node_size: Units per node; ``t4`` applies above it.
    """

    t0: float
    t1: float
    t2: float
    t3: float
    t4: float
    node_size: int

    @property
    def params(self) -> FloatArray:
        """The parameters as an array ``[t0, t1, t2, t3, t4]``."""
        return np.array([self.t0, self.t1, self.t2, self.t3, self.t4], dtype=np.float64)

    @classmethod
    def from_params(cls, params: npt.ArrayLike, node_size: int) -> SpeedModel:
        """Build a model from ``[t0, t1, t2, t3, t4]``."""
        t0, t1, t2, t3, t4 = (float(v) for v in np.asarray(params, dtype=np.float64))
        return cls(t0, t1, t2, t3, t4, node_size)

    def step_time(self, n: int) -> float:
        """Seconds per step at ``n`` units."""
        if n < 1:
            return math.inf
        cross = self.t4 if n > self.node_size else 0.0
        spread = self.t2 * (n - 1) / n if n > 1 else 0.0
        return self.t0 + self.t1 / n + spread + self.t3 * (n - 1) + cross

    def step_times(self, n: npt.ArrayLike) -> FloatArray:
        """Vectorised :meth:`step_time`."""
        return features(n, self.node_size) @ self.params

    def throughput(self, n: int) -> float:
        """Steps per second at ``n`` units (0 where the step time is infinite)."""
        tau = self.step_time(n)
        return 0.0 if not math.isfinite(tau) or tau <= 0 else 1.0 / tau

    def scaled(self, factor: float) -> SpeedModel:
        """The same shape with every step time multiplied by ``factor``."""
        return SpeedModel.from_params(self.params * factor, self.node_size)


UNKNOWN = SpeedModel(math.inf, 0.0, 0.0, 0.0, 0.0, 1)
"""The model of a job nothing is known about: infinite step time (nothing can be promised)."""


def pessimistic_prior(node_size: int, *, step_time: float = 1.0, units: int = 1) -> SpeedModel:
    """The default prior: poor scaling, scaled so ``tau(units) == step_time``.

    Pessimism is deliberate: an optimistic prior makes a deadline job scale up too little and miss.
    """
    shape = SpeedModel.from_params(_DEFAULT_SHAPE, node_size)
    return shape.scaled(step_time / shape.step_time(units))


@dataclass(frozen=True, slots=True)
class TableCurve:
    """Oracle speeds (e.g. an ElasticFlow throughput table): steps per second by units."""

    throughput_by_units: Mapping[int, float]

    def step_time(self, n: int) -> float:
        """Seconds per step; ``inf`` where the table has no (positive) value."""
        x = self.throughput_by_units.get(n)
        if x is None or not math.isfinite(x) or x <= 0:
            return math.inf
        return 1.0 / x


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


@dataclass(frozen=True, slots=True)
class Measured:
    """What was measured at one size: the median steady step time over its windows.

    Attributes:
        units: The size.
        step_time: Median seconds per step over the steady windows at this size.
        windows: Number of those windows.
        noise: Relative spread of one window (scaled MAD; :data:`SIGMA_DEFAULT` for one window).
    """

    units: int
    step_time: float
    windows: int
    noise: float = SIGMA_DEFAULT

    @property
    def error(self) -> float:
        """Relative standard error of :attr:`step_time` (a median of ``windows`` windows)."""
        return 1.2533 * self.noise / math.sqrt(max(self.windows, 1))


@dataclass(frozen=True, slots=True)
class FitResult:
    """Outcome of :func:`fit`; ``success=False`` carries the reason in ``message``.

    Attributes:
        success: True when progress data were fitted.
        model: The fitted model (the prior, or :data:`UNKNOWN`, when the fit failed).
        residual: RMS relative error of the model at the observed sizes.
        n_samples: Progress samples given.
        observed_units: Sizes with at least one steady window, ascending.
        message: What happened, in words.
        bootstrap: Parameter bootstrap replicas (may be empty).
        windows: Steady windows used.
        measured: The median step time measured at each observed size (what the fit was fitted
            to; :func:`anchored` prefers it to the model there).
        discounted: Windows left out because the job could not use its size (contended) or
            because they were too few at their size to count (:func:`fit`'s ``settled_only``).
    """

    success: bool
    model: SpeedModel
    residual: float
    n_samples: int
    observed_units: tuple[int, ...]
    message: str
    bootstrap: tuple[SpeedModel, ...] = ()
    windows: int = 0
    measured: tuple[Measured, ...] = ()
    discounted: int = 0


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
    if taus.size == 0:
        return empty, empty, empty, empty
    # chunks of per_window intervals; a short tail (at most half a window) joins the chunk before
    chunks = max(1, 1 + len(range(per_window, taus.size - per_window // 2, per_window)))
    idx = np.minimum(np.arange(taus.size) // per_window, chunks - 1)
    sums = np.asarray(np.bincount(idx, weights=steps, minlength=chunks), dtype=np.float64)
    span = np.bincount(idx, weights=dt, minlength=chunks)
    share = np.bincount(idx, weights=weighted, minlength=chunks) / span
    tail = np.concatenate((np.flatnonzero(np.diff(idx)), [idx.size - 1]))
    return _chunk_medians(taus, idx, chunks), sums, share, last[tail]


def _window_arrays(
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
    share the job got over them (:attr:`ProgressSample.share`).
    """
    units, taus, steps, share, end = _window_arrays(samples, warmup_steps, warmup_s, per_window)
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
    settled_only: bool = False,
    stale_before: float | None = None,
) -> npt.NDArray[np.bool_]:
    """Which windows count as evidence of the job's speed.

    * A **contended** window (the job got less than :data:`CLEAN_SHARE` of the CPU time it asked
      for) measured the host, not the job: it is left out, unless every window is contended (the
      job has to be planned on something, and then it is planned on what it really got).
    * With ``settled_only`` (a key's history, read by the next run), a size with fewer than
      :data:`SETTLED_WINDOWS` clean windows ending at or after ``stale_before`` is *thin* and is
      left out once another size is settled: a short or old stretch at one size never overturns
      the shape the rest of the history and the prior give; the next run probes it again.
    """
    clean = share >= CLEAN_SHARE
    if not clean.any():
        clean = np.ones_like(clean)
    if not settled_only or units.size == 0:
        return clean
    fresh = clean if stale_before is None else clean & (end >= stale_before)
    sizes, counts = np.unique(units[fresh], return_counts=True)
    settled = sizes[counts >= SETTLED_WINDOWS]
    return clean & np.isin(units, settled) if settled.size else clean


def _levels_table(
    units: FloatArray, taus: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per observed size: units, median step time, relative noise, window count."""
    n = np.unique(units)
    tau, sigma, count = np.empty(n.size), np.empty(n.size), np.empty(n.size)
    for i, size in enumerate(n.tolist()):
        v = taus[units == size]
        med = float(np.median(v))
        mad = float(np.median(np.abs(v - med))) * 1.4826 / med if v.size > 1 else SIGMA_DEFAULT
        tau[i], sigma[i], count[i] = med, max(mad, SIGMA_FLOOR), v.size
    return n, tau, sigma, count


def _prior_grid(node_size: int, observed: FloatArray) -> FloatArray:
    top = max(64, 4 * node_size, int(observed.max(initial=1)) * 2)
    grid = {2**i for i in range(int(math.log2(top)) + 1)} | {node_size, node_size + 1}
    return np.array(sorted(grid), dtype=np.float64)


def _design(
    table: tuple[FloatArray, FloatArray, FloatArray, FloatArray], node_size: int, prior: SpeedModel
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Weighted relative rows ``(A, b)`` and each row's relative noise for the bootstrap.

    Data rows (one per observed size) weigh ``sqrt(windows) / noise``; prior pseudo-rows (the
    prior rescaled to the observed step times) weigh ``1 / (PRIOR_SIGMA * sqrt(1 + windows /
    PRIOR_DECAY))``, so they fade as windows accumulate. Rows are divided by their target, so the
    fit minimises relative error.
    """
    n, tau, sigma, count = table
    grid = _prior_grid(node_size, n)
    ptau = prior.step_times(grid)
    if n.size:
        scale = float(np.exp(np.average(np.log(tau / prior.step_times(n)), weights=count)))
        ptau = ptau * scale
    weight_prior = 1.0 / (PRIOR_SIGMA * math.sqrt(1.0 + float(count.sum()) / PRIOR_DECAY))
    w = np.concatenate((np.sqrt(count) / sigma / tau, np.full(grid.size, weight_prior) / ptau))
    rows = np.vstack((features(n, node_size), features(grid, node_size)))
    target = np.concatenate((tau, ptau))
    noise = np.concatenate((1.2533 * sigma / np.sqrt(count), np.full(grid.size, PRIOR_SIGMA)))
    return rows * w[:, None], target * w, noise


def _solve(
    a: FloatArray, b: FloatArray, noise: FloatArray, data_rows: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """NNLS; while the fit misses an observed size by more than its noise, the prior yields.

    The prior only exists to shape sizes without data: when the fitted step time at an observed
    size is off by more than ``max(2.5 x its standard error, 1 %)``, the prior rows' weight drops
    tenfold and the fit is redone (at most three times).

    Raises:
        RuntimeError: When NNLS hits its iteration limit.
        ValueError: On non-finite input.
    """
    params, _ = nnls(a, b)
    tol = np.maximum(2.5 * noise[:data_rows], 0.01)
    for _ in range(3):
        if data_rows == 0 or np.all(np.abs(a[:data_rows] @ params / b[:data_rows] - 1.0) <= tol):
            break
        a, b = a.copy(), b.copy()
        a[data_rows:] *= PRIOR_YIELD
        b[data_rows:] *= PRIOR_YIELD
        params, _ = nnls(a, b)
    return params, a, b


def _bootstrap(
    a: FloatArray,
    b: FloatArray,
    noise: FloatArray,
    active: npt.NDArray[np.bool_],
    rng: np.random.Generator,
) -> FloatArray:
    """Replica parameters: perturb every row's target, re-solve on the NNLS active set, clip at 0."""
    z = rng.standard_normal((BOOTSTRAP, b.size))
    targets = b[None, :] * np.exp(noise[None, :] * z - 0.5 * noise[None, :] ** 2)
    out = np.zeros((BOOTSTRAP, a.shape[1]))
    if active.any():
        sol, *_ = np.linalg.lstsq(a[:, active], targets.T, rcond=None)
        out[:, active] = np.clip(sol.T, 0.0, None)
    return out


def fit(
    samples: Sequence[ProgressSample],
    *,
    node_size: int,
    prior: SpeedModel | None = None,
    rng: np.random.Generator | None = None,
    settled_only: bool = False,
    stale_before: float | None = None,
) -> FitResult:
    """Fit the step-time model to a progress stream; never raises for bad data.

    Args:
        samples: Progress samples of one job (any order; several sizes and restarts allowed).
        node_size: Units per node (where ``t4`` starts to apply).
        prior: A model from history; ``None`` uses the pessimistic default shape. Either way the
            prior is rescaled to the observed step times and only shapes the unobserved sizes.
        rng: Generator for the parameter bootstrap (a fixed seed when ``None``: deterministic).
        settled_only: Leave thin sizes out (a key's history: see :func:`usable`).
        stale_before: With ``settled_only``, windows that ended before this time do not settle
            a size.

    Returns:
        The :class:`FitResult`; ``success=False`` when there is no steady window to fit.
    """
    units, taus, _, share, end = _window_arrays(samples, WARMUP_STEPS, WARMUP_S, WINDOW_INTERVALS)
    keep = usable(units, share, end, settled_only=settled_only, stale_before=stale_before)
    discounted = int(units.size - keep.sum())
    units, taus = units[keep], taus[keep]
    if units.size == 0 and prior is None:
        return FitResult(
            False, UNKNOWN, math.inf, len(samples), (), "no steady progress window yet"
        )
    base = prior if prior is not None else pessimistic_prior(node_size)
    table = _levels_table(units, taus)
    a, b, noise = _design(table, node_size, SpeedModel.from_params(base.params, node_size))
    try:
        params, a, b = _solve(a, b, noise, int(table[0].size))
    except (RuntimeError, ValueError) as exc:  # iteration limit or non-finite input
        return FitResult(False, prior or UNKNOWN, math.inf, len(samples), (), f"nnls failed: {exc}")
    model = SpeedModel.from_params(params, node_size)
    reps = _bootstrap(a, b, noise, params > 0, rng if rng is not None else np.random.default_rng(0))
    boot = tuple(SpeedModel(p[0], p[1], p[2], p[3], p[4], node_size) for p in reps.tolist())
    if units.size == 0:
        why = "no steady progress window yet; using the history prior"
        return FitResult(False, model, math.inf, len(samples), (), why, boot, discounted=discounted)
    n, tau = table[0], table[1]
    residual = float(np.sqrt(np.mean((model.step_times(n) / tau - 1.0) ** 2)))
    if not math.isfinite(residual):
        return FitResult(False, prior or UNKNOWN, math.inf, len(samples), (), "fit is not finite")
    observed = tuple(int(v) for v in n.tolist())
    left_out = f", {discounted} contended or thin windows left out" if discounted else ""
    message = (
        f"fitted {units.size} windows at sizes {list(observed)} (rms error {residual:.1%}, "
        f"{'history' if prior is not None else 'pessimistic default'} prior{left_out})"
    )
    return FitResult(
        True,
        model,
        residual,
        len(samples),
        observed,
        message,
        boot,
        int(units.size),
        _measured(table),
        discounted,
    )


def _measured(table: tuple[FloatArray, FloatArray, FloatArray, FloatArray]) -> tuple[Measured, ...]:
    n, tau, sigma, count = table
    return tuple(
        Measured(int(u), float(t), int(c), float(e))
        for u, t, c, e in zip(n.tolist(), tau.tolist(), count.tolist(), sigma.tolist(), strict=True)
    )


def measured(
    samples: Sequence[ProgressSample],
    *,
    settled_only: bool = False,
    stale_before: float | None = None,
) -> tuple[Measured, ...]:
    """The median steady step time at each size of ``samples`` (what :func:`fit` is fitted to).

    Applied to a key's history (``settled_only``) it gives what earlier runs of the key
    measured, which a new run counts as measured (``known`` in
    :func:`qosflow.predict.belief_from_fit`). The same windows count as in :func:`fit`.
    """
    units, taus, _, share, end = _window_arrays(samples, WARMUP_STEPS, WARMUP_S, WINDOW_INTERVALS)
    keep = usable(units, share, end, settled_only=settled_only, stale_before=stale_before)
    return _measured(_levels_table(units[keep], taus[keep])) if keep.any() else ()


@dataclass(frozen=True, slots=True)
class AnchoredCurve:
    """A fitted model anchored to measurements: the measured median wherever a size was measured.

    The five-parameter model cannot follow every real speed curve exactly (a few per cent off at
    some sizes is common); where a size was measured, the measurement is the better estimate, and
    the model only fills the sizes nobody measured.

    Attributes:
        model: The fitted model (every size without a measurement).
        measured: Measured median step time by size.
        errors: Relative standard error of each measured step time, by size.
    """

    model: SpeedModel
    measured: Mapping[int, float]
    errors: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))

    def step_time(self, n: int) -> float:
        """Seconds per step: the measurement at ``n`` if there is one, else the model's."""
        value = self.measured.get(n)
        return value if value is not None else self.model.step_time(n)


def anchored(
    model: SpeedModel, own: Sequence[Measured], known: Sequence[Measured] = ()
) -> AnchoredCurve:
    """``model`` anchored to what this run measured (``own``) and earlier runs measured (``known``).

    While this run agrees with the earlier ones (at every size both measured, within the larger
    of 2.5 combined standard errors and 1 %), they are one sample: each size takes the
    window-weighted geometric mean of every median measured there (its standard error combined). Once this run contradicts
    them (tonight's data make every step slower, say), its own medians rule where it measured,
    and the sizes only earlier runs measured keep their shape, rescaled by how this run compares
    with them where both measured (the window-weighted geometric mean of the ratios).
    """
    mine = {m.units: m for m in own}
    common = [(mine[k.units], k) for k in known if k.units in mine]
    ratio = np.array([math.log(a.step_time / b.step_time) for a, b in common])
    tol = np.array([max(2.5 * math.hypot(a.error, b.error), 0.01) for a, b in common])
    table: dict[int, tuple[float, float]] = {}  # size -> (step time, relative standard error)
    if not common or bool(np.all(np.abs(ratio) <= tol)):
        pooled: dict[int, list[Measured]] = {}
        for m in (*own, *known):
            pooled.setdefault(m.units, []).append(m)
        for units, ms in pooled.items():
            if len(ms) == 1:
                table[units] = (ms[0].step_time, ms[0].error)
                continue
            logs = [math.log(m.step_time) for m in ms]
            value = math.exp(np.average(logs, weights=[max(m.windows, 1) for m in ms]))
            table[units] = (value, 1.0 / math.sqrt(sum(1.0 / max(m.error, 1e-9) ** 2 for m in ms)))
    else:
        weights = [max(min(a.windows, b.windows), 1) for a, b in common]
        scale = math.exp(float(np.average(ratio, weights=weights)))
        spread = min(a.error for a, _ in common)  # the scale is as uncertain as this run's data
        table = {
            k.units: (k.step_time * scale, math.hypot(k.error, spread))
            for k in known
            if k.units not in mine
        }
        table.update({m.units: (m.step_time, m.error) for m in own})
    ordered = dict(sorted(table.items()))
    return AnchoredCurve(
        model,
        MappingProxyType({n: v for n, (v, _) in ordered.items()}),
        MappingProxyType({n: e for n, (_, e) in ordered.items()}),
    )


def knee(curve: SpeedCurve, levels: Sequence[int]) -> int:
    """The throughput knee: the smallest level with the highest throughput.

    Args:
        curve: The speed curve.
        levels: Allowed sizes (any order, at least one).

    Returns:
        The level with the smallest step time (ties go to the smaller level).
    """
    ordered = sorted(levels)
    taus = [curve.step_time(n) for n in ordered]
    best = min(taus)
    if not math.isfinite(best):
        return ordered[0]
    return next(n for n, t in zip(ordered, taus, strict=True) if t <= best * (1 + 1e-9))


def plannable_levels(levels: Sequence[int], observed_units: Sequence[int]) -> tuple[int, ...]:
    """The probe rule: the levels at most one level beyond the largest observed size.

    With nothing observed yet every level is plannable (the plan rests on the prior alone).
    """
    ordered = tuple(sorted(set(levels)))
    if not observed_units:
        return ordered
    top = max(observed_units)
    above = [n for n in ordered if n > top]
    limit = above[0] if above else top
    return tuple(n for n in ordered if n <= limit)
