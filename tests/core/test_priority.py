"""Priority ladder: laxity buckets, hysteresis at the edges, Argo EDF rank."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.core.errors import SpecError
from qosflow.core.priority import (
    LADDER,
    PriorityClassDef,
    argo_priority,
    by_name,
    classify,
    laxity,
)

PROPS = settings(max_examples=300)
NOW = 1_800_000_000.0
EDGES = (0.10, 0.25, 0.50)
GUARANTEED = ("qosflow-urgent", "qosflow-high", "qosflow-normal", "qosflow-low")


def test_the_ladder_names_values_and_preemption() -> None:
    assert [(k.name, k.value) for k in LADDER] == [
        ("qosflow-urgent", 100_000),
        ("qosflow-high", 50_000),
        ("qosflow-normal", 20_000),
        ("qosflow-low", 10_000),
        ("qosflow-besteffort", 0),
        ("qosflow-late", -1_000),
    ]
    assert [k.name for k in LADDER if k.preempts] == ["qosflow-urgent"]
    assert all(k.description for k in LADDER)
    assert by_name("qosflow-high") is LADDER[1]
    assert by_name("system-cluster-critical") is None


def test_laxity_is_the_slack_share_of_the_window() -> None:
    # Submitted 10 h ago, due in 10 h, conservative finish in 5 h: a quarter of the window is slack.
    lax = laxity(
        now=NOW,
        deadline=NOW + 36_000,
        submitted_at=NOW - 36_000,
        conservative_finish=NOW + 18_000,
    )
    assert lax == pytest.approx(0.25)
    late = laxity(
        now=NOW, deadline=NOW + 100, submitted_at=NOW - 100, conservative_finish=NOW + 300
    )
    assert late == pytest.approx(-1.0)
    assert laxity(now=NOW, deadline=math.inf, submitted_at=NOW, conservative_finish=NOW) == math.inf
    unknown = laxity(now=NOW, deadline=NOW + 1, submitted_at=NOW, conservative_finish=math.inf)
    assert unknown == -math.inf
    # A finish "in the past" counts from now.
    past = laxity(now=NOW, deadline=NOW + 100, submitted_at=NOW - 100, conservative_finish=NOW - 50)
    assert past == pytest.approx(0.5)
    with pytest.raises(SpecError, match="deadline"):
        laxity(now=NOW, deadline=math.nan, submitted_at=NOW, conservative_finish=NOW)


@pytest.mark.parametrize(
    ("lax", "name"),
    [
        (-0.5, "qosflow-urgent"),
        (0.0, "qosflow-urgent"),
        (0.0999, "qosflow-urgent"),
        (0.10, "qosflow-high"),
        (0.2499, "qosflow-high"),
        (0.25, "qosflow-normal"),
        (0.4999, "qosflow-normal"),
        (0.50, "qosflow-low"),
        (0.99, "qosflow-low"),
        (math.inf, "qosflow-low"),
    ],
)
def test_guaranteed_jobs_are_bucketed_by_laxity(lax: float, name: str) -> None:
    assert classify(lax, guaranteed=True, hopeless=False).name == name


def test_besteffort_and_late() -> None:
    assert classify(0.05, guaranteed=False, hopeless=False).name == "qosflow-besteffort"
    assert classify(0.9, guaranteed=True, hopeless=True).name == "qosflow-late"
    assert classify(0.9, guaranteed=False, hopeless=True).name == "qosflow-late"
    # A previous guaranteed class does not hold a job that lost its guarantee.
    assert classify(0.3, guaranteed=False, hopeless=False, previous="qosflow-normal").name == (
        "qosflow-besteffort"
    )


def test_hysteresis_holds_the_previous_bucket_near_an_edge() -> None:
    assert classify(0.26, guaranteed=True, hopeless=False, previous="qosflow-high").name == (
        "qosflow-high"
    )
    assert classify(0.28, guaranteed=True, hopeless=False, previous="qosflow-high").name == (
        "qosflow-normal"
    )
    assert classify(0.24, guaranteed=True, hopeless=False, previous="qosflow-normal").name == (
        "qosflow-normal"
    )
    assert classify(0.22, guaranteed=True, hopeless=False, previous="qosflow-normal").name == (
        "qosflow-high"
    )
    assert classify(0.09, guaranteed=True, hopeless=False, previous="qosflow-high").name == (
        "qosflow-high"
    )
    # Unknown previous names (a foreign PriorityClass) are ignored.
    assert classify(0.26, guaranteed=True, hopeless=False, previous="default").name == (
        "qosflow-normal"
    )
    with pytest.raises(SpecError, match="hysteresis"):
        classify(0.3, guaranteed=True, hopeless=False, hysteresis=-0.1)
    with pytest.raises(SpecError, match="laxity"):
        classify(math.nan, guaranteed=True, hopeless=False)


@PROPS
@given(st.floats(-2.0, 3.0), st.sampled_from(GUARANTEED), st.floats(0.0, 0.05))
def test_hysteresis_only_matters_within_its_band(lax: float, previous: str, h: float) -> None:
    raw = classify(lax, guaranteed=True, hopeless=False)
    held = classify(lax, guaranteed=True, hopeless=False, previous=previous, hysteresis=h)
    near_edge = any(abs(lax - e) <= h for e in EDGES)
    if not near_edge:
        assert held == raw  # away from every edge the previous class never matters
    else:
        assert held in (raw, by_name(previous))
    # A job already in the raw bucket stays there; with no band the previous class is ignored.
    assert classify(lax, guaranteed=True, hopeless=False, previous=raw.name, hysteresis=h) == raw
    assert classify(lax, guaranteed=True, hopeless=False, previous=previous, hysteresis=0.0) == raw


@PROPS
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=60))
def test_a_laxity_wobble_inside_the_band_never_flaps(wobble: list[float]) -> None:
    """Laxity oscillating by less than the band around an edge keeps one class."""
    classes = set()
    previous: str | None = None
    for w in wobble:
        klass = classify(
            0.25 + 0.019 * (2 * w - 1), guaranteed=True, hopeless=False, previous=previous
        )
        classes.add(klass.name)
        previous = klass.name
    assert len(classes) == 1


@PROPS
@given(
    st.floats(NOW - 86_400 * 365, NOW + 86_400 * 365 * 20),
    st.floats(NOW - 86_400 * 365, NOW + 86_400 * 365 * 20),
    st.sampled_from(LADDER),
    st.sampled_from(LADDER),
)
def test_argo_priority_is_int32_class_first_then_earliest_deadline(
    d1: float, d2: float, k1: PriorityClassDef, k2: PriorityClassDef
) -> None:
    p1 = argo_priority(deadline=d1, now=NOW, klass=k1)
    p2 = argo_priority(deadline=d2, now=NOW, klass=k2)
    for p in (p1, p2):
        assert isinstance(p, int)
        assert 0 <= p <= 2**31 - 1
    if k1.value > k2.value or (k1 == k2 and d1 <= d2 - 10.0):
        assert p1 > p2
    elif k1 == k2 and d1 <= d2:
        assert p1 >= p2


def test_argo_priority_edge_cases() -> None:
    top, best = LADDER[0], LADDER[4]
    no_deadline = argo_priority(deadline=math.inf, now=NOW, klass=best)
    assert no_deadline < argo_priority(deadline=NOW + 1e6, now=NOW, klass=best)
    assert no_deadline > argo_priority(deadline=NOW, now=NOW, klass=LADDER[5])
    # Ranks do not depend on when they are computed.
    assert argo_priority(deadline=NOW + 600, now=NOW, klass=top) == argo_priority(
        deadline=NOW + 600, now=NOW + 300, klass=top
    )
    with pytest.raises(SpecError):
        argo_priority(deadline=math.nan, now=NOW, klass=top)
    with pytest.raises(SpecError, match="klass"):
        argo_priority(deadline=NOW, now=NOW, klass=PriorityClassDef("x", 1, False, ""))
