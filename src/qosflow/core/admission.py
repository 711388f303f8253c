"""Admission control: can a new job be guaranteed without breaking the jobs already guaranteed?

1. **Energy test** (necessary, fast; :mod:`qosflow.core.energy`): for every deadline ``d``, the
   least unit-seconds the jobs due by ``d`` need (levels mixed over time, conservative speeds)
   must fit in ``capacity * (d - now)``.
2. **Backward fill** (constructive, ElasticFlow's minimum satisfactory share): in order of
   effective deadline (deadline minus margin) each job gets the smallest unit cap at which its
   remaining steps, filled backwards from its effective deadline into the free capacity (per slot
   the fastest level within the cap and the free units), are done in time.

Running guaranteed jobs keep their units for the first slot. Guaranteed jobs that cannot make their
deadline even alone are left out and reported at risk; one that can only by spending its margin is
tested against its deadline; any other that no longer fits blocks new guarantees.
``rejected`` only when its policy is ``reject`` (or no size of it fits the cluster at all);
otherwise ``best_effort``, even when the belief says it cannot make its deadline alone on the
whole cluster: a belief never turns ``run_best_effort`` into "nothing ran". Both carry a counter-offer: the
earliest slot edge (plus margin) that passes the same tests, by binary search. Slots are ``slot_s``
for the first 240, then double every 120; every effective deadline is a slot edge.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from qosflow.core.decide import margin_for
from qosflow.core.energy import Energy
from qosflow.core.errors import SpecError
from qosflow.core.plan import IntArray
from qosflow.core.timeline import (
    COARSE_BLOCK,
    FINE_SLOTS,
    SNAPSHOT_EVERY,
    Candidate,
    FillJob,
    FillPlan,
    Placement,
    Timeline,
    backward_fill,
    check_inputs,
    edf,
    fill_job,
    least_energy,
    place_in_order,
    timeline,
    trusted,
)
from qosflow.core.words import duration, iso_moment

if TYPE_CHECKING:
    from qosflow.core.predict import Belief
    from qosflow.core.spec import IfNotGuaranteed, JobSpec

__all__ = [
    "COARSE_BLOCK",
    "FINE_SLOTS",
    "Candidate",
    "FillPlan",
    "Verdict",
    "admit",
    "backward_fill",
    "candidate",
    "least_energy",
    "misses_alone",
    "timeline",
    "too_slow",
]

Kind = Literal["guaranteed", "best_effort", "rejected"]


def candidate(
    spec: JobSpec,
    belief: Belief,
    *,
    steps_done: int,
    now: float,
    guaranteed: bool = False,
    running_units: int = 0,
) -> Candidate:
    """Build the admission view of a job from its spec and the current belief about its speed.

    Levels are the job's allowed levels the belief lets us plan (at most the knee and the probe
    limit); step times are the belief's conservative ones; the margin is
    :func:`qosflow.core.decide.margin_for`.

    The levels and step times are remembered per belief object once a candidate built on them
    passed :class:`Candidate`'s checks (the allocator asks for every guarantee at every
    decision, on beliefs its callers build once); later candidates of that belief are built
    with :func:`~qosflow.core.timeline.trusted` when what changes per call passes too. An entry
    holds its belief, so its id cannot be reused while remembered, and the memo is emptied when
    it grows past ``_PLANNABLE_MAX`` entries.
    """
    allowed = spec.resources.levels
    remaining, margin = max(spec.total_steps - steps_done, 0), margin_for(spec, now)
    hit = _PLANNABLE.get(id(belief))
    if (
        hit is not None
        and hit[0] is belief
        and hit[1] == allowed
        and 0.0 <= margin < math.inf
        and running_units >= 0
        and not math.isnan(spec.deadline)
    ):
        levels, steps = hit[2], hit[3]
        return trusted(
            spec.name, spec.deadline, remaining, margin, levels, steps, guaranteed, running_units
        )
    levels, steps = _plannable(belief, allowed, spec.resources.min)
    checked = Candidate(
        spec.name, spec.deadline, remaining, margin, levels, steps, guaranteed, running_units
    )
    if len(_PLANNABLE) >= _PLANNABLE_MAX:
        _PLANNABLE.clear()
    _PLANNABLE[id(belief)] = (belief, allowed, levels, steps)
    return checked


_PLANNABLE: dict[int, tuple[Belief, tuple[int, ...], tuple[int, ...], tuple[float, ...]]] = {}
"""``id(belief)`` → (belief, allowed levels, levels, step times): :func:`candidate`'s memo."""
_PLANNABLE_MAX = 4096


def _plannable(
    belief: Belief, allowed: tuple[int, ...], smallest: int
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The levels a belief lets a guarantee plan and their conservative step times."""
    limit = min(belief.knee, belief.probe_limit)
    levels = tuple(n for n in belief.levels if n <= limit and n in allowed) or (smallest,)
    step_time = belief.conservative.step_time
    steps = [float(step_time(n)) for n in levels]
    return levels, tuple(t if t > 0.0 and not math.isnan(t) else math.inf for t in steps)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of admission.

    Attributes:
        kind: ``guaranteed``, ``best_effort`` or ``rejected``.
        units: Initial size of the new job: its minimal satisfactory share when guaranteed, the
            smallest size meeting the deadline alone when best effort, 0 when rejected.
        reason: One sentence with the numbers.
        counter_offer: Earliest deadline (epoch seconds) that would be guaranteed, or ``None``.
        reservations: Units the plan gives each guaranteed job in the first slot (now); empty
            when the verdict needed no plan (no deadline, nothing left, no size fits).
        shares: Minimal satisfactory share (unit cap) of each guaranteed job in the plan.
        at_risk: Guaranteed jobs the plan cannot fit any more.
    """

    kind: Kind
    units: int
    reason: str
    counter_offer: float | None
    reservations: Mapping[str, int] = field(default_factory=dict)
    shares: Mapping[str, int] = field(default_factory=dict)
    at_risk: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (XCom, annotations)."""
        plain = {k: getattr(self, k) for k in ("kind", "units", "reason", "counter_offer")}
        maps = {"reservations": dict(self.reservations), "shares": dict(self.shares)}
        return plain | maps | {"at_risk": list(self.at_risk)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        offer = d.get("counter_offer")
        return cls(
            kind=d["kind"],
            units=int(d["units"]),
            reason=str(d["reason"]),
            counter_offer=None if offer is None else float(offer),
            reservations={str(k): int(v) for k, v in dict(d.get("reservations", {})).items()},
            shares={str(k): int(v) for k, v in dict(d.get("shares", {})).items()},
            at_risk=tuple(str(x) for x in d.get("at_risk", ())),
        )


# --------------------------------------------------------------------------- admission


def _slot0(jobs: Sequence[FillJob], placed: Mapping[str, Placement]) -> dict[str, int]:
    """Units each job holds in the first slot: running units, else its plan's first slot."""
    out = {j.name: j.pin_units for j in jobs}
    for name, p in placed.items():
        if p.start == 0 < p.end and not out[name]:
            out[name] = p.alloc if isinstance(p.alloc, int) else int(p.alloc[0])
    return out


@dataclass(slots=True)
class _Setup:
    """One newcomer against the guarantees; the slotted timeline is built on first use.

    Most asks that get this far end at the energy test, which needs no timeline.
    """

    healthy: Sequence[FillJob]  # in deadline order
    fresh: FillJob
    energy: Energy
    at_risk: tuple[str, ...]
    now: float
    capacity: int
    slot_s: float
    pinned: int
    _tl: Timeline | None = None

    @property
    def tl(self) -> Timeline:
        """Free units per slot from now past every due date and the newcomer's run alone."""
        if self._tl is None:
            fresh, dues, now = self.fresh, self.energy.dues, self.now
            horizon = max([*dues[-1:], fresh.due, now]) + 1.01 * min(fresh.alone_s, 1e9)
            edges = timeline(now, horizon + self.slot_s, self.slot_s, [*dues, fresh.due])
            self._tl = Timeline(edges, self.capacity, self.slot_s, self.pinned)
        return self._tl


@dataclass(frozen=True, slots=True)
class _Base:
    """The guaranteed jobs readied for admission: what every newcomer is tested against."""

    count: int
    healthy: tuple[FillJob, ...]  # in deadline order
    at_risk: tuple[str, ...]
    energy: Energy
    pinned: int


@functools.lru_cache(maxsize=4)
def _base(others: tuple[Candidate, ...], capacity: int, now: float, util: float) -> _Base:
    """The guaranteed jobs' fill view and energy test (cached: one decision asks many times).

    A guarantee whose margin is spent (alone at its fastest it ends after its deadline minus
    margin, but by its deadline) is tested against its deadline: a newcomer must leave it the
    units it still needs, as the guarantees' plan repairs it (``allocation.repair``). Left out of
    the test, its units went to newcomers and the promise broke (docs/experiments.md,
    2026-12-08). Only one that misses its deadline even alone is left out, at risk.
    """
    if len({c.name for c in others}) < len(others):
        raise SpecError("admitted", "guaranteed jobs must have unique names")
    jobs, at_risk = [], []
    for i, c in enumerate(others):
        j = fill_job(c, capacity, i)
        if j.alone_s > j.due - now:  # margin spent
            if j.alone_s > c.deadline - now:
                at_risk.append(j.name)
                continue
            j = fill_job(replace(c, margin=0.0), capacity, i)
        jobs.append(j)
    healthy = tuple(edf(jobs))
    energy = Energy(healthy, now, util * capacity)
    return _Base(len(others), healthy, tuple(at_risk), energy, sum(j.pin_units for j in healthy))


def _setup(
    new: Candidate,
    admitted: Sequence[Candidate],
    capacity: int,
    now: float,
    slot_s: float,
    util: float,
) -> _Setup:
    others = (c for c in admitted if c.guaranteed and c.name != new.name and c.remaining_steps > 0)
    base = _base(tuple(others), capacity, now, util)
    fresh = fill_job(new, capacity, base.count)
    pinned = base.pinned + fresh.pin_units
    return _Setup(base.healthy, fresh, base.energy, base.at_risk, now, capacity, slot_s, pinned)


def _offer(
    s: _Setup,
    base: Mapping[str, Placement],
    base_failed: Sequence[str],
    snapshots: Sequence[IntArray],
    margin: float,
) -> float | None:
    """Earliest slot edge at which the newcomer passes both tests, by binary search."""
    if base_failed or not s.fresh.top:
        return None
    order, dues, tl = s.healthy, s.energy.dues, s.tl

    def passes(k: int) -> bool:
        due = tl.edge_list[k]
        if s.energy.check(s.fresh, due) is not None:
            return False
        p = bisect.bisect_right(dues, due)
        tl.free = snapshots[p // SNAPSHOT_EVERY].copy()
        for j in order[p - p % SNAPSHOT_EVERY : p]:
            tl.apply(base[j.name])
        return not place_in_order(tl, [replace(s.fresh, due=due), *order[p:]], stop=True)[1]

    lo, hi = max(tl.index(s.fresh.due), 0), len(tl.edge_list) - 1
    if not passes(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    offer = tl.edge_list[hi] + margin
    while offer - margin < tl.edge_list[hi]:  # the offer's due must not round below the edge
        offer = math.nextafter(offer, math.inf)
    return offer


def admit(
    new: Candidate,
    admitted: Sequence[Candidate],
    *,
    capacity: int,
    now: float,
    if_not_guaranteed: IfNotGuaranteed = "run_best_effort",
    slot_s: float = 60.0,
    max_utilisation: float = 1.0,
    counter_offer: bool = True,
    explain: bool = True,
) -> Verdict:
    """Decide whether ``new`` can be guaranteed next to the guaranteed jobs in ``admitted``.

    Args:
        new: The job asking for a guarantee.
        admitted: Jobs admitted before; only ``guaranteed`` ones reserve capacity (one named like
            ``new`` is ``new`` itself and ignored).
        capacity: Units of the cluster.
        now: Current time, epoch seconds.
        if_not_guaranteed: ``run_best_effort`` or ``reject``.
        slot_s: Length of the fine slots of the timeline.
        max_utilisation: Share of the capacity the energy test counts on (packing slack).
        counter_offer: Search the earliest deadline that would pass when ``new`` does not (a
            binary search over the timeline; skip it when nobody will read the offer).
        explain: When ``new`` is not guaranteed, also plan the guaranteed jobs for the verdict's
            ``reservations``, ``shares`` and ``at_risk``. A caller that reads only the kind (the
            cluster allocator asking a waiting job again) passes ``False`` and gets them empty;
            a job too slow even alone is then told so without ``admitted`` being read.

    Raises:
        SpecError: On a bad capacity, time, slot length or policy.
    """
    check_inputs(capacity, now, slot_s)
    if if_not_guaranteed not in ("run_best_effort", "reject"):
        raise SpecError(
            "if_not_guaranteed", f"must be run_best_effort or reject (got {if_not_guaranteed!r})"
        )
    if not 0.0 < max_utilisation <= 1.0:
        raise SpecError("max_utilisation", f"must be in (0, 1] (got {max_utilisation})")
    fresh = fill_job(new, capacity, 0)
    sp = fresh.sp
    if new.remaining_steps == 0:
        return Verdict("guaranteed", 0, f"{new.name} has no steps left to run", None)
    if sp.units.size < 2:
        return Verdict(
            "rejected", 0, f"no size of {new.name} fits {capacity} units with a known speed", None
        )
    if not math.isfinite(new.deadline):
        return Verdict(
            "best_effort", int(sp.units[1]), f"{new.name} has no deadline to guarantee", None
        )
    reject = if_not_guaranteed == "reject"
    why = _too_slow(fresh, new, now)
    if why is not None and not explain:  # no need to look at the guarantees to say no
        return _refusal(fresh, why, now=now, reject=reject)
    s = _setup(new, admitted, capacity, now, slot_s, max_utilisation)
    if why is None:
        why = s.energy.check(s.fresh, s.fresh.due)
    if why is None:
        verdict = _guarantee(s, new)
        if isinstance(verdict, Verdict):
            return verdict
        why = verdict
    return _not_guaranteed(
        s, new, why, now=now, reject=reject, counter_offer=counter_offer, explain=explain
    )


def too_slow(new: Candidate, *, capacity: int, now: float) -> str | None:
    """Why ``new`` cannot make its deadline (minus margin) even alone at its fastest, or None.

    ``None`` also where :func:`admit` answers first (nothing left, no deadline, no size fits).
    It reads neither the guarantees nor the timeline: most of the allocator's asks end here.
    """
    fresh = _alone(new, capacity)
    return None if fresh is None else _too_slow(fresh, new, now)


def misses_alone(new: Candidate, *, capacity: int, now: float) -> bool:
    """Whether :func:`too_slow` has a reason for ``new``, without putting it into words.

    The allocator asks this of every waiting job asked again (most of them, at every decision
    after a job ends); the words would cost more than the test.
    """
    fresh = _alone(new, capacity)
    return fresh is not None and _misses(fresh, now)


def _alone(new: Candidate, capacity: int) -> FillJob | None:
    """``new``'s fill view, or ``None`` where :func:`admit` answers before the test alone."""
    fresh = fill_job(new, capacity, 0)
    if new.remaining_steps == 0 or not math.isfinite(new.deadline) or fresh.sp.units.size < 2:
        return None
    return fresh


def _misses(fresh: FillJob, now: float) -> bool:
    """Even alone at its fastest the job ends after its deadline minus margin."""
    return now + fresh.alone_s > fresh.due


def _too_slow(fresh: FillJob, new: Candidate, now: float) -> str | None:
    """:func:`too_slow` on the job's fill view, past its guards (``admit`` has passed them)."""
    if not _misses(fresh, now):
        return None
    need = fresh.alone_s
    if now + need > new.deadline:
        left = new.deadline - now
        return (
            f"{new.name} needs {duration(need, against=left)} even alone at {fresh.top} units "
            f"but only {duration(left, against=need)} are left"
        )
    left = fresh.due - now  # in time for the deadline, not for its margin
    return (
        f"{new.name} needs {duration(need, against=left)} even alone at {fresh.top} units "
        f"but only {duration(left, against=need)} are left before its deadline minus a "
        f"{duration(new.margin)} margin"
    )


def _guarantee(s: _Setup, new: Candidate) -> Verdict | str:
    """The guarantee the backward fill finds room for, or why it finds none."""
    fresh = s.fresh
    k = bisect.bisect_right(s.energy.dues, fresh.due)
    placed, failed = place_in_order(s.tl, [*s.healthy[:k], fresh, *s.healthy[k:]], stop=True)
    if failed:
        return (
            f"no share of {new.name} up to {fresh.top} units fits before {iso_moment(fresh.due)}"
            if failed[0] == new.name
            else f"guaranteeing {new.name} would make {failed[0]} miss its deadline"
        )
    share = placed[new.name].share
    return Verdict(
        "guaranteed",
        share,
        f"{new.name} fits at {share} units next to {len(s.healthy)} guaranteed job(s), "
        f"done by {iso_moment(fresh.due)} (deadline minus a {duration(new.margin)} margin)",
        None,
        _slot0([*s.healthy, fresh], placed),
        {k: p.share for k, p in placed.items()},
        s.at_risk,
    )


def _not_guaranteed(
    s: _Setup,
    new: Candidate,
    why: str,
    *,
    now: float,
    reject: bool,
    counter_offer: bool,
    explain: bool,
) -> Verdict:
    """Best effort (or rejected, on request) with the guaranteed jobs' plan and a counter-offer.

    A belief never turns run_best_effort into "nothing ran": even a job believed hopeless runs,
    best-effort at its fastest size, and its own progress then shows what it can really do.
    Without ``explain`` the plan (and so the offer) is skipped.
    """
    verdict = _refusal(s.fresh, why, now=now, reject=reject)
    if not explain:
        return verdict
    s.tl.reset()
    snapshots: list[IntArray] = []
    base, base_failed = place_in_order(s.tl, s.healthy, stop=False, snapshots=snapshots)
    snapshots.append(s.tl.free.copy())
    reservations, shares = _slot0(s.healthy, base), {k: p.share for k, p in base.items()}
    offer = _offer(s, base, base_failed, snapshots, new.margin) if counter_offer else None
    why += f"; earliest deadline that passes: {iso_moment(offer)}" if offer is not None else ""
    at_risk = (*s.at_risk, *base_failed)
    return replace(
        verdict,
        reason=f"not guaranteed: {why}",
        counter_offer=offer,
        reservations=reservations,
        shares=shares,
        at_risk=at_risk,
    )


def _refusal(fresh: FillJob, why: str, *, now: float, reject: bool) -> Verdict:
    """Not guaranteed, no plan: rejected on request, else best effort at its quickest size."""
    kind: Kind = "rejected" if reject else "best_effort"
    units = 0 if kind == "rejected" else fresh.quickest(fresh.due - now)
    return Verdict(kind, units, f"not guaranteed: {why}", None)
