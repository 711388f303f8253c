"""Backoff with jitter inside a budget, on an injected clock (no real sleeps)."""

from __future__ import annotations

import itertools
import random

import pytest

from qosflow.core.errors import ClusterError
from qosflow_argo.retry import Retrier, RetryPolicy, TransientError, parse_retry_after


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def retrier(t: FakeTime, **policy: float) -> Retrier:
    return Retrier(RetryPolicy(**policy), t.clock, t.sleep, random.Random(7))  # type: ignore[arg-type]


def test_transient_failures_are_retried_until_success() -> None:
    t = FakeTime()
    outcomes = [TransientError("HTTP 503", status=503), TransientError("reset"), "ok"]

    def call() -> str:
        item = outcomes.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    r = retrier(t)
    assert r.call("GET x", call) == "ok"
    assert r.retries == 2 and len(t.sleeps) == 2
    assert 0 <= t.sleeps[0] <= 0.25 and 0 <= t.sleeps[1] <= 0.5  # full jitter under 2^k * base


def test_retry_after_is_honoured() -> None:
    t = FakeTime()
    seq = iter([TransientError("HTTP 429", status=429, retry_after=3.0)])

    def call() -> int:
        for exc in seq:
            raise exc
        return 1

    assert retrier(t).call("GET x", call) == 1
    assert t.sleeps == [3.0]


def test_budget_exhaustion_is_a_clear_retryable_error() -> None:
    t = FakeTime()

    def call() -> None:
        raise TransientError("HTTP 500: boom", status=500)

    with pytest.raises(ClusterError) as err:
        retrier(t, attempts=100, budget_s=5.0, base_s=1.0).call("POST workflow", call)
    assert err.value.retryable and err.value.status == 500
    assert "POST workflow: gave up after" in str(err.value) and "boom" in str(err.value)
    assert t.now <= 5.0


def test_attempt_cap_and_non_transient_errors_pass_through() -> None:
    t = FakeTime()
    calls = []

    def flaky() -> None:
        calls.append(1)
        raise TransientError("reset")

    with pytest.raises(ClusterError):
        retrier(t, attempts=3).call("GET", flaky)
    assert len(calls) == 3

    def refused() -> None:
        calls.append(2)
        raise ClusterError("HTTP 403: forbidden", status=403)

    with pytest.raises(ClusterError, match="403"):
        retrier(t).call("GET", refused)
    assert calls.count(2) == 1


def outage(t: FakeTime, until: float, calls: list[float]) -> object:
    """A server that answers 503 until the clock reaches ``until``, then works."""

    def call() -> str:
        calls.append(t.now)
        if t.now < until:
            raise TransientError("HTTP 503: unavailable", status=503)
        return "ok"

    return call


@pytest.mark.parametrize("seed", range(20))
def test_the_default_budget_is_60_seconds_of_time_not_a_count_of_tries(seed: int) -> None:
    """A 4-6 s outage (the fault campaign's) costs seconds, never the submit: the default policy
    keeps trying for 60 s however many tries that takes (six tries used to give up in 3.6-4.9 s)."""
    assert RetryPolicy().budget_s == 60.0 and RetryPolicy().attempts is None
    t, calls = FakeTime(), []
    r = Retrier(RetryPolicy(), t.clock, t.sleep, random.Random(seed))
    assert r.call("POST workflow", outage(t, 6.0, calls)) == "ok"  # type: ignore[arg-type]
    assert 6.0 <= calls[-1] <= 6.0 + 8.0  # succeeded soon after the end: no wait beyond the cap


@pytest.mark.parametrize("seed", range(10))
def test_a_longer_outage_gives_up_at_the_budget_after_a_last_try(seed: int) -> None:
    t, calls = FakeTime(), []
    r = Retrier(RetryPolicy(), t.clock, t.sleep, random.Random(seed))
    with pytest.raises(ClusterError) as err:
        r.call("POST workflow", outage(t, 1e9, calls))  # type: ignore[arg-type]
    assert err.value.retryable and "budget 60s" in str(err.value)
    assert calls[-1] == pytest.approx(60.0)  # the last wait is cut to what is left: one more try
    assert max(b - a for a, b in itertools.pairwise(calls)) <= 8.0


def test_a_retry_after_beyond_the_budget_gives_up_at_once() -> None:
    t = FakeTime()

    def call() -> None:
        raise TransientError("HTTP 429", status=429, retry_after=90.0)

    with pytest.raises(ClusterError, match="gave up after 1 tries"):
        retrier(t).call("GET x", call)
    assert t.sleeps == []


def test_same_seed_same_backoffs() -> None:
    a, b = FakeTime(), FakeTime()
    for t in (a, b):
        with pytest.raises(ClusterError):
            retrier(t, attempts=5).call("GET", lambda: (_ for _ in ()).throw(TransientError("x")))
    assert a.sleeps == b.sleeps and len(a.sleeps) == 4


def test_parse_retry_after() -> None:
    assert parse_retry_after("2", 0.0) == 2.0
    assert parse_retry_after(None, 0.0) is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 4.0) == 6.0
    assert parse_retry_after("soon", 0.0) is None
