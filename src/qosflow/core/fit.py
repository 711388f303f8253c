"""The speed fit: windows → one row per measured size + prior pseudo-rows → weighted NNLS.

:func:`fit` aggregates the usable windows (:mod:`qosflow.core.windows`) per size, adds prior
pseudo-rows (history, or a pessimistic default shape) whose weight decays as windows accumulate,
and solves a weighted ``scipy.optimize.nnls``, with a parameter bootstrap for the conservative
bound. A fit that cannot be made is a :class:`FitResult` with ``success=False`` — never an
exception. :func:`anchored` lays the measurements over the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from qosflow.core.speed import (
    UNKNOWN,
    FloatArray,
    ProgressSample,
    SpeedModel,
    features,
    pessimistic_prior,
)
from qosflow.core.windows import (
    WARMUP_S,
    WARMUP_STEPS,
    WINDOW_INTERVALS,
    usable,
    window_arrays,
)

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
            because they were stale next to newer ones (:func:`qosflow.core.windows.usable`).
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
    at_n = prior.step_times(n)
    # the prior is rescaled on the observed sizes where it predicts a time: one that is 0 s at a
    # measured size (a key's history fitted only on multi-node sizes has t0 = t1 = 0, so 0 s on
    # one unit) still knows the shape elsewhere, such as the cost of crossing a node
    known = np.isfinite(at_n) & (at_n > 0.0)
    if known.any():
        ratio = tau[known] / at_n[known]
        ptau = ptau * float(np.exp(np.average(np.log(ratio), weights=count[known])))
    elif n.size:
        ptau = np.full_like(ptau, np.nan)  # no size to scale it on: the prior says nothing
    weight_prior = 1.0 / (PRIOR_SIGMA * math.sqrt(1.0 + float(count.sum()) / PRIOR_DECAY))
    # a prior that predicts no time (or none at all) at a size says nothing there: its row is
    # dropped (weight 0) instead of turning the whole system into NaN (a key's history fitted
    # only on multi-node sizes can give t0 = t1 = 0, so 0 s per step on one unit)
    usable = np.isfinite(ptau) & (ptau > 0.0)
    ptau = np.where(usable, ptau, 0.0)
    prior_w = np.where(usable, weight_prior / np.where(usable, ptau, 1.0), 0.0)
    w = np.concatenate((np.sqrt(count) / sigma / tau, prior_w))
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
    stale_before: float | None = None,
) -> FitResult:
    """Fit the step-time model to a progress stream; never raises for bad data.

    Args:
        samples: Progress samples of one job (any order; several sizes and restarts allowed).
        node_size: Units per node (where ``t4`` starts to apply).
        prior: A model from history; ``None`` uses the pessimistic default shape. Either way the
            prior is rescaled to the observed step times and only shapes the unobserved sizes.
        rng: Generator for the parameter bootstrap (a fixed seed when ``None``: deterministic).
        stale_before: A key's history: windows that ended before this time give way to newer
            ones (:func:`qosflow.core.windows.usable`).

    Returns:
        The :class:`FitResult`; ``success=False`` when there is no steady window to fit.
    """
    units, taus, _, share, end = window_arrays(samples, WARMUP_STEPS, WARMUP_S, WINDOW_INTERVALS)
    keep = usable(units, share, end, stale_before=stale_before)
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
    left_out = f", {discounted} contended or stale windows left out" if discounted else ""
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
    stale_before: float | None = None,
) -> tuple[Measured, ...]:
    """The median steady step time at each size of ``samples`` (what :func:`fit` is fitted to).

    Applied to a key's history (with ``stale_before``) it gives what earlier runs of the key
    measured, which a new run counts as measured (``known`` in
    :func:`qosflow.core.predict.belief_from_fit`). The same windows count as in :func:`fit`.
    """
    units, taus, _, share, end = window_arrays(samples, WARMUP_STEPS, WARMUP_S, WINDOW_INTERVALS)
    keep = usable(units, share, end, stale_before=stale_before)
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
