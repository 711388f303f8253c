"""Fault injection for the emulated servers: error answers, dropped connections, slow answers.

A :class:`FaultPlan` is a list of :class:`FaultRule`. Before a request is handled, the first rule
whose listener, method and path pattern match (and whose count is not used up) fires:

* ``status`` 500 / 503 / 429 ...: answer with that status in the listener's error format (with
  ``Retry-After`` when ``retry_after`` is set) without touching the store;
* ``drop``: close the connection without an answer, before handling;
* ``drop_after``: handle the request (the change is stored), then close without an answer —
  the "crash between create and the caller recording it" case;
* ``delay_s``: sleep, then handle normally.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Listener = Literal["argo", "kube", "any"]
Action = Literal["status", "drop", "drop_after", "delay"]


@dataclass(frozen=True, slots=True)
class FaultRule:
    """One fault.

    Attributes:
        action: What to do (see the module docstring).
        method: HTTP method to match (``"*"`` for any).
        path: Regular expression searched in the request path (without the query).
        listener: Which server it applies to.
        status: HTTP status for ``action="status"``.
        retry_after: Seconds for the ``Retry-After`` header, for ``action="status"``.
        delay_s: Seconds to wait, for ``action="delay"``.
        count: How many requests it affects; ``None`` for all.
    """

    action: Action
    method: str = "*"
    path: str = ".*"
    listener: Listener = "any"
    status: int = 500
    retry_after: float | None = None
    delay_s: float = 0.0
    count: int | None = 1

    def matches(self, listener: str, method: str, path: str) -> bool:
        """Whether this rule applies to the request."""
        return (
            self.listener in ("any", listener)
            and self.method in ("*", method.upper())
            and re.search(self.path, path) is not None
        )


@dataclass
class FaultPlan:
    """Ordered fault rules with use counts; thread-safe.

    Attributes:
        rules: The rules, first match wins.
        fired: How many times each rule fired (same order as ``rules``).
        sleep: How ``delay`` rules wait (injectable, so tests need no wall clock).
    """

    rules: list[FaultRule] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)
    sleep: Callable[[float], None] = time.sleep
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rule: FaultRule) -> FaultPlan:
        """Append a rule; returns the plan for chaining."""
        with self._lock:
            self.rules.append(rule)
            self.fired.append(0)
        return self

    def take(self, listener: str, method: str, path: str) -> FaultRule | None:
        """The rule to apply to this request (its count is used up by one), or ``None``."""
        with self._lock:
            while len(self.fired) < len(self.rules):
                self.fired.append(0)
            for index, rule in enumerate(self.rules):
                used_up = rule.count is not None and self.fired[index] >= rule.count
                if not used_up and rule.matches(listener, method, path):
                    self.fired[index] += 1
                    return rule
        return None

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self.rules.clear()
            self.fired.clear()
