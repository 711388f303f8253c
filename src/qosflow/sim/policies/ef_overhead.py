"""ElasticFlow's restart overhead as its artifact charges it (``ALGORITHM.md`` §5.6).

The overhead depends on whether a job's GPU rank set was seen before, so it needs the ranks the
artifact's buddy placement hands out (:func:`artifact_ranks`, a replay of its node-set classes,
and, on a cluster of several switches, of the order of its free-node list across decisions).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from qosflow.sim.policy import Placed

_CLASSES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 88, 128, 256)
_LARGEST_FIRST = tuple(reversed(_CLASSES))


@dataclass(slots=True)
class _NodeSet:
    nodes: list[int]
    capacity: int
    util: int
    jobs: list[tuple[str, int]]


_UTIL = operator.attrgetter("util")
"""A node set's used GPUs (the sort key of a class's sets)."""


def _reclass(groups: dict[int, list[_NodeSet]], ns: _NodeSet, node_size: int, home: int) -> None:
    """File a node set under the largest class dividing its free GPUs (the artifact's rule)."""
    free = len(ns.nodes) * node_size - ns.util
    target = home
    if free > 0:
        target = next(c for c in _LARGEST_FIRST if c <= free and free % c == 0)
    groups[target].append(ns)
    groups[home].sort(key=_UTIL)
    groups[target].sort(key=_UTIL)


def _fit(groups: dict[int, list[_NodeSet]], cls: int, job: tuple[str, int], size: int) -> bool:
    """Try the first node set of one class (the artifact pops only the first)."""
    if not groups[cls]:
        return False
    ns = groups[cls].pop(0)
    if ns.util + job[1] > ns.capacity:
        groups[cls].append(ns)
        return False
    ns.util += job[1]
    ns.jobs.append(job)
    _reclass(groups, ns, size, job[1])
    return True


def _fit_larger(groups: dict[int, list[_NodeSet]], job: tuple[str, int], size: int) -> bool:
    """Try the classes above the job's size, largest first (empty classes cannot take it)."""
    for c in _LARGEST_FIRST:
        if c <= job[1]:
            return False
        if groups[c] and _fit(groups, c, job, size):
            return True
    return False


def artifact_ranks(
    sizes: tuple[tuple[str, int], ...],
    *,
    nodes: int,
    node_size: int,
    free: list[int] | None = None,
    sets: list[_NodeSet] | None = None,
) -> dict[str, int]:
    """First GPU rank of each job under the artifact's elastic placement (node classes).

    The artifact re-places every job from scratch at each decision, largest first, into node sets
    kept in classes by their free GPUs; the rank of a job is its position when the nodes are read
    in order (its ``scheduling_result``). Its overhead cache is keyed by these rank sets.
    ``free`` is its free-node list in the order it pops from (default: reading order; it is
    consumed), and ``sets``, when given, receives the node sets built.
    """
    free_nodes = list(range(nodes)) if free is None else free
    groups: dict[int, list[_NodeSet]] = {c: [] for c in _CLASSES}
    for job in sizes:
        k = job[1]
        if _fit(groups, k, job, node_size):
            continue
        if _fit_larger(groups, job, node_size):
            continue
        want = max(1, math.ceil(k / node_size))
        if want > len(free_nodes):
            continue
        taken = free_nodes[:want]
        del free_nodes[:want]
        _reclass(groups, _NodeSet(taken, want * node_size, k, [job]), node_size, k)
    if sets is not None:
        sets.extend(ns for c in _CLASSES for ns in groups[c])
    return _read_ranks(groups, nodes, node_size)


def _read_ranks(groups: dict[int, list[_NodeSet]], nodes: int, node_size: int) -> dict[str, int]:
    """Read nodes in order, jobs in placement order (the artifact's ``scheduling_result``)."""
    owner: dict[int, _NodeSet] = {}
    for c in _CLASSES:
        for ns in groups[c]:
            for n in ns.nodes:
                owner.setdefault(n, ns)
    ranks: dict[str, int] = {}
    for n in range(nodes):
        found = owner.get(n)
        if found is None:
            continue
        ns, pos = found, n * node_size
        for job_id, k in ns.jobs:
            ranks.setdefault(job_id, pos)
            pos += k if len(ns.nodes) == 1 else 0
    return ranks


class ElasticFlowOverhead:
    """The artifact's per-decision overhead (``ALGORITHM.md`` §5.6).

    Every running job loses 2 s (7 s on >= 256 GPUs) when its GPU rank set was seen before, else
    ``2 + 2 (log2 k + 1)`` s, plus 27 s (+20 s on >= 256 GPUs) on a restart decision (every
    ``slot``-th decision, when the rank-set cache is also cleared).
    """

    def __init__(self, slot: int, node_size: int = 8, switches: int = 1) -> None:
        """Overhead for a run with this slot (the artifact reuses the slot as restart period)."""
        self.slot, self.node_size, self.switches = slot, node_size, switches
        self._seen: set[tuple[int, int]] = set()
        self._ranks: tuple[tuple[int, tuple[tuple[str, int], ...]], dict[str, int]] = ((0, ()), {})
        self.release_order: tuple[str, ...] = ()
        self._free: list[int] | None = None
        self._sets: list[_NodeSet] = []

    def reset(self) -> None:
        """Forget the rank sets seen and the node lists (start of a run)."""
        self._seen = set()
        self._ranks = ((0, ()), {})
        self._free, self._sets = None, []

    def _free_order(self, nodes: int) -> list[int]:
        """The artifact's free-node list when it places (node = switch * per_switch + id).

        Before it places, the artifact releases every placed job: those that ended, then the
        others in deadline order (``release_order``, set by the policy). A node set emptied by a
        release is appended to the free list, which is then sorted stably by the node's id within
        its switch. On one switch that is reading order every time. On several, equal ids of
        different switches alternate, in the order their nodes were freed (n64g8: 2 x 32 nodes).
        """
        if self._free is None:
            return list(range(nodes))
        per_switch = max(1, nodes // self.switches)
        free = list(self._free)
        owner = {job_id: (ns, k) for ns in self._sets for job_id, k in ns.jobs}
        util = {id(ns): ns.util for ns in self._sets}
        order = [j for j in self.release_order if j in owner]
        listed = set(order)
        order += [j for ns in self._sets for j, _ in ns.jobs if j not in listed]
        released = False
        for job_id in order:
            ns, k = owner[job_id]
            util[id(ns)] -= k
            if util[id(ns)] == 0:
                free += ns.nodes
                released = True
        if released:  # one stable sort: equal ids keep the order in which they were freed
            free.sort(key=lambda n: n % per_switch)
        return free

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        """Overhead in seconds per running job."""
        big = capacity >= 256
        base = 7 if big else 2
        restart = decision > 0 and decision % self.slot == 0
        out: dict[str, int] = {}
        nodes = max(1, capacity // self.node_size)
        sizes = (nodes, tuple((p.job_id, p.units) for p in placed))
        if self.switches > 1:  # the free-node order carries over decisions: place every time
            free, sets = self._free_order(nodes), list[_NodeSet]()
            ranks = artifact_ranks(
                sizes[1], nodes=nodes, node_size=self.node_size, free=free, sets=sets
            )
            self._free, self._sets, self._ranks = free, sets, (sizes, ranks)
        elif self._ranks[0] != sizes:  # a third of decisions change nobody's size: place once
            ranks = artifact_ranks(sizes[1], nodes=nodes, node_size=self.node_size)
            self._ranks = (sizes, ranks)
        ranks = self._ranks[1]
        for p in sorted(placed, key=lambda q: ranks.get(q.job_id, q.first_rank)):
            key = (ranks.get(p.job_id, p.first_rank), p.units)
            if key in self._seen:
                out[p.job_id] = base
                continue
            self._seen.add(key)
            extra = (27 + (20 if big else 0)) if restart else 0
            out[p.job_id] = math.ceil(base + extra + 2 * (math.log2(p.units) + 1))
        if restart:
            self._seen = set()
        return out
