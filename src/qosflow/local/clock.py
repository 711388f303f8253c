"""Clocks of the local cluster: the wall clock for real runs, a virtual clock for tests.

The controller of the local cluster reads time only through a :class:`Clock`. With the
:class:`WallClock` a background thread ticks it every ``progress_tick_s`` seconds; with a
:class:`VirtualClock` nothing runs on its own: each :meth:`VirtualClock.advance` moves time forward
and runs one controller tick, so tests are fast and deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Source of the current time in epoch seconds."""

    def now(self) -> float:
        """Current time, epoch seconds (UTC)."""
        ...


class WallClock:
    """The real clock (``time.time``)."""

    def now(self) -> float:
        """Current wall-clock time, epoch seconds."""
        return time.time()


class VirtualClock:
    """A clock that moves only when told to; listeners run after every move.

    Args:
        start: Initial time, epoch seconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._listeners: list[Callable[[float], None]] = []

    def now(self) -> float:
        """Current virtual time, epoch seconds."""
        with self._lock:
            return self._now

    def subscribe(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(now)`` after every :meth:`advance` (the local cluster's tick)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[float], None]) -> None:
        """Stop calling ``listener``."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (>= 0), then run the listeners.

        Returns:
            The new time.

        Raises:
            ValueError: When ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"a clock cannot go back (advance by {seconds})")
        with self._lock:
            self._now += seconds
            now = self._now
        for listener in list(self._listeners):
            listener(now)
        return now


def rfc3339(epoch: float | None) -> str | None:
    """Format epoch seconds like Kubernetes (``2026-11-29T18:20:01Z``); ``None`` stays ``None``."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    """Inverse of :func:`rfc3339` (accepts fractional seconds); ``None`` stays ``None``."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
