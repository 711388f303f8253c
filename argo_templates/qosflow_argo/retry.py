"""Retrying transient failures: exponential backoff with full jitter inside a time budget.

A call is retried when it failed *transiently*: HTTP 429 (honouring ``Retry-After``), 500, 502, 503,
504, a dropped or reset connection, or a timeout. Everything else (4xx) fails at once. The clock,
the sleep and the random generator are injected, so tests run without waiting and reproducibly.

The limit is **time**, not a count of tries: by default a call keeps trying for
``budget_s = 60`` seconds (sleeps and tries included), waiting ``uniform(0, min(8, 0.25 × 2^k))``
seconds before try ``k + 1``, or what the server's ``Retry-After`` asks when that is longer. The
last wait is cut to what is left of the budget, so one more try is made at its end; a
``Retry-After`` beyond the budget gives up at once. An outage of a few seconds therefore costs a
few seconds, never the operation (a count of six tries ran out after about 4 s).
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from qosflow.core.errors import ClusterError

T = TypeVar("T")
log = logging.getLogger(__name__)
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


class TransientError(Exception):
    """A failure worth retrying.

    Attributes:
        status: HTTP status, or ``None`` for connection problems and timeouts.
        retry_after: Seconds the server asked us to wait, when it said so.
    """

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ):
        """Describe the failure (never include credentials in ``message``)."""
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try.

    Attributes:
        attempts: Most tries of one call, the first included; ``None`` (the default): as many
            as fit in the budget.
        base_s: Backoff before the second try; doubles every try (full jitter below it).
        max_backoff_s: Cap of one backoff.
        budget_s: Most seconds one call may spend before its last try starts, sleeps included
            (a try itself is bounded by ``timeout_s``).
        timeout_s: Per-request (connect, read) timeout given to the HTTP layer.
    """

    attempts: int | None = None
    base_s: float = 0.25
    max_backoff_s: float = 8.0
    budget_s: float = 60.0
    timeout_s: float = 10.0


@dataclass(slots=True)
class Retrier:
    """Runs calls under a :class:`RetryPolicy` with an injected clock, sleep and generator."""

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    retries: int = 0

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts from 1)."""
        ceiling = min(self.policy.max_backoff_s, self.policy.base_s * 2 ** (attempt - 1))
        wait = self.rng.uniform(0.0, ceiling)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait

    def next_wait(self, attempt: int, elapsed: float, retry_after: float | None) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or ``None`` when it is time to give up."""
        left = self.policy.budget_s - elapsed
        cap = self.policy.attempts
        if left <= 0 or (cap is not None and attempt >= cap):
            return None
        if retry_after is not None and retry_after > left:
            return None
        return min(self.backoff(attempt, retry_after), left)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` until it succeeds, fails permanently, or the time budget runs out.

        Args:
            what: Short description for logs and errors (``GET workflow x``); no secrets.
            fn: The call; raises :class:`TransientError` for retryable failures.

        Raises:
            ClusterError: ``retryable=True`` when the budget ran out on transient failures.
        """
        start = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except TransientError as exc:
                elapsed = self.clock() - start
                wait = self.next_wait(attempt, elapsed, exc.retry_after)
                if wait is None:
                    raise ClusterError(
                        f"{what}: gave up after {attempt} tries in {elapsed:.1f}s "
                        f"(budget {self.policy.budget_s:.0f}s): {exc}",
                        status=exc.status,
                        retryable=True,
                    ) from None
                log.info("%s: %s; retry %d in %.2fs", what, exc, attempt, wait)
                self.retries += 1
                self.sleep(wait)
