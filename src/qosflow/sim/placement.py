"""Where jobs go: ElasticFlow's buddy placement of job sizes onto nodes.

:func:`buddy_place` is ElasticFlow's buddy placement (``ALGORITHM.md`` §5.4): all jobs are
re-placed from scratch, largest first; a job of at least one node takes whole free nodes, smaller
ones go into partly used nodes (first fit, contiguous), else open a fresh node. With power-of-two
sizes in decreasing order this never fragments.
"""

from __future__ import annotations

import itertools
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
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for job_id, k in sorted(sizes, key=lambda s: -s[1]):
        if k >= node_size:
            want = math.ceil(k / node_size)
            free = list(itertools.islice((n for n in range(nodes) if used[n] == 0), want))
            if len(free) < want:
                raise ClusterError(f"placement: no {want} free nodes for {job_id} ({k} units)")
            for n in free:
                used[n] = node_size
            out[job_id] = (tuple(free), free[0] * node_size)
            continue
        pick = next((n for n in range(nodes) if 0 < used[n] <= node_size - k), None)
        if pick is None:
            pick = next((n for n in range(nodes) if used[n] == 0), None)
        if pick is None:
            raise ClusterError(f"placement: no node has {k} free units for {job_id}")
        out[job_id] = ((pick,), pick * node_size + used[pick])
        used[pick] += k
    return out
