"""Admission: guarantees are backed by a valid plan, counter-offers pass, rejections follow the rules."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from qosflow.core.admission import (
    Candidate,
    FillPlan,
    Verdict,
    admit,
    backward_fill,
    candidate,
    least_energy,
    misses_alone,
    timeline,
    too_slow,
)
from qosflow.core.errors import SpecError
from qosflow.core.timeline import fill_job

NOW = 1_800_000_000.0
SLOT = 60.0
PROPS = settings(max_examples=150)


def job(
    name: str,
    hours: float,
    steps: int,
    *,
    levels: tuple[int, ...] = (1, 2, 4, 8),
    t1: float = 1.0,
    guaranteed: bool = True,
    running: int = 0,
    margin: float = 60.0,
) -> Candidate:
    """A job whose step time is t1 / n**0.8 (sub-linear speed-up)."""
    return Candidate(
        name,
        NOW + hours * 3600.0,
        steps,
        margin,
        levels,
        tuple(t1 / n**0.8 for n in levels),
        guaranteed,
        running,
    )


# --------------------------------------------------------------------------- an independent checker


def rate_at(c: Candidate, units: int) -> float:
    """Steps per second of ``c`` on ``units`` units: the fastest level that fits in them."""
    rates = [1.0 / t for n, t in zip(c.levels, c.step_time, strict=True) if n <= units]
    return max(rates, default=0.0)


def check_plan(plan: FillPlan, jobs: list[Candidate], capacity: int) -> None:
    """The plan is a real schedule: capacity respected, allowed sizes, every job done by its due."""
    lens = np.diff(plan.edges)
    total = np.zeros(lens.size, dtype=np.int64)
    for c in jobs:
        row = plan.units[c.name]
        total += row
        done = 0.0
        for k, n in enumerate(row):
            if n == 0:
                continue
            pinned = k < plan.pinned_slots and c.running_units > 0
            assert pinned or int(n) in c.levels, (c.name, k, n)
            end = min(plan.edges[k + 1], c.due)
            if not pinned:
                assert plan.edges[k + 1] <= c.due + 1e-6, (c.name, k)
            done += rate_at(c, int(n)) * max(end - plan.edges[k], 0.0)
        assert done >= c.remaining_steps * (1 - 1e-6), (c.name, done, c.remaining_steps)
    assert (total <= capacity).all()


def reference_fill(jobs: list[Candidate], capacity: int, edges: np.ndarray) -> dict[str, int]:
    """Plain-Python MSS backward fill on the same slot edges (no pins): the share of each job."""
    free = [capacity] * (len(edges) - 1)
    shares: dict[str, int] = {}
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].due, i))
    for i in order:
        c = jobs[i]
        end = int(np.searchsorted(edges, c.due, side="right")) - 1
        caps = sorted({n for n in c.levels if n <= capacity})
        for cap in caps:
            done, alloc = 0.0, {}
            for k in range(end - 1, -1, -1):
                best = max(
                    (n for n in c.levels if n <= min(cap, free[k]) and rate_at(c, n) > 0),
                    key=lambda n, c=c: (rate_at(c, n), -n),
                    default=0,
                )
                if best:
                    alloc[k] = best
                    done += rate_at(c, best) * (edges[k + 1] - edges[k])
                if done >= c.remaining_steps * (1 - 1e-9):
                    break
            if done >= c.remaining_steps * (1 - 1e-9):
                for k, n in alloc.items():
                    free[k] -= n
                shares[c.name] = cap
                break
    return shares


def shares_equal(ours: dict[str, int], ref: dict[str, int], jobs: list[Candidate]) -> None:
    """Equal up to caps with the same speed (the frontier skips levels no faster than smaller ones)."""
    by_name = {c.name: c for c in jobs}
    assert set(ours) == set(ref)
    for name, cap in ours.items():
        c = by_name[name]
        assert rate_at(c, cap) == pytest.approx(rate_at(c, ref[name]), rel=1e-12), name


# --------------------------------------------------------------------------- strategies


@st.composite
def candidates(draw: st.DrawFn, name: str, guaranteed: bool) -> Candidate:
    levels = tuple(sorted(draw(st.sets(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=1))))
    t1 = draw(st.floats(0.05, 3.0))
    alpha = draw(st.floats(0.0, 1.0))
    times = tuple(t1 / n**alpha for n in levels)
    hours = draw(st.floats(0.05, 8.0))
    load = draw(st.floats(0.02, 1.3))  # alone at the top level: share of the window it needs
    steps = max(1, int(load * hours * 3600 / min(times)))
    margin = draw(st.sampled_from([0.0, 30.0, 300.0]))
    return Candidate(name, NOW + hours * 3600, steps, margin, levels, times, guaranteed)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Candidate, list[Candidate], int]:
    """A new job against jobs guaranteed one by one by admission itself (or drawn at random)."""
    capacity = draw(st.integers(1, 24))
    drafts = [draw(candidates(f"a{i}", True)) for i in range(draw(st.integers(0, 8)))]
    if draw(st.booleans()):
        admitted = drafts  # arbitrary, possibly overloaded
    else:
        admitted = []
        for c in drafts:
            if admit(c, admitted, capacity=capacity, now=NOW, slot_s=SLOT).kind == "guaranteed":
                admitted.append(c)
    new = draw(candidates("new", False))
    return new, admitted, capacity


def alone_time(c: Candidate, capacity: int) -> float:
    """Seconds ``c`` needs alone on the whole cluster at its fastest level."""
    fits = [t for n, t in zip(c.levels, c.step_time, strict=True) if n <= capacity]
    return c.remaining_steps * min(fits) if fits else math.inf


def alone_feasible(c: Candidate, capacity: int, until: float) -> bool:
    return alone_time(c, capacity) <= until - NOW


def borderline(c: Candidate, capacity: int, until: float) -> bool:
    """Within float noise of just fitting: either answer is right."""
    return math.isclose(alone_time(c, capacity), until - NOW, rel_tol=1e-7)


def as_tested(c: Candidate, capacity: int) -> Candidate:
    """A guarantee as admission tests it: past its margin but not its deadline, due then."""
    j = fill_job(c, capacity, 0)
    spent = j.due - NOW < j.alone_s <= c.deadline - NOW
    return dataclasses.replace(c, margin=0.0) if c.guaranteed and spent else c


def with_deadline(c: Candidate, deadline: float) -> Candidate:
    return Candidate(
        c.name, deadline, c.remaining_steps, c.margin, c.levels, c.step_time, c.guaranteed
    )


# --------------------------------------------------------------------------- properties


@PROPS
@given(scenarios())
def test_a_guarantee_is_backed_by_a_fill_that_succeeds(
    sc: tuple[Candidate, list[Candidate], int],
) -> None:
    new, admitted, capacity = sc
    verdict = admit(new, admitted, capacity=capacity, now=NOW, slot_s=SLOT)
    if verdict.kind != "guaranteed":
        return
    kept = [as_tested(c, capacity) for c in admitted if c.name not in verdict.at_risk] + [new]
    plan = backward_fill(kept, capacity=capacity, now=NOW, slot_s=SLOT)
    assert plan.ok, plan.failed
    check_plan(plan, kept, capacity)
    assert verdict.units == plan.shares["new"]
    assert verdict.units in new.levels


@PROPS
@given(scenarios())
def test_the_same_guarantees_asked_again_answer_as_the_first_time(
    sc: tuple[Candidate, list[Candidate], int],
) -> None:
    """The guarantees' view is reused between questions: never one made for other inputs."""
    new, admitted, capacity = sc
    first = admit(new, admitted, capacity=capacity, now=NOW, slot_s=SLOT)
    later = admit(new, admitted, capacity=capacity, now=NOW + SLOT, slot_s=SLOT)
    fresh_later = admit(
        new,
        [dataclasses.replace(c) for c in admitted],
        capacity=capacity,
        now=NOW + SLOT,
        slot_s=SLOT,
    )
    assert later == fresh_later
    assert admit(new, admitted, capacity=capacity, now=NOW, slot_s=SLOT) == first
    asked_about_itself = [*admitted, dataclasses.replace(new, guaranteed=True)]
    assert admit(new, asked_about_itself, capacity=capacity, now=NOW, slot_s=SLOT) == first


@st.composite
def running_scenarios(draw: st.DrawFn) -> tuple[Candidate, list[Candidate], int]:
    """Like :func:`scenarios`, but some guaranteed jobs are running (at most the capacity)."""
    new, admitted, capacity = draw(scenarios())
    free, running = capacity, []
    for c in admitted:
        units = draw(st.integers(0, free))
        free -= units
        running.append(dataclasses.replace(c, running_units=units))
    return new, running, capacity


@PROPS
@given(running_scenarios())
def test_running_jobs_keep_their_units_and_the_plan_still_holds(
    sc: tuple[Candidate, list[Candidate], int],
) -> None:
    new, admitted, capacity = sc
    verdict = admit(new, admitted, capacity=capacity, now=NOW, slot_s=SLOT)
    for c in admitted:  # (no reservations when the verdict needed no plan)
        if c.name not in verdict.at_risk and verdict.reservations:
            assert verdict.reservations[c.name] >= c.running_units
    if verdict.kind == "guaranteed":
        kept = [as_tested(c, capacity) for c in admitted if c.name not in verdict.at_risk]
        kept.append(new)
        plan = backward_fill(kept, capacity=capacity, now=NOW, slot_s=SLOT)
        assert plan.ok, plan.failed
        check_plan(plan, kept, capacity)
        for c in kept:
            assert (plan.units[c.name][: plan.pinned_slots] >= c.running_units).all()


@PROPS
@given(scenarios())
def test_the_fill_matches_a_plain_python_reference(
    sc: tuple[Candidate, list[Candidate], int],
) -> None:
    new, admitted, capacity = sc
    jobs = [*admitted, new]
    plan = backward_fill(jobs, capacity=capacity, now=NOW, slot_s=SLOT)
    shares_equal(dict(plan.shares), reference_fill(jobs, capacity, plan.edges), jobs)
    placed = [c for c in jobs if c.name in plan.shares]
    check_plan(plan, placed, capacity)


@PROPS
@given(scenarios(), st.sampled_from(["run_best_effort", "reject"]))
def test_the_counter_offer_passes_the_test(
    sc: tuple[Candidate, list[Candidate], int], policy: str
) -> None:
    new, admitted, capacity = sc
    verdict = admit(new, admitted, capacity=capacity, now=NOW, if_not_guaranteed=policy)
    if verdict.kind == "guaranteed":
        assert verdict.counter_offer is None
        return
    if verdict.counter_offer is None:
        assert verdict.at_risk or math.isinf(alone_time(new, capacity))
        return
    assert verdict.counter_offer > new.deadline
    again = admit(
        with_deadline(new, verdict.counter_offer),
        admitted,
        capacity=capacity,
        now=NOW,
        if_not_guaranteed=policy,
    )
    assert again.kind == "guaranteed", again.reason


@PROPS
@given(scenarios())
def test_without_the_counter_offer_the_verdict_is_the_same(
    sc: tuple[Candidate, list[Candidate], int],
) -> None:
    new, admitted, capacity = sc
    full = admit(new, admitted, capacity=capacity, now=NOW)
    quick = admit(new, admitted, capacity=capacity, now=NOW, counter_offer=False)
    assert quick.counter_offer is None
    assert (quick.kind, quick.units, quick.at_risk) == (full.kind, full.units, full.at_risk)
    # the allocator asking a waiting job again reads only the kind and the size
    bare = admit(new, admitted, capacity=capacity, now=NOW, counter_offer=False, explain=False)
    assert (bare.kind, bare.units) == (full.kind, full.units)
    if full.kind == "guaranteed":
        assert bare == quick  # a guarantee carries its plan whatever the caller asked


@PROPS
@given(scenarios(), st.sampled_from(["run_best_effort", "reject"]))
def test_rejected_only_when_the_policy_says_so_never_for_a_belief(
    sc: tuple[Candidate, list[Candidate], int], policy: str
) -> None:
    new, admitted, capacity = sc
    verdict = admit(new, admitted, capacity=capacity, now=NOW, if_not_guaranteed=policy)
    if borderline(new, capacity, new.deadline):
        return
    hopeless = not alone_feasible(new, capacity, new.deadline)
    fits = any(
        n <= capacity and math.isfinite(t) for n, t in zip(new.levels, new.step_time, strict=True)
    )
    if verdict.kind == "rejected":
        assert policy == "reject" or not fits  # a size that fits the cluster: never for a belief
        assert verdict.units == 0
    elif verdict.kind == "best_effort":
        assert policy == "run_best_effort"
        assert verdict.units in new.levels
    if hopeless and fits:  # believed unable to make it even alone: still runs, at its fastest
        assert verdict.kind == ("rejected" if policy == "reject" else "best_effort")
        if policy == "run_best_effort":
            reachable = [t for n, t in zip(new.levels, new.step_time, strict=True) if n <= capacity]
            got = new.step_time[new.levels.index(verdict.units)]
            assert got <= min(reachable) * (1 + 1e-9)


@PROPS
@given(candidates("new", False), st.integers(1, 24))
def test_alone_a_job_is_guaranteed_exactly_when_it_fits_before_deadline_minus_margin(
    new: Candidate, capacity: int
) -> None:
    verdict = admit(new, [], capacity=capacity, now=NOW)
    if not borderline(new, capacity, new.due):
        assert (verdict.kind == "guaranteed") == alone_feasible(new, capacity, new.due)


@PROPS
@given(
    st.lists(st.tuples(st.integers(1, 16), st.floats(0.1, 5.0)), min_size=1, max_size=6),
    st.floats(1.0, 5000.0),
    st.floats(10.0, 5000.0),
)
def test_least_energy_is_the_lp_optimum(
    points: list[tuple[int, float]], steps: float, window: float
) -> None:
    table = dict(points)
    levels = tuple(sorted(table))
    times = tuple(table[n] for n in levels)
    got = least_energy(levels, times, steps, window)
    rates = [1.0 / t for t in times]
    res = linprog(
        c=list(levels), A_ub=[[-r for r in rates], [1.0] * len(levels)], b_ub=[-steps, window]
    )
    if res.status == 2:  # infeasible
        assert math.isinf(got)
    else:
        assert got == pytest.approx(res.fun, rel=1e-6)


# --------------------------------------------------------------------------- examples


def test_a_job_that_fits_is_guaranteed_at_its_minimal_share() -> None:
    # 3600 steps at 1 s/step on 1 unit; 2 h to go: one unit suffices.
    verdict = admit(job("new", 2, 3600, guaranteed=False), [], capacity=8, now=NOW)
    assert verdict.kind == "guaranteed"
    assert verdict.units == 1
    assert verdict.counter_offer is None
    assert verdict.shares == {"new": 1}


def test_a_job_that_would_break_a_guaranteed_one_runs_best_effort_with_a_counter_offer() -> None:
    # Capacity 4. "a" needs the whole cluster for the last 2 hours before its deadline.
    steps_a = int(2 * 3600 / (1 / 4**0.8))
    a = job("a", 4, steps_a, levels=(4,), margin=0.0)
    # "new" needs 2.5 h on all 4 units and is due in 3 h: it cannot fit next to "a".
    new = job("new", 3, int(2.5 * 3600 * 4**0.8), levels=(1, 2, 4), guaranteed=False, margin=0.0)
    verdict = admit(new, [a], capacity=4, now=NOW)
    assert verdict.kind == "best_effort"
    assert (
        "miss" in verdict.reason or "no share" in verdict.reason or "unit-hours" in verdict.reason
    )
    assert verdict.units == 4  # alone it would need all 4 units to make 3 h
    # Earliest passing deadline: after "a", with 2 h before 2 h and 0.5 h after: 4.5 h.
    assert verdict.counter_offer is not None
    assert NOW + 4.5 * 3600 <= verdict.counter_offer <= NOW + 4.5 * 3600 + 2 * SLOT
    again = admit(with_deadline(new, verdict.counter_offer), [a], capacity=4, now=NOW)
    assert again.kind == "guaranteed"


def test_a_hopeless_job_runs_best_effort_at_its_fastest_unless_its_spec_says_reject() -> None:
    new = job("new", 1, 100_000, guaranteed=False)  # needs ~5.5 h at 8 units
    verdict = admit(new, [], capacity=8, now=NOW)
    assert (verdict.kind, verdict.units) == ("best_effort", 8)  # a belief never means "nothing ran"
    assert "even alone" in verdict.reason
    assert verdict.counter_offer is not None and verdict.counter_offer > new.deadline
    refused = admit(new, [], capacity=8, now=NOW, if_not_guaranteed="reject")
    assert (refused.kind, refused.units) == ("rejected", 0)
    a = job("a", 1, int(3600 / (1 / 8**0.8)) - 10, margin=0.0)
    tight = job("new", 1, 1800, guaranteed=False, margin=0.0)
    assert admit(tight, [a], capacity=8, now=NOW, if_not_guaranteed="reject").kind == "rejected"
    assert admit(tight, [a], capacity=8, now=NOW).kind == "best_effort"


def test_running_guaranteed_jobs_keep_their_units_now() -> None:
    running = job("r", 6, 10_000, running=6)
    verdict = admit(job("new", 6, 1000, guaranteed=False), [running], capacity=8, now=NOW)
    assert verdict.kind == "guaranteed"
    assert verdict.reservations["r"] == 6
    plan = backward_fill([running], capacity=8, now=NOW)
    assert plan.pinned_slots >= 1
    assert (plan.units["r"][: plan.pinned_slots] == 6).all()


def test_hopeless_guaranteed_jobs_are_reported_and_do_not_block() -> None:
    late = job("late", 0.01, 1_000_000)
    verdict = admit(job("new", 2, 100, guaranteed=False), [late], capacity=8, now=NOW)
    assert verdict.kind == "guaranteed"
    assert verdict.at_risk == ("late",)


def test_a_promise_past_its_margin_keeps_what_it_needs_to_make_its_deadline() -> None:
    """Its margin spent, a promise is tested against its deadline, never left to newcomers.

    ``a`` needs the whole cluster for 55 of the 60 minutes left: past its 10-minute margin,
    in time for its deadline. A newcomer that needs half the cluster for half an hour of the same
    hour would make it miss; one due an hour later fits after it.
    """
    a = job("a", 1, int(55 * 60 * 8**0.8), levels=(8,), margin=600.0)
    crowding = job("new", 1, int(1800 * 4**0.8), levels=(4,), guaranteed=False, margin=0.0)
    verdict = admit(crowding, [a], capacity=8, now=NOW)
    assert verdict.kind == "best_effort"
    assert verdict.at_risk == ()
    after = job("new", 2, int(300 * 8**0.8), levels=(8,), guaranteed=False, margin=0.0)
    assert admit(after, [a], capacity=8, now=NOW).kind == "guaranteed"
    # one that misses even its deadline alone is left out, and does not block
    lost = job("lost", 0.5, int(55 * 60 * 8**0.8), levels=(8,), margin=600.0)
    verdict = admit(crowding, [lost], capacity=8, now=NOW)
    assert (verdict.kind, verdict.at_risk) == ("guaranteed", ("lost",))


def test_best_effort_and_done_jobs() -> None:
    forever = Candidate("bg", math.inf, 100, 0.0, (2, 4), (1.0, 0.6))
    assert admit(forever, [], capacity=8, now=NOW).kind == "best_effort"
    done = job("done", 1, 0, guaranteed=False)
    assert admit(done, [], capacity=8, now=NOW).kind == "guaranteed"


def test_verdict_round_trips_through_json_form() -> None:
    v = admit(job("new", 0.2, 100_000, guaranteed=False), [job("a", 3, 5000)], capacity=8, now=NOW)
    assert Verdict.from_dict(v.to_dict()) == v


def test_timeline_is_fine_first_then_coarse_and_keeps_marks() -> None:
    edges = timeline(NOW, NOW + 3 * 86400, SLOT, [NOW + 12_345.5])
    lens = np.diff(edges)
    assert edges[0] == NOW and edges[-1] >= NOW + 3 * 86400
    assert (lens[:200] == SLOT).all()
    assert lens.max() > 8 * SLOT
    assert NOW + 12_345.5 in edges
    assert len(edges) < 1500


def test_a_timeline_is_its_callers_whatever_grid_it_shares() -> None:
    """The grids behind timelines are built once and shared: a caller's edits stay its own."""
    first = timeline(NOW, NOW + 86400, SLOT, [])
    first[:] = 0.0
    later = timeline(NOW + 60.0, NOW + 86460.0, SLOT, [])
    assert later[0] == NOW + 60.0
    assert np.array_equal(later - 60.0, timeline(NOW, NOW + 86400, SLOT, []))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"levels": ()}, "levels"),
        ({"levels": (2, 1)}, "levels"),
        ({"step_time": (1.0,)}, "step_time"),
        ({"step_time": (1.0, 0.0)}, "step_time"),
        ({"remaining_steps": -1}, "remaining_steps"),
        ({"margin": -1.0}, "margin"),
        ({"deadline": math.nan}, "deadline"),
        ({"running_units": -2}, "running_units"),
    ],
)
def test_bad_candidates_name_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {
        "name": "x",
        "deadline": NOW + 10,
        "remaining_steps": 1,
        "margin": 0.0,
        "levels": (1, 2),
        "step_time": (1.0, 0.5),
    }
    with pytest.raises(SpecError) as err:
        Candidate(**(base | kwargs))  # type: ignore[arg-type]
    assert err.value.field.endswith(field)


def test_bad_admission_arguments_raise_spec_errors() -> None:
    new = job("new", 1, 10)
    with pytest.raises(SpecError, match="capacity"):
        admit(new, [], capacity=0, now=NOW)
    with pytest.raises(SpecError, match="if_not_guaranteed"):
        admit(new, [], capacity=4, now=NOW, if_not_guaranteed="maybe")
    with pytest.raises(SpecError, match="slot_s"):
        admit(new, [], capacity=4, now=NOW, slot_s=0.0)
    with pytest.raises(SpecError, match="unique"):
        admit(new, [job("a", 2, 10), job("a", 3, 10)], capacity=4, now=NOW)


def test_candidate_from_spec_and_belief() -> None:
    from datetime import UTC, datetime

    from qosflow.core.predict import Belief, oracle_belief
    from qosflow.core.spec import load_job
    from qosflow.core.speed import TableCurve

    start = datetime.fromtimestamp(NOW, UTC)
    spec = load_job(
        {
            "name": "ctr",
            "total_steps": 1000,
            "deadline": "PT2H",
            "resources": {"max": 8, "levels": [1, 2, 4, 8]},
        },
        now=start,
    )
    belief = oracle_belief(TableCurve({1: 1.0, 2: 1.9, 4: 3.5, 8: 3.0}), spec.resources.levels)
    c = candidate(spec, belief, steps_done=400, now=NOW, running_units=2, guaranteed=True)
    assert c.remaining_steps == 600
    assert c.levels == (1, 2, 4)  # capped at the knee
    assert c.step_time == pytest.approx((1.0, 1 / 1.9, 1 / 3.5))
    assert c.margin == pytest.approx(0.05 * 7200)
    assert c.deadline == pytest.approx(NOW + 7200)
    # candidates are asked for at every decision, so their levels are remembered per belief: a
    # belief with other speeds, or a spec with other levels, must never get a remembered answer
    slower = oracle_belief(TableCurve({1: 0.5, 2: 0.9, 4: 1.6, 8: 1.5}), spec.resources.levels)
    assert candidate(spec, slower, steps_done=0, now=NOW).step_time == pytest.approx(
        (2.0, 1 / 0.9, 1 / 1.6)
    )
    assert candidate(spec, belief, steps_done=0, now=NOW).step_time == c.step_time
    narrow = load_job(
        {
            "name": "ctr",
            "total_steps": 1000,
            "deadline": "PT2H",
            "resources": {"max": 2, "levels": [1, 2]},
        },
        now=start,
    )
    assert candidate(narrow, belief, steps_done=0, now=NOW).levels == (1, 2)
    # a remembered belief builds its candidates without the checks: the same fields as the
    # checked constructor, and what changes per call (the time, the units running) still checked
    again = candidate(spec, belief, steps_done=400, now=NOW, running_units=2, guaranteed=True)
    assert again == c and again == Candidate(*(getattr(c, f) for f in c.__slots__))
    with pytest.raises(SpecError, match="running_units"):
        candidate(spec, belief, steps_done=0, now=NOW, running_units=-1)
    # a belief whose levels fail the checks is never remembered: every call says so
    unsorted = Belief(belief.median, belief.conservative, (2, 1, 4), 4, ())
    for _ in range(2):
        with pytest.raises(SpecError, match="levels"):
            candidate(spec, unsorted, steps_done=0, now=NOW)


def test_counter_offer_with_many_guaranteed_jobs() -> None:
    """Past 64 guaranteed jobs the counter-offer search restarts from plan snapshots."""
    rng = np.random.default_rng(11)
    admitted: list[Candidate] = []
    CAP = 40
    for i in range(400):
        hours = float(rng.uniform(0.5, 12.0))
        draft = job(f"a{i}", hours, int(rng.uniform(0.1, 0.8) * hours * 3600), t1=1.0)
        if admit(draft, admitted, capacity=CAP, now=NOW).kind == "guaranteed":
            admitted.append(draft)
        if len(admitted) == 150:
            break
    assert len(admitted) == 150
    offers = 0
    for k in range(12):
        hours = float(rng.uniform(2.0, 10.0))
        new = job("new", hours, int(0.9 * hours * 3600 * 8**0.8), guaranteed=False)
        verdict = admit(new, admitted, capacity=CAP, now=NOW)
        if verdict.kind == "guaranteed" or verdict.counter_offer is None:
            continue
        offers += 1
        again = admit(with_deadline(new, verdict.counter_offer), admitted, capacity=CAP, now=NOW)
        assert again.kind == "guaranteed", (k, again.reason)
        plan = backward_fill(
            [*admitted, with_deadline(new, verdict.counter_offer)], capacity=CAP, now=NOW
        )
        assert plan.ok
    assert offers >= 3


def test_an_overcommitted_guaranteed_set_blocks_new_guarantees() -> None:
    # Two jobs that each need the whole cluster for 1.5 h of the same 2 h: one cannot fit.
    steps = int(1.5 * 3600 * 4**0.8)
    a = job("a", 2, steps, levels=(4,), margin=0.0)
    b = job("b", 2, steps, levels=(4,), margin=0.0)
    verdict = admit(job("new", 8, 10, guaranteed=False), [a, b], capacity=4, now=NOW)
    assert verdict.kind == "best_effort"
    assert verdict.counter_offer is None  # nothing passes while "b" does not fit
    assert verdict.at_risk == ("b",)
    assert verdict.shares == {"a": 4}


def test_max_utilisation_keeps_packing_slack() -> None:
    # Alone, this job needs 80 % of the cluster-time before its deadline.
    new = job("new", 2, int(0.8 * 2 * 3600 * 8**0.8), levels=(8,), guaranteed=False, margin=0.0)
    assert admit(new, [], capacity=8, now=NOW).kind == "guaranteed"
    slack = admit(new, [], capacity=8, now=NOW, max_utilisation=0.7)
    assert slack.kind == "best_effort"
    assert "unit-hours" in slack.reason


def test_a_job_in_time_only_without_its_margin_is_told_so() -> None:
    # alone at 8 units it needs 1.95 h of the 2 h left, but its margin is 10 min
    new = job("new", 2, int(1.95 * 3600 * 8**0.8), guaranteed=False, margin=600.0)
    verdict = admit(new, [], capacity=8, now=NOW)
    assert verdict.kind == "best_effort"  # it may still make it: never refused
    assert "needs 1 h 57 min even alone at 8 units but only 1 h 50 min are left" in verdict.reason
    assert "10 min margin" in verdict.reason and "inf" not in verdict.reason


def test_a_minute_scale_job_is_told_in_seconds_and_minutes() -> None:
    # alone at 8 units it needs 90 s of the 60 s left: no "0.03 h"
    new = job("new", 60 / 3600, int(90 * 8**0.8), guaranteed=False, margin=0.0)
    verdict = admit(new, [], capacity=8, now=NOW)
    assert "needs 1 min 30 s even alone at 8 units but only 1 min are left" in verdict.reason
    assert " h " not in verdict.reason and "0.0" not in verdict.reason


@PROPS
@given(
    st.lists(st.floats(1e-6, 1e3), min_size=1, max_size=12, unique=True),
    st.floats(1e-3, 1e6),
    st.floats(1.0, 1e7),
)
def test_the_first_rate_fast_enough_is_found_exactly(
    rates: list[float], target: float, span: float
) -> None:
    """The fill's smallest share is the first level whose rate does the work in the window.

    The search divides once and corrects to the products' rounding: it must agree with the
    plain search on ``rate * span`` on every input, boundary cases included.
    """
    import bisect

    from qosflow.core.timeline import _first_rate

    ordered = sorted(rates)
    exact = bisect.bisect_left(ordered, target, key=lambda r: r * span)
    assert _first_rate(ordered, target, span) == exact
    on_edge = ordered[len(ordered) // 2] * span  # a target exactly on a level's work
    assert _first_rate(ordered, on_edge, span) == bisect.bisect_left(
        ordered, on_edge, key=lambda r: r * span
    )


@PROPS
@given(scenarios(), st.booleans())
def test_a_job_too_slow_alone_is_told_so_whatever_else_runs(
    case: tuple[Candidate, list[Candidate], int], explain: bool
) -> None:
    """``too_slow`` answers for admission: what it names is admission's reason, never a guarantee.

    The allocator asks it first when it asks a waiting job again, and skips gathering the
    guarantees and the jobs ahead when it names a reason; that is only sound if admission, given
    those jobs, would have said the same.
    """
    new, admitted, capacity = case
    why = too_slow(new, capacity=capacity, now=NOW)
    assert misses_alone(new, capacity=capacity, now=NOW) == (why is not None)  # the allocator's
    verdict = admit(new, admitted, capacity=capacity, now=NOW, slot_s=SLOT, explain=explain)
    if why is not None:
        assert verdict.kind == "best_effort"
        assert verdict.reason.startswith(f"not guaranteed: {why}")
    elif not alone_feasible(new, capacity, new.due) and new.remaining_steps:
        assert verdict.kind != "guaranteed" or not math.isfinite(new.deadline)


@PROPS
@given(scenarios(), st.booleans(), st.data())
def test_a_plans_units_now_and_their_first_change_are_its_rows(
    case: tuple[Candidate, list[Candidate], int], new_first: bool, data: st.DataObject
) -> None:
    """``FillPlan.changes`` reads what the rows say, without building them.

    The allocator takes each guarantee's units now and the time the plan next changes (when it
    decides again) from it at every decision. Running jobs keep their units in the pinned slots.
    """
    new, admitted, capacity = case
    jobs, free = [], capacity
    for c in [*admitted, dataclasses.replace(new, guaranteed=True)]:
        running = data.draw(st.sampled_from([0, *(n for n in c.levels if n <= free)]))
        free -= running
        jobs.append(dataclasses.replace(c, running_units=running))
    plan = backward_fill(
        jobs, capacity=capacity, now=NOW, slot_s=SLOT, first={"new"} if new_first else ()
    )
    rows = {name: row for name, row in plan.units.items() if row.size}
    expected = {}
    for name, row in rows.items():
        changed = np.flatnonzero(row != row[0])
        expected[name] = (int(row[0]), int(changed[0]) if changed.size else None)
    assert plan.changes() == expected


def test_a_plans_changes_where_a_placement_and_the_pins_overlap() -> None:
    """A job done inside the pinned slots keeps its pin there; arrays and bare levels both read.

    The rows are spelled out: :attr:`FillPlan.units` and :meth:`FillPlan.changes` read the same
    pieces, so comparing the two alone would not catch a wrong rule.
    """
    from qosflow.core.timeline import Placement

    edges = NOW + 60.0 * np.arange(7)
    plan = FillPlan(
        edges,
        np.zeros(6, dtype=np.int64),
        {"done_early": 2, "array": 0, "level": 1, "left": 3, "flat": 0},
        {
            "done_early": Placement(1, 1, 0, 2),
            "array": Placement(2, 5, np.array([1, 1, 4]), 4),
            "level": Placement(3, 6, 1, 1),
            "flat": Placement(0, 6, 2, 2),
        },
        (),
        3,
    )
    rows = {name: row.tolist() for name, row in plan.units.items()}
    assert rows == {
        "done_early": [2, 2, 2, 0, 0, 0],
        "array": [0, 0, 1, 1, 4, 0],
        "level": [1, 1, 1, 1, 1, 1],
        "left": [3, 3, 3, 0, 0, 0],
        "flat": [2, 2, 2, 2, 2, 2],
    }
    expected = {}
    for name, row in plan.units.items():
        changed = np.flatnonzero(row != row[0])
        expected[name] = (int(row[0]), int(changed[0]) if changed.size else None)
    assert expected == {
        "done_early": (2, 3),
        "array": (0, 2),
        "level": (1, None),
        "left": (3, 3),
        "flat": (2, None),
    }
    assert plan.changes() == expected
