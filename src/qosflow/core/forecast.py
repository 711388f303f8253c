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
:func:`remember` keeps (a :class:`Memory`), so the simulator and the watch run the same
rule.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from qosflow.core.errors import SpecError
from qosflow.core.timeline import Candidate, trusted

SUFFIX = " (forecast)"
"""Appended to an arrival's name in admission's test (a verdict's reason may name it)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """A deadline job as its first ask saw it.

    Attributes:
        submitted_at: When it was submitted (epoch seconds).
        candidate: Admission's view of it at its first ask: all its work, not running.
        window: Its deadline minus its submission: how far back an ask must look to read it
            (derived: :func:`remember` prunes by the longest).
        rival: The candidate as a forecast rival, at its own deadline (derived: :func:`rivals`
            moves it later).
    """

    submitted_at: float
    candidate: Candidate
    window: float = field(init=False, repr=False, compare=False)
    rival: Candidate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.candidate
        object.__setattr__(self, "window", c.deadline - self.submitted_at)
        rival = replace(c, name=c.name + SUFFIX, guaranteed=True, running_units=0)
        object.__setattr__(self, "rival", rival)


def _later(c: Candidate, w: float) -> Candidate:
    """``c`` due ``w`` later, built without checking again what ``c`` passed.

    Admission's test reads a million of these on cluster04, and :class:`Candidate`'s own
    checks would be half their cost (the tests compare this with ``dataclasses.replace``).
    """
    return trusted(
        c.name,
        c.deadline + w,
        c.remaining_steps,
        c.margin,
        c.levels,
        c.step_time,
        c.guaranteed,
        c.running_units,
    )


_SUBMITTED = operator.attrgetter("submitted_at")
_ORDER = operator.attrgetter("submitted_at", "candidate.name")


def rivals(arrivals: Sequence[Arrival], *, deadline: float, now: float) -> list[Candidate]:
    """The forecast's guaranteed rivals of a job due at ``deadline``, asked at ``now``.

    Every arrival submitted in the last ``w = deadline - now`` seconds whose own deadline has
    passed, again ``w`` later (so its repeat is due no later than ``deadline``).

    Args:
        arrivals: The arrivals kept so far, by submission time (:attr:`Memory.arrivals`).
        deadline: The asking job's deadline.
        now: The time of the ask.
    """
    w = deadline - now
    if w <= 0 or not arrivals:
        return []
    start = bisect.bisect_left(arrivals, now - w, key=_SUBMITTED)
    return [_later(a.rival, w) for a in arrivals[start:] if a.rival.deadline <= now]


@dataclass(frozen=True, slots=True)
class Memory:
    """The arrivals a later forecast may still read (:func:`remember` keeps it).

    Attributes:
        arrivals: By submission time, then name: what :attr:`qosflow.core.allocator.
            ClusterInput.arrivals` carries.
        outlasting: The arrivals whose window is longer than that of every one submitted after
            them, in submission order (the first has the longest window of all): pruning reads
            these few instead of every window.
    """

    arrivals: tuple[Arrival, ...] = ()
    outlasting: tuple[Arrival, ...] = ()

    @classmethod
    def of(cls, arrivals: Iterable[Arrival]) -> Memory:
        """The memory of ``arrivals`` in any order (as a shell stored them), unpruned."""
        ordered = tuple(sorted(arrivals, key=_ORDER))
        return cls(ordered, tuple(_outlasting([], ordered)))


def _outlasting(chain: list[Arrival], later: Iterable[Arrival]) -> list[Arrival]:
    """``chain`` (a :attr:`Memory.outlasting`) extended by ``later`` ones, in submission order."""
    for a in later:
        while chain and chain[-1].window <= a.window:
            chain.pop()
        chain.append(a)
    return chain


def remember(memory: Memory, arrived: Iterable[Arrival], now: float) -> Memory:
    """What a later forecast may still read: the memory, plus the new arrivals, pruned.

    A job already kept (the same name, submitted at the same time) is not kept twice: a shell
    may report a job again that it forgot and saw come back. An ask looks back at most its own
    window, and no job asks past its deadline: so an arrival older than the longest window
    among them can no longer be read by any of them, and goes. (A later job with a longer window
    than any kept looks back only as far as what is kept.) Only a new arrival prunes: with none,
    the memory comes back as it was, so a shell that calls at every decision (the job board)
    and one that calls when a job arrived keep the same. The cost is the new arrivals', not the
    memory's.

    Args:
        memory: What an earlier call returned (:meth:`Memory.of` of stored arrivals).
        arrived: The deadline jobs first asked since (:attr:`~qosflow.core.allocator.
            Allocation.arrived`), in any order.
        now: The time of the decision that reported them.
    """
    kept = memory.arrivals
    new: list[Arrival] = []
    for a in sorted(arrived, key=_ORDER):
        key = _ORDER(a)
        i = bisect.bisect_left(kept, key, key=_ORDER)
        known = i < len(kept) and _ORDER(kept[i]) == key
        if not known and not (new and _ORDER(new[-1]) == key):
            new.append(a)
    if not new:  # pruning waits for an arrival: a shell may call at every decision or not
        return memory
    if not kept or _ORDER(kept[-1]) <= _ORDER(new[0]):
        ordered = kept + tuple(new)
        chain = _outlasting(list(memory.outlasting), new)
    else:  # a new one submitted before one kept: merge (both runs are in order)
        ordered = tuple(sorted([*kept, *new], key=_ORDER))
        chain = _outlasting([], ordered)
    cut = now - chain[0].window
    start = bisect.bisect_left(ordered, cut, key=_SUBMITTED)
    first = bisect.bisect_left(chain, cut, key=_SUBMITTED)
    return Memory(ordered[start:], tuple(chain[first:]))


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
