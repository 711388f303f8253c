"""Retrying transient failures: exponential backoff with full jitter inside a time budget.

A call is retried when it failed *transiently*: HTTP 429 (honouring ``Retry-After``), 500, 502, 503,
504, a dropped or reset connection, or a timeout. Everything else (4xx) fails at once. The clock,
the sleep and the random generator are injected, so tests run without waiting and reproducibly.
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
        attempts: Most tries of one call, the first included.
        base_s: Backoff before the second try; doubles every try (full jitter below it).
        max_backoff_s: Cap of one backoff.
        budget_s: Most seconds one call may spend, sleeps included.
        timeout_s: Per-request (connect, read) timeout given to the HTTP layer.
    """

    attempts: int = 6
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

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` until it succeeds, fails permanently, or the attempts/budget run out.

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
                wait = self.backoff(attempt, exc.retry_after)
                if attempt >= self.policy.attempts or elapsed + wait > self.policy.budget_s:
                    raise ClusterError(
                        f"{what}: gave up after {attempt} tries in {elapsed:.1f}s: {exc}",
                        status=exc.status,
                        retryable=True,
                    ) from None
                log.info("%s: %s; retry %d in %.2fs", what, exc, attempt, wait)
                self.retries += 1
                self.sleep(wait)
