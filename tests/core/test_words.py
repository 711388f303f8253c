"""Durations and instants in words: read at once, never equal in print when compared and different."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qosflow.core.words import duration, instant, unit_time


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (0.3, "0.3 s"),
        (45, "45 s"),
        (90, "1 min 30 s"),
        (144, "2 min 24 s"),
        (600, "10 min"),
        (3599.6, "1 h"),
        (34352, "9 h 33 min"),
        (7200, "2 h"),
        (3 * 86400 + 4 * 3600 + 100, "3 d 4 h"),
        (10**12, "31,688 years"),
        (-90, "-1 min 30 s"),
        (math.inf, "never"),
    ],
)
def test_a_duration_is_said_in_the_two_largest_units(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_two_compared_durations_that_differ_never_print_alike() -> None:
    assert duration(144.0, against=144.3) == "2 min 24.0 s"
    assert duration(144.3, against=144.0) == "2 min 24.3 s"
    assert duration(34352, against=34400) == "9 h 32 min 32 s"  # both "9 h 33 min" otherwise
    assert duration(60, against=60) == "1 min"  # equal values print alike: no noise


@given(
    st.floats(0, 1e9, allow_nan=False),
    st.floats(0.01, 1e6, allow_nan=False),
    st.booleans(),
)
def test_any_two_different_durations_read_differently_side_by_side(
    a: float, gap: float, later: bool
) -> None:
    b = a + gap if later else max(a - gap, 0.0)
    if a != b:
        assert duration(a, against=b) != duration(b, against=a)


def test_unit_time_adds_decimals_to_tell_two_amounts_apart() -> None:
    assert unit_time(11520, against=11530) != unit_time(11530, against=11520)
    assert unit_time(50) == "50 unit-s" and unit_time(math.inf) == "unbounded unit-hours"


@pytest.mark.parametrize(
    ("epoch", "text"),
    [
        (0.0, "1970-01-01 00:00:00 UTC"),
        (1e15, "after the year 9999"),
        (-1e15, "before the year 1"),
        (math.inf, "never"),
    ],
)
def test_an_instant_beyond_the_calendar_is_said_in_words(epoch: float, text: str) -> None:
    assert instant(epoch) == text
