"""Numbers in the words qosflow's reasons and messages use: a duration a person reads at once.

A minute-scale job is told ``45 s`` or ``12.5 min``, a nightly one ``3.20 h``; never ``0.00 h``.
"""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """A duration: ``45 s``, ``12.5 min``, ``3.20 h`` (``never`` when infinite)."""
    if not math.isfinite(seconds):
        return "never"
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 120:
        return f"{sign}{s:.0f} s"
    if s < 7200:
        return f"{sign}{s / 60:.1f} min"
    return f"{sign}{s / 3600:.2f} h"


def unit_time(unit_seconds: float) -> str:
    """An amount of work in unit-time: ``90 unit-s``, ``12.5 unit-min``, ``3.2 unit-hours``."""
    if not math.isfinite(unit_seconds):
        return "unbounded unit-hours"
    s = abs(unit_seconds)
    if s < 120:
        return f"{unit_seconds:.0f} unit-s"
    if s < 7200:
        return f"{unit_seconds / 60:.1f} unit-min"
    return f"{unit_seconds / 3600:.1f} unit-hours"
