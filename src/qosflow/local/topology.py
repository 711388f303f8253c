"""The nodes of the local cluster: names, labels, capacity, virtual cores and Node documents.

``LocalCluster(nodes=N, cpus=C, gpus=G)`` has ``N`` nodes of ``C`` allocatable CPUs (and ``G``
GPUs, advertised as the extended resource ``gpu_resource``) each, all on this host:

* one node keeps the historical name ``qosflow-local`` (:data:`NODE_NAME`); several are
  ``qosflow-local-0`` ... ``qosflow-local-<N-1>``, each with its own ``kubernetes.io/hostname``;
* node ``i`` owns the virtual cores ``i*C`` ... ``i*C + C - 1``; virtual core ``v`` runs on host
  CPU ``v % host CPUs``, so pods of different nodes run on different host cores where the host
  has enough of them;
* each node hands out pod addresses from its own ``127.<n>.0.0/16`` (its ``spec.podCIDR``, see
  :mod:`qosflow.local.addresses`; ``n`` is the node's ``network``, consecutive from the
  cluster's first); its own address, every pod's ``status.hostIP``, is ``127.0.0.1``: the nodes
  are one host;
* a GPU is only a number the scheduler counts: no device is given to the pod's process.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from qosflow.local.errors import LocalClusterError

NODE_NAME = "qosflow-local"
"""The name of the only node of a one-node cluster (the default), and the prefix of the others."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource GPUs are advertised as, unless ``gpu_resource`` names another one."""
HOST_IP = "127.0.0.1"
"""Every node's ``InternalIP`` and every pod's ``status.hostIP``."""
MAX_NODES = 254
"""A node per second octet of the loopback network (1..254) for its pods."""
ARCH = "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64"
_EXTENDED = re.compile(
    r"^(?P<domain>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of the local cluster.

    Attributes:
        name: Node name.
        index: Position (0-based): its virtual cores and pod network follow from it.
        cpus: Allocatable CPUs.
        memory: Allocatable memory in bytes.
        gpus: Allocatable GPUs (the extended resource ``gpu_resource``).
        gpu_resource: The GPUs' resource name.
        network: The second octet of its pods' loopback network, ``127.<network>.0.0/16``.
    """

    name: str
    index: int
    cpus: int
    memory: int
    gpus: int = 0
    gpu_resource: str = GPU_RESOURCE
    network: int = 1

    @property
    def labels(self) -> dict[str, str]:
        """The node's labels (``nodeSelector`` and node affinity are matched against them)."""
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": ARCH,
        }

    @property
    def cores(self) -> range:
        """The node's virtual cores (indices into the cluster's virtual cores)."""
        return range(self.index * self.cpus, (self.index + 1) * self.cpus)

    @property
    def pod_cidr(self) -> str:
        """The loopback network the node's pods get their addresses from."""
        return f"127.{self.network}.0.0/16"

    def allocatable(self) -> dict[str, Decimal]:
        """What the scheduler may place on the node: ``cpu`` (cores), ``memory``, GPUs."""
        resources = {"cpu": Decimal(self.cpus), "memory": Decimal(self.memory)}
        if self.gpus:
            resources[self.gpu_resource] = Decimal(self.gpus)
        return resources


def check_gpu_resource(name: str) -> str:
    """An extended resource name (``vendor.example/gpu``), as the API server requires one.

    Raises:
        LocalClusterError: When ``name`` is not a domain-prefixed name outside ``kubernetes.io``.
    """
    match = _EXTENDED.match(name)
    if match is None or match.group("domain").endswith("kubernetes.io"):
        raise LocalClusterError(
            f"gpu_resource: must be an extended resource name like {GPU_RESOURCE} (got {name!r})"
        )
    return name


def make_nodes(
    count: int,
    cpus: int,
    memory: int,
    gpus: int = 0,
    gpu_resource: str = GPU_RESOURCE,
    network: int = 1,
) -> tuple[NodeInfo, ...]:
    """The cluster's nodes: ``count`` alike nodes (see the module docstring for the names).

    Node ``i``'s pods get addresses of ``127.<network + i>.0.0/16`` (wrapping round after 254).

    Raises:
        LocalClusterError: For a count, CPU or GPU number out of range, or a bad resource name.
    """
    if not 1 <= count <= MAX_NODES:
        raise LocalClusterError(f"nodes: must be between 1 and {MAX_NODES} (got {count})")
    if cpus < 1:
        raise LocalClusterError(f"cpus: must be >= 1 (got {cpus})")
    if gpus < 0:
        raise LocalClusterError(f"gpus: must be >= 0 (got {gpus})")
    check_gpu_resource(gpu_resource)
    names = [NODE_NAME] if count == 1 else [f"{NODE_NAME}-{i}" for i in range(count)]
    return tuple(
        NodeInfo(name, index, cpus, memory, gpus, gpu_resource, 1 + (network - 1 + index) % 254)
        for index, name in enumerate(names)
    )


def node_document(node: NodeInfo, resource_version: str) -> dict[str, Any]:
    """The ``Node`` object the Kubernetes API serves for ``node``."""
    resources = {
        "cpu": str(node.cpus),
        "memory": f"{node.memory // 1024}Ki",
        "pods": "110",
    }
    if node.gpus:
        resources[node.gpu_resource] = str(node.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "uid": f"00000000-0000-4000-8000-{node.index + 1:012d}",
            "resourceVersion": resource_version,
            "labels": node.labels,
        },
        "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": node.name},
            ],
        },
    }
