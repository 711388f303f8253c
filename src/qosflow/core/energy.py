"""Admission's energy test: do the jobs due by each deadline fit in the unit-seconds before it?

The necessary condition :mod:`qosflow.core.admission` checks before any plan: for every
effective deadline ``d``, the least unit-seconds the jobs due by ``d`` need (levels mixed over
time on each job's energy hull, :func:`~qosflow.core.timeline.hull_energy`) must fit in
``supply * (d - now)``. The guarantees' prefix sums are built once per set of guarantees; a
newcomer is then tested at any deadline by one bisection.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from qosflow.core.timeline import EPS, FillJob, hull_energy
from qosflow.core.words import iso_moment, unit_time


class Energy:
    """Prefix sums of the admitted jobs' least energy, ready to test a newcomer at any deadline.

    Args:
        order: The guaranteed jobs' fill views, earliest effective deadline first.
        now: Current time.
        supply: Units the test counts on (capacity times the share it may use).
    """

    def __init__(self, order: Sequence[FillJob], now: float, supply: float) -> None:
        self.now, self.supply = now, supply
        self.dues = [j.due for j in order]
        need = np.array([self._of(j, j.due) for j in order], dtype=np.float64)
        self.cum = np.concatenate(([0.0], np.cumsum(need)))
        self.slack = slack = supply * (np.array(self.dues) - now) - self.cum[1:]
        self.head_min = np.minimum.accumulate(slack) if slack.size else slack
        self.tail_min = np.minimum.accumulate(slack[::-1])[::-1] if slack.size else slack

    def _of(self, job: FillJob, due: float) -> float:
        return hull_energy(job.sp.hull, job.steps, due - self.now)

    def check(self, job: FillJob, due: float) -> str | None:
        """``None`` when the newcomer due at ``due`` passes, else why not."""
        p = bisect.bisect_right(self.dues, due)
        if p and self.head_min[p - 1] < -EPS * self.supply:
            return "the jobs already guaranteed need more unit-hours than the cluster has"
        mine = self._of(job, due)
        have = self.supply * (due - self.now) - self.cum[p]
        if mine > have * (1.0 + EPS):
            k, when, need = p - 1, due, self.cum[p] + mine
        elif p < len(self.dues) and self.tail_min[p] < mine * (1.0 - EPS):
            k = p + int(np.argmin(self.slack[p:]))
            when, need = self.dues[k], self.cum[k + 1] + mine
        else:
            return None
        exist = self.supply * max(when - self.now, 0.0)
        return (
            f"the jobs due by {iso_moment(when)} would need {unit_time(need, against=exist)} "
            f"but only {unit_time(exist, against=need)} exist"
        )
