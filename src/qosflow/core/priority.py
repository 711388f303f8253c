"""The priority ladder: normalised laxity -> a Kubernetes PriorityClass and an Argo EDF rank.

Normalised laxity is the share of a job's whole window (submission to deadline) that is still
slack once the conservative finish is taken into account::

    laxity = (deadline - conservative_finish) / (deadline - submitted_at)

Guaranteed jobs are bucketed by laxity (``< 0.10`` urgent, ``< 0.25`` high, ``< 0.50`` normal,
else low); jobs without a guarantee run as ``besteffort``; hopeless jobs (even the fastest size
they may plan cannot make it) drop to ``late``. Only ``qosflow-urgent`` may preempt.

Pod priority is immutable, and a re-bucket of a running job costs a checkpoint-restart, so a job
stays in its previous bucket until its laxity leaves that bucket by more than ``hysteresis``.

Argo's ``spec.priority`` (int32; higher runs first) orders waiting workflows: the class rank picks a
band and, inside it, an earlier deadline gives a higher value. The rank depends on the deadline
alone, so ranks computed at different instants compare correctly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qosflow.core.errors import SpecError

__all__ = [
    "BAND",
    "LADDER",
    "PriorityClassDef",
    "argo_priority",
    "by_name",
    "classify",
    "laxity",
]


@dataclass(frozen=True, slots=True)
class PriorityClassDef:
    """One rung of the ladder, as created once at install time (values are immutable).

    Attributes:
        name: Kubernetes PriorityClass name.
        value: Pod priority value.
        preempts: Whether pods of this class may preempt lower ones (``PreemptLowerPriority``).
        description: What the class means, for ``kubectl describe``.
    """

    name: str
    value: int
    preempts: bool
    description: str


URGENT = PriorityClassDef(
    "qosflow-urgent", 100_000, True, "qosflow: guaranteed deadline job with laxity < 0.10"
)
HIGH = PriorityClassDef(
    "qosflow-high", 50_000, False, "qosflow: guaranteed deadline job with laxity in [0.10, 0.25)"
)
NORMAL = PriorityClassDef(
    "qosflow-normal", 20_000, False, "qosflow: guaranteed deadline job with laxity in [0.25, 0.50)"
)
LOW = PriorityClassDef(
    "qosflow-low", 10_000, False, "qosflow: guaranteed deadline job with laxity >= 0.50"
)
BESTEFFORT = PriorityClassDef(
    "qosflow-besteffort", 0, False, "qosflow: best-effort or at-risk job on leftover capacity"
)
LATE = PriorityClassDef(
    "qosflow-late", -1_000, False, "qosflow: hopeless job that cannot make its deadline any more"
)

LADDER: tuple[PriorityClassDef, ...] = (URGENT, HIGH, NORMAL, LOW, BESTEFFORT, LATE)
"""The whole ladder, highest first."""

# Lower laxity edge of each guaranteed bucket (URGENT has none: everything below 0.10).
_GUARANTEED: tuple[tuple[PriorityClassDef, float, float], ...] = (
    (URGENT, -math.inf, 0.10),
    (HIGH, 0.10, 0.25),
    (NORMAL, 0.25, 0.50),
    (LOW, 0.50, math.inf),
)

BAND = 100_000_000
"""Width of one class band of the Argo rank (10-second resolution covers ~31 years)."""
_RANK_EPOCH = 1_704_067_200.0  # 2024-01-01T00:00:00Z
_RANK_RESOLUTION_S = 10.0
_INT32_MAX = 2**31 - 1


def by_name(name: str) -> PriorityClassDef | None:
    """The ladder rung called ``name``, or ``None`` when it is not a qosflow class."""
    for klass in LADDER:
        if klass.name == name:
            return klass
    return None


def laxity(
    *, now: float, deadline: float, submitted_at: float, conservative_finish: float
) -> float:
    """Normalised laxity: the share of the job's window still slack at the conservative finish.

    Args:
        now: Current time; a finish in the past is taken as ``now``.
        deadline: Deadline (``inf`` for a best-effort job, whose laxity is ``inf``).
        submitted_at: Submission time (start of the window).
        conservative_finish: Conservative predicted finish (``inf`` when unknown).

    Returns:
        ``(deadline - finish) / (deadline - submitted_at)``; ``1`` means all slack, ``0`` just in
        time, negative a predicted miss. A window of zero length gives ``0`` or ``-inf``.

    Raises:
        SpecError: When an input is NaN.
    """
    if math.isnan(now + deadline + submitted_at + conservative_finish):  # the planners ask often
        for field, value in (
            ("now", now),
            ("deadline", deadline),
            ("submitted_at", submitted_at),
            ("conservative_finish", conservative_finish),
        ):
            if math.isnan(value):
                raise SpecError(field, "must be a number (got nan)")
    if math.isinf(deadline):
        return math.inf
    finish = max(conservative_finish, now)
    if math.isinf(finish):
        return -math.inf
    window = deadline - submitted_at
    if window <= 0.0:
        return 0.0 if finish <= deadline else -math.inf
    return (deadline - finish) / window


def _bucket(lax: float) -> PriorityClassDef:
    for klass, low, high in _GUARANTEED:
        if low <= lax < high:
            return klass
    return LOW  # lax == inf


def classify(
    lax: float,
    *,
    guaranteed: bool,
    hopeless: bool,
    previous: str | None = None,
    hysteresis: float = 0.02,
) -> PriorityClassDef:
    """Map a job's laxity and status to its rung of the ladder.

    Args:
        lax: Normalised laxity (:func:`laxity`).
        guaranteed: Whether admission guaranteed the job's deadline.
        hopeless: Whether even the fastest size the job may plan cannot make the deadline.
        previous: The class name the job has now; a guaranteed job keeps it while its laxity is
            within ``hysteresis`` of that bucket's edges. Names outside the ladder are ignored.
        hysteresis: Width of the dead band at each bucket edge, in laxity units.

    Returns:
        ``late`` when hopeless, ``besteffort`` without a guarantee, else the laxity bucket.

    Raises:
        SpecError: When ``lax`` is NaN or ``hysteresis`` is negative.
    """
    if math.isnan(lax):
        raise SpecError("laxity", "must be a number (got nan)")
    if not hysteresis >= 0.0:
        raise SpecError("hysteresis", f"must be >= 0 (got {hysteresis})")
    if hopeless:
        return LATE
    if not guaranteed:
        return BESTEFFORT
    raw = _bucket(lax)
    if previous is None or previous == raw.name:
        return raw
    for klass, low, high in _GUARANTEED:
        if klass.name == previous and low - hysteresis <= lax < high + hysteresis:
            return klass
    return raw


def argo_priority(*, deadline: float, now: float, klass: PriorityClassDef) -> int:
    """Argo ``spec.priority`` for a workflow: class band, then earliest deadline first.

    The value is ``band(klass) * BAND + (BAND - 1 - deadline_rank)`` where ``deadline_rank``
    counts 10-second steps since 2024-01-01 (clamped to the band), so every value fits in an
    int32 and a higher class always outranks a lower one.

    Args:
        deadline: Deadline in epoch seconds; ``inf`` (best effort) sorts last in its band.
        now: Current time. Only checked for sanity: the rank depends on the deadline alone, so
            ranks computed at different instants stay comparable.
        klass: The job's rung of the ladder.

    Returns:
        A non-negative int32.

    Raises:
        SpecError: When ``deadline`` or ``now`` is NaN, or ``klass`` is not on the ladder.
    """
    if math.isnan(deadline) or math.isnan(now):
        raise SpecError("deadline", "must be a number (got nan)")
    if klass not in LADDER:
        raise SpecError("klass", f"must be a rung of the ladder (got {klass.name!r})")
    band = len(LADDER) - 1 - LADDER.index(klass)
    if math.isinf(deadline):
        rank = BAND - 1 if deadline > 0 else 0
    else:
        steps = math.floor((deadline - _RANK_EPOCH) / _RANK_RESOLUTION_S)
        rank = min(max(steps, 0), BAND - 1)
    value = band * BAND + (BAND - 1 - rank)
    return min(value, _INT32_MAX)
