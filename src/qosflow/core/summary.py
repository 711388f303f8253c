"""JSON forms of what the job board shares between the steps of different DAGs.

Every watch publishes its own job's belief and the allocator's state of it; every other watch
reads them back to build the allocator's snapshot (:class:`qosflow.core.allocator.ClusterInput`).
A belief travels as its tables over the job's allowed levels: that is all the allocator and the
decision ever ask of it (they only evaluate step times at allowed levels), so the belief read
back decides exactly as the one published.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from qosflow.core.allocator import JobState
from qosflow.core.errors import SpecError
from qosflow.core.predict import Belief
from qosflow.core.speed import TableCurve


def _rate(step_time: float) -> float | None:
    """Steps per second as JSON (``None``: no speed there)."""
    return 1.0 / step_time if math.isfinite(step_time) and step_time > 0 else None


def belief_to_dict(belief: Belief, factor: float | None = None) -> dict[str, Any]:
    """A belief as JSON: throughput tables at its levels, knee, observed and settled sizes, factor."""
    return {
        "levels": list(belief.levels),
        "median": [_rate(belief.median.step_time(n)) for n in belief.levels],
        "conservative": [_rate(belief.conservative.step_time(n)) for n in belief.levels],
        "knee": belief.knee,
        "observed": list(belief.observed),
        "settled": None if belief.settled is None else list(belief.settled),
        "factor": factor,
    }


def belief_from_dict(data: Mapping[str, Any]) -> Belief:
    """Inverse of :func:`belief_to_dict` (the ``factor`` is read with :func:`belief_factor`).

    Raises:
        SpecError: Naming the field when ``data`` is not a belief.
    """
    try:
        levels = tuple(int(n) for n in data["levels"])
        tables = [
            TableCurve({n: float(r) for n, r in zip(levels, data[k], strict=True) if r is not None})
            for k in ("median", "conservative")
        ]
        knee, observed = int(data["knee"]), tuple(int(n) for n in data.get("observed", ()))
        raw = data.get("settled")
        settled = None if raw is None else tuple(int(n) for n in raw)
    except KeyError as exc:
        raise SpecError(f"belief.{exc.args[0]}", "is required") from None
    except (TypeError, ValueError) as exc:
        raise SpecError("belief", f"malformed: {exc}") from None
    if not levels or knee not in levels:
        raise SpecError("belief.knee", f"must be one of the levels {list(levels)} (got {knee})")
    return Belief(tables[0], tables[1], levels, knee, observed, settled)


def belief_factor(data: Mapping[str, Any]) -> float | None:
    """The conformal factor a published belief was built with."""
    factor = data.get("factor")
    return None if factor is None else float(factor)


def rescaled(belief: Belief, old: float | None, new: float) -> Belief:
    """The belief with its conservative step times under factor ``new`` instead of ``old``.

    The conformal factor multiplies every conservative step time
    (:func:`qosflow.core.predict.belief_from_fit`), so a published belief is re-inflated by the
    ratio: the promise of a guarantee admitted under a larger factor.
    """
    ratio = max(new, 1.0) / max(old if old is not None else 1.0, 1.0)
    table = {
        n: 1.0 / (belief.conservative.step_time(n) * ratio)
        for n in belief.levels
        if math.isfinite(belief.conservative.step_time(n))
    }
    return Belief(
        belief.median,
        TableCurve(table),
        belief.levels,
        belief.knee,
        belief.observed,
        belief.settled,
    )


def state_to_dict(state: JobState) -> dict[str, Any]:
    """The allocator's memory of a job as JSON."""
    return {
        "seen": state.seen,
        "guaranteed": state.guaranteed,
        "klass": state.klass,
        "floor": state.floor,
        "asked_at": state.asked_at,
        "rescaled_at": state.rescaled_at,
        "target": state.target,
        "pressed": state.pressed,
        "profiling": state.profiling,
    }


def state_from_dict(data: Mapping[str, Any]) -> JobState:
    """Inverse of :func:`state_to_dict` (missing fields take their defaults)."""

    def number(key: str) -> float | None:
        value = data.get(key)
        return None if value is None else float(value)

    return JobState(
        seen=bool(data.get("seen", False)),
        guaranteed=bool(data.get("guaranteed", False)),
        klass=None if data.get("klass") is None else str(data["klass"]),
        floor=float(data.get("floor") or 0.0),
        asked_at=number("asked_at"),
        rescaled_at=number("rescaled_at"),
        target=None if data.get("target") is None else int(data["target"]),
        pressed=bool(data.get("pressed", False)),
        profiling=bool(data.get("profiling", False)),
    )
