"""Pod addresses: every pod its own loopback address, as every pod of a cluster has its own IP.

Linux routes all of ``127.0.0.0/8`` to the loopback interface, so a process can bind
``127.42.0.2`` or connect to it without any setup. Each node hands out addresses of its own
``127.<n>.0.0/16`` (its ``podCIDR``; ``n`` is the node's ``network``: consecutive for the nodes of a
cluster, from a start derived from the state directory, so two local clusters on one host rarely
share a range) when the sandbox of a pod is made (at binding, as the kubelet does):
``status.podIP``, and through the downward API ``fieldRef: status.podIP``.

An address is free again once its pod has ended, but it is handed out again only after every
other address of the node's range was (a counter per node, kept in ``state.json``, that never goes
back); an address a live pod holds is never handed out twice, nor one that any socket of the host
still uses (``/proc/net/tcp`` and ``udp``, ``TIME_WAIT`` included: another cluster's pod, or a
process a pod left behind), so a new pod can always bind its address.

The pods still share the host's network namespace: ports bound on ``0.0.0.0`` (or ``127.0.0.1``)
collide between pods, and a connection from a pod leaves from ``127.0.0.1`` unless the client binds
its own address first.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from pathlib import Path

from qosflow.local.store import Store
from qosflow.local.topology import NodeInfo

HOSTS_PER_NODE = 256 * 254
"""Addresses of a node's ``/16``: third octet 0..255, fourth 1..254."""
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/udp")


def address(node: NodeInfo, serial: int) -> str:
    """The ``serial``-th address of ``node``'s range (``127.<n>.0.1`` is serial 0)."""
    third, fourth = divmod(serial % HOSTS_PER_NODE, 254)
    return f"127.{node.network}.{third}.{fourth + 1}"


def host_addresses(tables: Iterable[str] = SOCKET_TABLES) -> set[str]:
    """The loopback addresses any IPv4 socket of this host uses, in any state."""
    found: set[str] = set()
    for table in tables:
        try:
            rows = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except (OSError, UnicodeDecodeError):
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 2 or ":" not in fields[1]:
                continue
            try:  # the kernel prints the address as a native-order 32-bit number
                ip = socket.inet_ntoa(struct.pack("=I", int(fields[1].split(":")[0], 16)))
            except (ValueError, struct.error):
                continue
            if ip.startswith("127."):
                found.add(ip)
    return found


def allocate(store: Store, node: NodeInfo, in_use: Iterable[str]) -> str:
    """A fresh address of ``node`` for a pod: the next one no live pod and no socket holds.

    ``127.<n>.0.1`` is never handed out (it looks like a gateway); the counter is saved with the
    state, so a restart does not hand out recent addresses again.
    """
    taken = set(in_use) | host_addresses()
    key = f"pod-address/{node.name}"
    serial = store.counters.get(key, 0)
    for _ in range(HOSTS_PER_NODE):
        serial += 1
        candidate = address(node, serial)
        if serial % HOSTS_PER_NODE != 0 and candidate not in taken:
            store.counters[key] = serial
            store.mark_dirty()
            return candidate
    raise RuntimeError(f"node {node.name}: every pod address is in use")  # pragma: no cover
