"""Shared builders for the core-model tests: job specs and synthetic progress streams.

They are handed out as session fixtures (``spec_of``, ``stream_of``, ``t0``), not imported, so
other test folders can have their own ``conftest.py`` without a module-name clash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np
import pytest

from qosflow.core.spec import JobSpec, load_job
from qosflow.core.speed import ProgressSample, SpeedCurve

NOW = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)
T0 = NOW.timestamp()


def _make_spec(
    *,
    total_steps: int = 20_000,
    deadline_s: float = 7200.0,
    levels: Sequence[int] = (1, 2, 4, 8, 16),
    per_node: int = 8,
    margin_seconds: float = 30.0,
    dwell_seconds: float = 60.0,
    best_effort: bool = False,
) -> JobSpec:
    """A validated job submitted at ``T0`` with a deadline ``deadline_s`` later."""
    return load_job(
        {
            "name": "job",
            "total_steps": total_steps,
            "deadline": f"PT{deadline_s:.0f}S",
            "best_effort": best_effort,
            "margin_seconds": margin_seconds,
            "dwell_seconds": dwell_seconds,
            "resources": {
                "min": min(levels),
                "max": max(levels),
                "levels": sorted(levels),
                "per_node": per_node,
            },
        },
        now=NOW,
    )


def _stream(
    curve: SpeedCurve,
    plan: Sequence[tuple[int, int]],
    rng: np.random.Generator,
    *,
    sigma: float = 0.05,
    every: int = 10,
    start: float = T0,
    steps: int = 0,
    warmup_factor: float = 1.0,
) -> list[ProgressSample]:
    """Progress samples of a job running ``plan`` = [(units, steps), ...] in order.

    Every step takes ``curve.step_time(units)`` times lognormal noise (``sigma``); a sample is taken
    every ``every`` steps; the first 20 steps after each size change take ``warmup_factor`` times
    longer; a 30 s restart gap separates the sizes.
    """
    out: list[ProgressSample] = []
    t, k = start, steps
    for units, n_steps in plan:
        out.append(ProgressSample(t, k, units))
        tau = curve.step_time(units)
        per_step = tau * rng.lognormal(0.0, sigma, n_steps)
        per_step[:20] *= warmup_factor
        times = np.cumsum(per_step)
        for i in range(every, n_steps + 1, every):
            out.append(ProgressSample(t + float(times[i - 1]), k + i, units))
        t += float(times[-1]) + 30.0
        k += n_steps
    return out


SpecFactory = Callable[..., JobSpec]
StreamFactory = Callable[..., list[ProgressSample]]


@pytest.fixture(scope="session")
def spec_of() -> SpecFactory:
    return _make_spec


@pytest.fixture(scope="session")
def stream_of() -> StreamFactory:
    return _stream


@pytest.fixture(scope="session")
def t0() -> float:
    return T0


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)
