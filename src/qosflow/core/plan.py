"""The backward fill's result: where each job goes and what stays free.

:class:`Placement` is one job's block in the slots of a timeline; :class:`FillPlan` the whole
plan, the evidence behind every guarantee (:func:`qosflow.core.timeline.backward_fill` makes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["FillPlan", "FloatArray", "IntArray", "Placement"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the fill put a job: slots ``[start, end)``, units per slot, its share (unit cap)."""

    start: int
    end: int
    alloc: IntArray | int  # units per slot of [start, end), or one level throughout
    share: int


@dataclass(frozen=True, slots=True)
class FillPlan:
    """A backward-fill plan, the evidence behind a guarantee.

    Attributes:
        edges: Slot edges (epoch seconds), one more than slots.
        free: Units left free in each slot after every placement.
        pins: Per job in the fill, the units it keeps in the pinned slots (0: none).
        placements: Per placed job, where the fill put it.
        failed: Jobs (in deadline order) the fill could not place.
        pinned_slots: Leading slots in which running guaranteed jobs keep their units.
    """

    edges: FloatArray
    free: IntArray
    pins: Mapping[str, int]
    placements: Mapping[str, Placement]
    failed: tuple[str, ...]
    pinned_slots: int

    @property
    def ok(self) -> bool:
        """Whether every job was placed."""
        return not self.failed

    @property
    def shares(self) -> dict[str, int]:
        """Per placed job, its minimal satisfactory share (unit cap)."""
        return {name: p.share for name, p in self.placements.items()}

    @property
    def units(self) -> dict[str, IntArray]:
        """Per job, the units it gets in each slot (running units in the pinned slots).

        Built on each access: most plans are only asked which jobs failed.
        """
        n = self.free.size
        rows: dict[str, IntArray] = {}
        for name, pin in self.pins.items():
            row = rows[name] = np.zeros(n, dtype=np.int64)
            for lo, end, value in self._pieces(name, pin):
                hi = min(end, n)
                if lo < hi:
                    row[lo:hi] = value[: hi - lo] if isinstance(value, np.ndarray) else value
        return rows

    def changes(self) -> dict[str, tuple[int, int | None]]:
        """Per job, :attr:`units` in the first slot and the first slot where they change.

        ``None``: they never change. Read off the same pieces as :attr:`units` without building
        the rows (the allocator asks this of the guarantees' plan at every decision); a plan of
        no slot has no entry.
        """
        n = self.free.size
        return {k: _first_change(self._pieces(k, v), n) for k, v in self.pins.items()} if n else {}

    def _pieces(self, name: str, pin: int) -> list[tuple[int, int, int | IntArray]]:
        """A job's row as ``(start, end, units)`` pieces: its pins, then 0, under its placement."""
        pinned, n = self.pinned_slots, self.free.size
        p = self.placements.get(name)
        if p is None:
            return [(0, pinned, pin), (pinned, n, 0)]
        a, b = min(pinned, p.start), max(pinned, p.end)
        return [(0, a, pin), (a, p.start, 0), (p.start, p.end, p.alloc), (p.end, b, pin), (b, n, 0)]


def _first_change(pieces: list[tuple[int, int, int | IntArray]], n: int) -> tuple[int, int | None]:
    """A row given as consecutive ``(start, end, units)`` pieces: its first value, where it changes.

    The pieces cover ``[0, n)`` in order (empty ones and any part past ``n`` are skipped);
    ``units`` is one level throughout its piece or one value per slot.
    """
    now: int | None = None
    for lo, hi, value in pieces:
        hi = min(hi, n)
        if lo >= hi:
            continue
        if isinstance(value, np.ndarray):
            got = value[: hi - lo]
            if now is None:
                now = int(got[0])
            diff = got != now
            if diff.any():
                return now, lo + int(diff.argmax())
        elif now is None:
            now = int(value)
        elif value != now:
            return now, lo
    return (now if now is not None else 0), None
