"""Where jobs go: ElasticFlow's buddy placement of job sizes onto nodes.

:func:`buddy_place` is ElasticFlow's buddy placement (``ALGORITHM.md`` §5.4): all jobs are
re-placed from scratch, largest first; a job of at least one node takes whole free nodes, smaller
ones go into partly used nodes (first fit, contiguous), else open a fresh node. With power-of-two
sizes in decreasing order this never fragments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from qosflow.core.errors import ClusterError


def buddy_place(
    sizes: Sequence[tuple[str, int]], *, capacity: int, node_size: int
) -> dict[str, tuple[tuple[int, ...], int]]:
    """Place jobs on nodes, largest first; return ``{job: (node indices, first global rank)}``.

    Raises:
        ClusterError: When the sizes do not fit (more than the capacity, or fragmented by sizes
            that are not powers of two).
    """
    nodes = max(1, math.ceil(capacity / node_size))
    used = [0] * nodes
    # Nothing is released within one call and a fresh node is always the lowest unused one, so
    # the unused nodes are exactly those from ``fresh`` on, and the partly used ones lie below it.
    fresh = 0
    partial: list[int] = []  # partly used nodes, ascending
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for job_id, k in sorted(sizes, key=lambda s: -s[1]):
        if k >= node_size:
            want = math.ceil(k / node_size)
            if fresh + want > nodes:
                raise ClusterError(f"placement: no {want} free nodes for {job_id} ({k} units)")
            free = tuple(range(fresh, fresh + want))
            fresh += want
            for n in free:
                used[n] = node_size
            out[job_id] = (free, free[0] * node_size)
            continue
        pick = next((n for n in partial if used[n] <= node_size - k), None)
        if pick is None:
            if fresh >= nodes:
                raise ClusterError(f"placement: no node has {k} free units for {job_id}")
            pick, fresh = fresh, fresh + 1
            partial.append(pick)
        out[job_id] = ((pick,), pick * node_size + used[pick])
        used[pick] += k
        if used[pick] == node_size:
            partial.remove(pick)
    return out
