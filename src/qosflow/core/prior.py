"""What a key's history says: its fit (the next run's prior) and its runs laid end to end.

Pure functions over samples already read (from the history store in a deployment, from the
simulator's record of completed runs in simulation), so the plan step, the watch and the
simulator turn a key's history into a prior the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the speed model pulls in scipy: not for a process that only writes samples
    from qosflow.core.fit import FitResult, Measured
    from qosflow.core.speed import ProgressSample, SpeedModel

HISTORY_LIMIT = 5000
"""Newest samples of a key a plan or a watch reads (``HistoryStore.history``)."""


def fit_of(
    history: Sequence[ProgressSample], node_size: int, *, now: float | None = None
) -> FitResult | None:
    """The fit of a key's history, or ``None`` when it is empty or cannot be fitted.

    Its ``model`` is the prior (:func:`prior_of`); its ``measured`` is what that prior was
    fitted on, size by size, which a new run of the key counts as measured (``known``). Only
    evidence counts: contended windows are left out, and windows older than
    :data:`qosflow.core.windows.STALE_S` before ``now`` give way to newer ones
    (:func:`qosflow.core.windows.usable`). A size measured for only a few windows still counts,
    but cannot put the knee below itself (``qosflow.core.predict``).
    """
    from qosflow.core.fit import fit
    from qosflow.core.windows import stale_before

    if not history:
        return None
    result = fit(history, node_size=node_size, stale_before=stale_before(now))
    return result if result.success else None


def prior_of(
    history: Sequence[ProgressSample], node_size: int, *, now: float | None = None
) -> SpeedModel | None:
    """The prior a key's history gives (``HistoryStore.prior`` on already-read samples)."""
    result = fit_of(history, node_size, now=now)
    return result.model if result is not None else None


def stated_prior(
    node_size: int, *, step_time: float, units: int
) -> tuple[SpeedModel, tuple[Measured, ...]]:
    """The prior a user's estimate gives a key without history, and what it counts as measured.

    The prior is the core's pessimistic shape through the estimate (``tau(units) ==
    step_time``). Above one node the estimate also counts as one measured window at ``units``:
    a plan counts only on measured scaling there (:func:`qosflow.core.predict.belief_from_fit`),
    and a user who timed the job at that size has measured it, once. One window is thin, so
    the conservative bound there is wide, and the knee does not fall below it on the first
    windows of a run. Within a node the estimate only anchors the shape, whose sizes the probe
    rule already allows.

    Returns:
        The prior, and the measurements it stands for (to pass as ``known``; empty within a
        node).
    """
    from qosflow.core.fit import Measured
    from qosflow.core.speed import pessimistic_prior

    prior = pessimistic_prior(node_size, step_time=step_time, units=units)
    return prior, ((Measured(units, step_time, 1),) if units > node_size else ())


def timed(timings: Sequence[Measured], *measured: Sequence[Measured]) -> tuple[Measured, ...]:
    """The users' timings of a key that count: one per size, where no run of the key measured.

    A user who timed a job at a size (its spec's ``step_seconds_estimate_at`` above one node)
    measured the key there once, for every later job of the key too: its model and batch size
    are the same. Where a run measured a size, its windows rule and the timing drops out.

    Args:
        timings: The key's timings, newest first (the first one per size counts).
        *measured: What runs measured (the key's history, this run), size by size.

    Returns:
        The timings that count, by size.
    """
    seen = {m.units for ms in measured for m in ms}
    out: dict[int, Measured] = {}
    for m in timings:
        if m.units not in seen:
            out.setdefault(m.units, m)
    return tuple(out[k] for k in sorted(out))


RUN_GAP_S = 60.0
"""Seconds between two runs laid end to end (more than any sampling interval)."""


def end_to_end(samples: Sequence[ProgressSample]) -> list[ProgressSample]:
    """Samples in recording order with overlapping runs shifted after one another.

    A new run starts where, in recording order, time goes back or the step counter drops.
    """
    from qosflow.core.speed import ProgressSample

    out: list[ProgressSample] = []
    shift, end = 0.0, -math.inf
    for i, s in enumerate(samples):
        prev = samples[i - 1] if i else None
        if prev is None or s.time < prev.time or s.steps_done < prev.steps_done:  # a new run
            shift = max(end + RUN_GAP_S - s.time, 0.0)
        t = s.time + shift
        out.append(ProgressSample(t, s.steps_done, s.units, s.share, s.pods))
        end = max(end, t)
    return out
