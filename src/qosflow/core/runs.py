"""Runs of one-level blocks checked against the free units at once.

The backward fill places jobs one by one (:func:`qosflow.core.timeline.place_in_order`). Nearly
every job takes one level from a start slot to its effective deadline (its *block*), and where
that block lies depends on the job and the slot edges only, never on what is free: only whether
it fits does. So the blocks of a run of jobs are laid on the free units together, with a
difference array: if the run's total use fits everywhere, every job of it fits next to those
before it (a job fails only where the jobs up to it take more than is free in its block, and
where the run's total fits, so does every part of it). If it does not, a bisection finds the
first job that does not fit, which the caller places on its own. The result is the one-by-one
fill's, to the unit: the whole run is integer arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from qosflow.core.plan import IntArray, Placement

Block: TypeAlias = tuple[int, int, int, int, int, float]
"""``(start, end, cap, level index, first slot, target steps)``: a job's block ``[start, end)``
at ``cap`` units (:meth:`qosflow.core.timeline.Timeline.block`)."""


class Runs:
    """The blocks of jobs to place in order, as arrays, against a timeline's free units.

    Args:
        free: The free units per slot (read when a run is checked, never written).
        blocks: Per job in order, its block, a :class:`~qosflow.core.plan.Placement` (nothing
            left to place) or ``None`` (no block fits whatever is free).
    """

    def __init__(self, free: IntArray, blocks: Sequence[Block | Placement | None]) -> None:
        self.free, self.blocks, n = free, blocks, len(blocks)
        sized = [b if type(b) is tuple else (0, 0, 0) for b in blocks]
        self.starts = np.fromiter((b[0] for b in sized), np.int64, n)
        self.ends = np.fromiter((b[1] for b in sized), np.int64, n)
        self.caps = np.fromiter((b[2] for b in sized), np.float64, n)

    def usage(self, i: int, j: int) -> IntArray | None:
        """Units the blocks of jobs ``[i, j)`` take per slot (``None``: none)."""
        if j <= i:
            return None
        size, caps = self.free.size, self.caps[i:j]
        delta = np.bincount(self.starts[i:j], caps, size + 1)
        delta -= np.bincount(self.ends[i:j], caps, size + 1)
        return np.cumsum(delta[:size]).astype(np.int64)

    def _fits(self, used: IntArray | None) -> bool:
        return used is None or bool((used <= self.free).all())

    def first_misfit(self, i: int, j: int, *, stop: bool) -> tuple[int, IntArray | None]:
        """The first job in ``[i, j)`` to place on its own, and what the blocks before it take.

        That is the first whose block does not fit next to the blocks before it from ``i``
        (with ``stop`` also the first no block fits, since the fill stops there); ``j`` when
        there is none.
        """
        if stop:
            j = next((k for k in range(i, j) if self.blocks[k] is None), j)
        if j - i == 1:  # one job: its block against what is free
            b = self.blocks[i]
            if type(b) is not tuple:
                return j, None
            return (i, None) if int(self.free[b[0] : b[1]].min()) < b[2] else (j, self.usage(i, j))
        used = self.usage(i, j)
        if self._fits(used):
            return j, used
        lo, hi = i, j - 1  # the jobs [i, lo) fit; job hi does not fit next to [i, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._fits(self.usage(i, mid + 1)):
                lo = mid + 1
            else:
                hi = mid
        return hi, self.usage(i, hi)

    def snapshots(self, i: int, f: int, every: int, out: list[IntArray]) -> None:
        """Appends the free units before each ``every``-th job in ``[i, f)``.

        Those are the free units with the blocks of the jobs from ``i`` up to it placed.
        """
        for k in range(i + (-i) % every, f, every):
            used = self.usage(i, k)
            out.append(self.free.copy() if used is None else self.free - used)
