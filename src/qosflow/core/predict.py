"""Finish-time prediction: a median and a conservative finish for any candidate size.

``finish(n) = now + overhead(n_cur -> n) + remaining_steps * tau(n)``. The median uses the step time
measured at ``n`` (by this run or earlier runs of the key), else the fitted model; the conservative
finish uses that measurement's upper 90 % bound, else the 90th percentile of the bootstrap step times at
``n`` (wide where ``n`` was never observed), inflated by a split-conformal factor learnt from logged
(predicted, realised) remaining times — 1.15 before any exist. Past one node it never counts on a
size larger than every measured one.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from qosflow.core.fit import FitResult, Measured, anchored
from qosflow.core.speed import FloatArray, SpeedCurve, TableCurve, features, knee
from qosflow.core.windows import SETTLED_WINDOWS

DEFAULT_FACTOR = 1.15
"""Conformal inflation used before any (predicted, realised) pair has been logged."""
QUANTILE = 0.9
"""Bootstrap quantile of the step time used by the conservative curve."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """Split-conformal inflation of predicted remaining time.

    Attributes:
        factor: Multiplier on remaining time that covered the target share of past predictions.
        n: Number of (predicted, realised) pairs it was learnt from (0: the default).
    """

    factor: float = DEFAULT_FACTOR
    n: int = 0


def calibrate(
    pairs: Sequence[tuple[float, float]] | FloatArray, *, coverage: float = 0.9
) -> Calibration:
    """Learn the conformal factor from logged (predicted remaining s, realised remaining s) pairs.

    The factor is the ``ceil(coverage * (m + 1))``-th smallest of the ``m`` ratios realised /
    predicted (finite-sample coverage under exchangeability). With too few pairs for that rank
    the factor is the larger of the default and the largest ratio. It is never below 1, so the
    conservative finish never precedes the median.

    Args:
        pairs: (predicted, realised) remaining seconds, as pairs or an ``(m, 2)`` array; pairs
            with a non-positive or non-finite prediction are ignored.
        coverage: Target share of realised times at or below the inflated prediction.
    """
    both = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
    p, r = both[:, 0], both[:, 1]
    keep = (p > 0) & np.isfinite(p) & np.isfinite(r) & (r >= 0)
    ratios = r[keep] / p[keep]
    m = int(ratios.size)
    if m == 0:
        return Calibration()
    rank = math.ceil(min(max(coverage, 0.0), 1.0) * (m + 1))
    if rank > m:
        return Calibration(max(DEFAULT_FACTOR, float(ratios.max())), m)
    factor = float(np.partition(ratios, rank - 1)[rank - 1])
    return Calibration(max(factor, 1.0), m)


@dataclass(frozen=True, slots=True)
class Belief:
    """What a policy believes about one job's speed.

    Attributes:
        median: Expected step time by size.
        conservative: Pessimistic step time by size (bootstrap quantile x conformal factor).
        levels: Sizes the job may run at, ascending.
        knee: The level with the highest median throughput; never plan above it.
        observed: Sizes with measured step times; the probe rule plans at most one level beyond
            the largest (empty: nothing measured, every level plannable).
        probe_limit: Largest level the probe rule allows now (worked out from the above).
        any_speed: Whether the median knows a finite step time at some level (else: still
            measuring; worked out from the above).
        settled: Sizes measured for at least :data:`~qosflow.core.windows.SETTLED_WINDOWS`
            clean windows (this run's and the key's history's); ``None`` when the belief is not
            made of measurements (a table: every size is known), which the profile ladder
            (:mod:`qosflow.core.profile`) leaves alone.
    """

    median: SpeedCurve
    conservative: SpeedCurve
    levels: tuple[int, ...]
    knee: int
    observed: tuple[int, ...] = ()
    settled: tuple[int, ...] | None = None
    probe_limit: int = field(init=False, repr=False, compare=False)
    any_speed: bool = field(init=False, repr=False, compare=False)
    _fastest_below: tuple[tuple[int, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Work out once what the planners ask of every job at every decision."""
        probe = self.levels[-1] if self.levels else 0
        if self.observed and self.levels:
            top = max(self.observed)
            probe = next((n for n in self.levels if n > top), probe)
        object.__setattr__(self, "probe_limit", probe)
        # entry i: the level with the shortest conservative step time among the i smallest
        # (a tie keeps the fewer units), and that step time; entry 0 is "none"
        below, best, best_s = [(0, math.inf)], 0, math.inf
        for n in self.levels:
            step = self.conservative.step_time(n)
            if step < best_s:
                best, best_s = n, step
            below.append((best, best_s))
        object.__setattr__(self, "_fastest_below", tuple(below))
        median = self.median.step_time
        object.__setattr__(self, "any_speed", any(math.isfinite(median(n)) for n in self.levels))

    def best_plannable(self, units: int) -> int:
        """The fastest size a job now at ``units`` may be planned at.

        The knee, unless the probe rule stops short of it (beyond the measured sizes the
        conservative bound is the prior's, not the job's); the current size always counts.
        """
        return min(self.knee, max(self.probe_limit, units))

    def fastest_plannable(self, units: int) -> int:
        """The size up to :meth:`best_plannable` with the shortest conservative step time.

        The knee stays at a size whose measurement is still thin (a few windows cannot show that
        more units are no faster), but a job that needs all the speed it may use runs, and is
        judged, at the size believed fastest, not at a thin size believed slower.
        """
        cap = self.best_plannable(units)
        best, best_s = self._fastest_below[bisect.bisect_left(self.levels, cap)]
        return cap if best_s == math.inf or self.conservative.step_time(cap) < best_s else best


def belief_from_fit(
    fit: FitResult,
    levels: Sequence[int],
    calibration: Calibration,
    *,
    quantile: float = QUANTILE,
    known: Sequence[Measured] = (),
) -> Belief:
    """The belief a fit supports over the allowed levels.

    Where a size was measured (by this run, or by earlier runs of the key: ``known``), the median
    step time is the measurement (:func:`qosflow.core.fit.anchored`) and the conservative one is its
    upper ``quantile`` bound (normal, on the measurement's standard error) times the conformal
    factor; elsewhere the median is the fitted model and the conservative
    step time the bootstrap quantile times the factor. Below the smallest measured size it is at
    least a linear slow-down from there (``tau(m) * m / n``). Past one node, a size larger than
    every measured one is never faster than the best size at or below the larger of the node and
    the largest measured size (the fit cannot bound the cross-node cost there).

    Args:
        fit: A speed fit (a failed fit yields the prior's, or an infinite, step time).
        levels: Allowed sizes.
        calibration: Conformal inflation of the conservative curve.
        quantile: Bootstrap quantile of the conservative step time at unmeasured sizes.
        known: What earlier runs of the key measured (:func:`qosflow.core.fit.measured` of the key's
            history, the data the fit's prior was fitted on). Those sizes count as observed, for
            the probe rule and the slow-down rule, next to the job's own, and their medians
            anchor the belief there. Only measurements of the prior's data may be passed: a size
            no fit behind the belief saw is an extrapolation, whoever ran there.
    """
    ordered = tuple(sorted(set(levels)))
    median = anchored(fit.model, fit.measured, known)
    factor = max(calibration.factor, 1.0)
    model_med = fit.model.step_times(ordered)
    if fit.bootstrap:
        params = np.array([(m.t0, m.t1, m.t2, m.t3, m.t4) for m in fit.bootstrap])
        reps = params @ features(ordered, fit.model.node_size).T
        cons = np.maximum(np.quantile(reps, quantile, axis=0), model_med)
    else:
        cons = model_med
    at, z = median.measured, NormalDist().inv_cdf(min(max(quantile, 0.5), 0.999))
    upper = {n: v * math.exp(z * median.errors.get(n, 0.0)) for n, v in at.items()}
    cons = np.array([upper.get(n, c) for n, c in zip(ordered, cons.tolist(), strict=True)]) * factor
    observed = tuple(sorted(at))  # the job's own measured sizes and those of ``known``
    if observed:
        # below the smallest observed size, never assume better than linear slow-down: the
        # prior is pessimistic about scaling *up*, which makes it optimistic about scaling down
        low = observed[0]
        ns = np.array(ordered, dtype=np.float64)
        at_low = float(median.step_time(low)) * factor * low
        cons = np.where(ns < low, np.maximum(cons, at_low / ns), cons)
    cons = _measured_scaling_cap(cons, ordered, fit.model.node_size, observed)
    table = {  # a step time that underflowed to 0 is the fastest representable, not "no speed"
        n: (1.0 / max(c, sys.float_info.min) if c >= 0 and math.isfinite(c) else 0.0)
        for n, c in zip(ordered, cons.tolist(), strict=True)
    }
    windows: dict[int, int] = {}
    for m in (*fit.measured, *known):
        windows[m.units] = windows.get(m.units, 0) + m.windows
    settled = tuple(n for n in ordered if windows.get(n, 0) >= SETTLED_WINDOWS)
    return Belief(
        median,
        TableCurve(table),
        ordered,
        _settled_knee(median, ordered, windows),
        observed,
        settled,
    )


def _settled_knee(median: SpeedCurve, ordered: tuple[int, ...], windows: dict[int, int]) -> int:
    """The throughput knee, never below a size whose measurement is still thin.

    A knee below ``n`` says "``n`` units are no faster than fewer": a few windows (the first
    minute after a rescale, on a host busy with something else) must not say that for good. So
    a measured size with fewer than :data:`~qosflow.core.windows.SETTLED_WINDOWS` clean windows (this
    run's and earlier runs' together, ``windows``) keeps the knee at least at itself until it has
    them; then the measurement rules.
    """
    fastest = knee(median, ordered)
    thin = [n for n in ordered if n > fastest and 0 < windows.get(n, 0) < SETTLED_WINDOWS]
    return max(thin, default=fastest)


def _measured_scaling_cap(
    cons: FloatArray, ordered: tuple[int, ...], node_size: int, observed: tuple[int, ...]
) -> FloatArray:
    """Past one node, never count on a size larger than every measured one.

    Beyond a node the terms that dominate there (the linear ``t3 * (n - 1)`` and the cross-node
    ``t4``) are identified only by data there: before a size above the node was measured every
    bootstrap replicate keeps the prior's ``t4``, and one level past the largest measured
    multi-node size the 90th percentile swings with each new window (on ElasticFlow's T4 imagenet
    curve, between 0.8 and 4.3 s a step on one job, decision to decision). So at every size above
    both the node and the largest measured size, the conservative step time is at least the best
    one at or below the larger of the two. Within a node the probe rule may still plan one level
    past the measurements.
    """
    inside = np.asarray(ordered) <= max(node_size, max(observed, default=0))
    if not inside.any():
        return cons
    return np.where(inside, cons, np.maximum(cons, float(cons[inside].min())))


def oracle_belief(curve: SpeedCurve, levels: Sequence[int]) -> Belief:
    """A belief that knows the truth: conservative equals median, every level is plannable."""
    ordered = tuple(sorted(set(levels)))
    return Belief(curve, curve, ordered, knee(curve, ordered), ())


@dataclass(frozen=True, slots=True)
class Prediction:
    """Finish times of one job at one size (epoch seconds)."""

    units: int
    median_finish: float
    conservative_finish: float
    remaining_steps: int


def predict(
    belief: Belief,
    *,
    now: float,
    steps_done: int,
    total_steps: int,
    units: int,
    current_units: int,
    overhead_s: float = 0.0,
) -> Prediction:
    """Median and conservative finish if the job ran at ``units`` from ``now``.

    Args:
        belief: The job's speed belief.
        now: Current time.
        steps_done: Steps done so far.
        total_steps: Steps of the whole job.
        units: Candidate size.
        current_units: Size it runs at now, 0 while it holds nothing (queued or paused); a
            different ``units`` pays :func:`restart_charge`.
        overhead_s: Rescale cost (checkpoint, restart, warm-up) in seconds.
    """
    remaining = max(total_steps - steps_done, 0)
    if remaining == 0:
        return Prediction(units, now, now, 0)
    start = now + restart_charge(overhead_s, current_units, units)
    return Prediction(
        units,
        finish_on(belief.median, start, remaining, units),
        finish_on(belief.conservative, start, remaining, units),
        remaining,
    )


def restart_charge(overhead_s: float, held: int, units: int) -> float:
    """Seconds of restart a plan charges for running at ``units`` a job that holds ``held``.

    The one rule every prediction, the allocator's minimal shares and the simulator's learnt
    factor share: a job that keeps its size pays nothing, and every change pays ``overhead_s``,
    a running job's resize (checkpoint, restart, warm-up) and the start or resume of one that
    holds nothing (``held`` 0: queued or paused) alike, since a start waits for the same round,
    pod start-up and checkpoint load.
    """
    return overhead_s if units != held else 0.0


def finish_on(curve: SpeedCurve, start: float, remaining: int, units: int) -> float:
    """When ``remaining`` steps at ``units`` end on ``curve``, begun at ``start``.

    :func:`predict`'s finish times, one curve at a time (a caller scanning sizes for one bound,
    like :func:`qosflow.core.decide.minimal_share`, needs no :class:`Prediction` per size).
    """
    return float(start + remaining * curve.step_time(units)) if remaining else float(start)


def schedule(
    belief: Belief,
    *,
    start: float,
    steps_done: int,
    total_steps: int,
    units: int,
    deadline: float,
    margin: float,
    points: int = 50,
) -> list[tuple[float, int]]:
    """The deadline-derived schedule: steps that must be done by each instant.

    At time ``t`` the job must have done ``total - (deadline - margin - t) / tau_c(units)`` steps,
    ``tau_c`` the conservative step time: behind this line, the conservative finish at ``units`` is
    after ``deadline - margin`` (exactly where :func:`qosflow.core.decide.decide` stops being on track).

    Args:
        belief: The job's speed belief.
        start: First instant of the schedule.
        steps_done: Steps done at ``start`` (kept for symmetry with :func:`predict`).
        total_steps: Steps of the whole job.
        units: The chosen size.
        deadline: The deadline.
        margin: Safety margin before the deadline.
        points: Number of instants, evenly spaced from ``start`` to ``deadline - margin``.

    Returns:
        ``(time, steps)`` pairs; steps are within ``[0, total_steps]`` and non-decreasing.
    """
    del steps_done  # the line does not depend on where the job is now
    target = deadline - margin
    tau = belief.conservative.step_time(units)
    if not math.isfinite(target):
        return [(start, 0)]
    end = max(target, start)
    times = np.linspace(start, end, max(points, 2))
    if not math.isfinite(tau) or tau <= 0:
        need = np.full(times.size, float(total_steps))
    else:
        need = total_steps - (target - times) / tau
    steps = np.clip(np.ceil(need - 1e-9), 0, total_steps).astype(np.int64)
    return [(float(t), int(s)) for t, s in zip(times, steps, strict=True)]
