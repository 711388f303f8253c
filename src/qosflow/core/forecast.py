"""The forecast: deadline jobs like the ones that came lately will come again.

Admission (:func:`qosflow.core.admission.admit`) proves a new promise against the promises
already made and the deadline jobs due before it. It does not see the jobs that have not come
yet. A long promise made at the start of a burst of short jobs can hold the units the burst
needs, and nothing in the test says so: the seed paper's insufficient regimes and
elasticVpollux_e lost their late bursts that way (docs/experiments.md, 2026-12-07 (fifth)).

The forecast adds what the recent past says is coming. A job asked at ``now`` with ``w`` seconds
left before its deadline (``w = deadline - now``) looks back over the last ``w`` seconds: every
deadline job that arrived then is taken to arrive again ``w`` later, with the work and the
deadline window its own first ask saw (:class:`Arrival`), and joins the test as a guaranteed
rival if that repeat is due no later than the asking job. The same window forward and back, so
there is no knob: a short job looks back a little, a long one far. Only arrivals whose deadline
has passed can repeat in time (their repeat is due at ``deadline + w``, and ``deadline + w``
is no later than the asking job's ``now + w`` only when ``deadline <= now``).

A forecast rival reserves units only in admission's test of a new promise. It is not a job: no
rule gives it units, and an ask it would make fail is refused as if a real rival were there.
The shells (the simulator's ``qosflow`` policy, the Airflow job board) keep the arrivals the
allocator reports (:attr:`qosflow.core.allocator.Allocation.arrived`) and hand back what
:func:`kept` keeps, so the simulator and the watch run the same rule.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qosflow.core.errors import SpecError
from qosflow.core.timeline import Candidate

SUFFIX = " (forecast)"
"""Appended to an arrival's name in admission's test (a verdict's reason may name it)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """A deadline job as its first ask saw it.

    Attributes:
        submitted_at: When it was submitted (epoch seconds).
        candidate: Admission's view of it at its first ask: all its work, not running.
    """

    submitted_at: float
    candidate: Candidate


def rivals(arrivals: Sequence[Arrival], *, deadline: float, now: float) -> list[Candidate]:
    """The forecast's guaranteed rivals of a job due at ``deadline``, asked at ``now``.

    Args:
        arrivals: The arrivals kept so far, by submission time (:func:`kept`).
        deadline: The asking job's deadline.
        now: The time of the ask.
    """
    w = deadline - now
    if w <= 0 or not arrivals:
        return []
    start = bisect.bisect_left(arrivals, now - w, key=_submitted)
    out = []
    for a in arrivals[start:]:
        c = a.candidate
        if a.submitted_at <= now and c.deadline + w <= deadline:
            out.append(
                Candidate(
                    c.name + SUFFIX,
                    c.deadline + w,
                    c.remaining_steps,
                    c.margin,
                    c.levels,
                    c.step_time,
                    guaranteed=True,
                )
            )
    return out


def _submitted(a: Arrival) -> float:
    return a.submitted_at


def _order(a: Arrival) -> tuple[float, str]:
    return a.submitted_at, a.candidate.name


def _in_order(arrivals: Sequence[Arrival]) -> bool:
    """Whether ``arrivals`` are by submission time, then name (:func:`kept`'s order)."""
    return all(
        a.submitted_at < b.submitted_at
        or (a.submitted_at == b.submitted_at and a.candidate.name <= b.candidate.name)
        for a, b in itertools.pairwise(arrivals)
    )


def kept(arrivals: Iterable[Arrival], now: float) -> tuple[Arrival, ...]:
    """The arrivals a later forecast may still read, by submission time.

    An ask looks back at most its own window, and no job asks past its deadline: so an arrival
    older than the longest window among those kept can no longer be read by any of them, and
    goes. (A later job with a longer window than any kept looks back only as far as what is
    kept.)
    """
    ordered = list(arrivals)
    if not ordered:
        return ()
    if not _in_order(ordered):  # the shells pass them in order, plus the new ones
        ordered.sort(key=_order)
    longest = max(a.candidate.deadline - a.submitted_at for a in ordered)
    start = bisect.bisect_left(ordered, now - longest, key=_submitted)
    return tuple(ordered[start:])


def arrival_to_dict(arrival: Arrival) -> dict[str, Any]:
    """An arrival as JSON (an unplannable level's step time as ``null``)."""
    c = arrival.candidate
    return {
        "submitted_at": arrival.submitted_at,
        "name": c.name,
        "deadline": c.deadline,
        "remaining_steps": c.remaining_steps,
        "margin": c.margin,
        "levels": list(c.levels),
        "step_time": [t if t != float("inf") else None for t in c.step_time],
    }


def arrival_from_dict(data: Mapping[str, Any]) -> Arrival:
    """The inverse of :func:`arrival_to_dict`.

    Raises:
        SpecError: Naming the field, when one is missing or malformed.
    """
    try:
        candidate = Candidate(
            name=str(data["name"]),
            deadline=float(data["deadline"]),
            remaining_steps=int(data["remaining_steps"]),
            margin=float(data["margin"]),
            levels=tuple(int(n) for n in data["levels"]),
            step_time=tuple(float("inf") if t is None else float(t) for t in data["step_time"]),
        )
        return Arrival(float(data["submitted_at"]), candidate)
    except KeyError as exc:
        raise SpecError(f"arrival.{exc.args[0]}", "is required") from None
    except (TypeError, ValueError) as exc:
        raise SpecError("arrival", f"malformed: {exc}") from None
