"""Numbers in the words qosflow's reasons and messages use: a duration a person reads at once.

A minute-scale job is told ``45 s`` or ``2 min 24 s``, a nightly one ``9 h 32 min``, a long one
``3 d 4 h``; never ``0.00 h`` nor ``34352 s``. Two durations that are compared in one sentence
are never printed equal when they differ: ``duration(a, against=b)`` adds precision until the two
read differently (``2 min 24 s misses 2 min 23 s``), so no message says ``2.4 min misses 2.4
min``. Instants beyond what a calendar date can show are said in words (``after the year 9999``)
instead of failing.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
YEAR = 365.25 * DAY
_UNITS = ((DAY, "d"), (HOUR, "h"), (MINUTE, "min"))
_PRECISIONS = 4
"""0: the two largest units; 1: down to the second; 2 and 3: tenths and thousandths of one."""


def _parts(s: float, step: float) -> str:
    """``s`` (>= 0) rounded to a multiple of ``step`` (>= 1 s), as ``d h min s`` without zeros."""
    rest = round(s / step) * step
    words = []
    for size, name in _UNITS:
        count, rest = divmod(rest, size)
        if count:
            words.append(f"{int(count):,} {name}")
    if rest >= 0.5 or not words:
        words.append(f"{rest:.0f} s")
    return " ".join(words)


def _render(s: float, precision: int) -> str:
    """A non-negative finite duration at one of the :data:`_PRECISIONS`."""
    if precision >= 2:
        whole = math.floor(s)
        digits = 1 if precision == 2 else 3
        tail = f"{s - whole:.{digits}f}"
        if tail.startswith("1"):  # 59.96 s: the tenths round up to the next second
            whole, tail = whole + 1, f"{0:.{digits}f}"
        head = _parts(whole - whole % 60, MINUTE) if whole >= 60 else ""
        seconds = f"{whole % 60}{tail[1:]} s"
        return f"{head} {seconds}" if head else seconds
    if precision == 0 and s >= 2 * YEAR:
        return f"{s / YEAR:,.0f} years"
    if s < 1:
        return f"{s:.1f} s" if s > 0 else "0 s"
    if precision == 1:
        return _parts(s, 1.0)
    steps = [size for size, _ in _UNITS if round(s) >= size]  # the largest unit it reaches
    step = {DAY: HOUR, HOUR: MINUTE, MINUTE: 1.0}[steps[0]] if steps else 1.0
    return _parts(s, step)


def duration(seconds: float, *, against: float | None = None) -> str:
    """A duration: ``45 s``, ``2 min 24 s``, ``9 h 32 min``, ``3 d 4 h`` (``never``: infinite).

    Args:
        seconds: The duration (negative ones get a ``-``).
        against: The duration it is compared with in the same sentence: precision is added
            (seconds, then tenths...) until the two differ in print whenever they differ.
    """
    if not math.isfinite(seconds):
        return "never"
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    other = None if against is None or not math.isfinite(against) else against
    text = ""
    for precision in range(_PRECISIONS):
        text = sign + _render(s, precision)
        if other is None or other == seconds:
            return text
        if text != ("-" if other < 0 else "") + _render(abs(other), precision):
            return text
    return text


def unit_time(unit_seconds: float, *, against: float | None = None) -> str:
    """An amount of work in unit-time: ``90 unit-s``, ``12.5 unit-min``, ``3.2 unit-hours``.

    Args:
        unit_seconds: The work, in unit-seconds.
        against: The amount it is compared with: decimals are added until the two differ in print.
    """
    if not math.isfinite(unit_seconds):
        return "unbounded unit-hours"
    s = abs(unit_seconds)
    divisor, name, digits = (
        (1.0, "unit-s", 0)
        if s < 120
        else (60.0, "unit-min", 1)
        if s < 7200
        else (3600.0, "unit-hours", 1)
    )
    text = ""
    for extra in range(4):
        text = f"{unit_seconds / divisor:.{digits + extra}f} {name}"
        if against is None or against == unit_seconds or not math.isfinite(against):
            return text
        if text != f"{against / divisor:.{digits + extra}f} {name}":
            return text
    return text


def instant(epoch_seconds: float) -> str:
    """An instant in UTC, ``2026-11-30 06:00:00 UTC``; in words where a date cannot show it.

    ``never`` for an infinite time (a best-effort job's deadline), ``after the year 9999`` and
    ``before the year 1`` beyond the calendar's range (a finish predicted 10¹² steps away).
    """
    if math.isnan(epoch_seconds) or epoch_seconds == math.inf:
        return "never"
    try:
        return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "after the year 9999" if epoch_seconds > 0 else "before the year 1"


def iso_moment(epoch_seconds: float) -> str:
    """An instant as ISO 8601 in UTC to the second, ``2026-11-30T06:00:00Z`` (admission's words)."""
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
