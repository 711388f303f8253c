"""The step-time model: how many seconds one training step takes at ``n`` resource units.

``tau(n) = t0 + t1/n + t2*[n>1](n-1)/n + t3*(n-1) + t4*[n>node_size]`` with every parameter >= 0:

* ``t0`` — fixed per-step cost (data loading, optimiser, a parameter-server round trip);
* ``t1`` — work split across units (a fixed global batch computed in parallel);
* ``t2`` — ring all-reduce bandwidth cost, growing towards ``t2`` as ``n`` grows;
* ``t3`` — per-unit latency or fan-in contention (the retrogression at large ``n``);
* ``t4`` — the step paid once the job spans more than one node.

Progress samples become windows in :mod:`qosflow.core.windows`; :mod:`qosflow.core.fit` fits
this model to them. Here: the model, the curves a belief is made of and the knee (the probe rule
is :attr:`qosflow.core.predict.Belief.probe_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

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
            :mod:`qosflow.core.usage`); ``None`` when the job did not report it (counted as clean).
        pods: Over how many pods the units were spread (``pods × units/pod``; the speed
            model's cross-node term ``t4`` is what a size above one pod costs).
    """

    time: float
    steps_done: int
    units: int
    share: float | None = None
    pods: int = 1


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
    _taus: dict[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        taus = {
            n: 1.0 / x
            for n, x in self.throughput_by_units.items()
            if math.isfinite(x) and x > 0  # the planners ask millions of times: divide once
        }
        object.__setattr__(self, "_taus", taus)

    def step_time(self, n: int) -> float:
        """Seconds per step; ``inf`` where the table has no (positive) value."""
        return self._taus.get(n, math.inf)


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
