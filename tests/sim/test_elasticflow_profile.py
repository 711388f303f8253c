"""ElasticFlow's leftover scoring reads the free-GPU profile without a job's own reservation.

Scoring a job's next level needs the first change point after now of the profile with that job's
reservation given back. :meth:`ElasticFlow._first_change` reads it in one walk; it must be the
first change point after now of :meth:`ElasticFlow._unreserved`, the profile actually built
(merged) when the job is picked, or the leftover allocator scores trials against a different
window than it plans them in, and the artifact's job-by-job outcomes no longer reproduce.
"""

from __future__ import annotations

from bisect import bisect_right

from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.sim.policies.ef_plan import JobCurve, Plan, merge
from qosflow.sim.policies.elasticflow import ElasticFlow, _Job
from qosflow.sim.trace import ThroughputTable

NOW = 600
SLOT = 60


@st.composite
def profiles_and_plans(draw: st.DrawFn) -> tuple[list[int], list[int], Plan]:
    """A merged free profile from now on, and a plan whose allocations may start before now."""
    offsets = draw(st.lists(st.integers(1, 40), max_size=8, unique=True))
    keys = [NOW, *sorted(NOW + SLOT * k for k in offsets)]
    vals = [draw(st.integers(0, 16)) for _ in keys]
    keys, vals = merge(keys, vals)
    times = draw(st.lists(st.integers(-10, 40), min_size=1, max_size=6, unique=True))
    allocs = tuple((NOW + SLOT * k, draw(st.integers(0, 8))) for k in sorted(times))
    end = NOW + SLOT * draw(st.integers(-12, 45))
    return keys, vals, Plan(True, ([], []), allocs, end, end)


@settings(max_examples=400)
@given(profiles_and_plans(), st.integers(-2, 42))
def test_the_first_change_without_a_reservation_is_the_unreserved_profiles(
    case: tuple[list[int], list[int], Plan], step: int
) -> None:
    keys, vals, plan = case
    now = NOW + SLOT * step
    policy = ElasticFlow(ThroughputTable("A100", {}))
    policy._profile = (keys, vals)
    job = _Job(JobCurve((1, 2, 4, 8), {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, 8), 10**9, False)
    job.plan = plan
    out_keys, _ = policy._unreserved(job)
    i = bisect_right(out_keys, now)
    expected = out_keys[i] if i < len(out_keys) else None
    assert policy._first_change(job, now) == expected
