"""Each pod its own loopback address (issue 18): ``status.podIP`` from its node's ``127.<i+1>/16``,
``POD_IP`` through the downward API, never handed out again while an old pod may linger (nor after
a restart), and real processes can bind it: two pods listen on the same port side by side."""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
from qosflow.local.addresses import address, allocate, host_addresses
from qosflow.local.store import Store
from qosflow.local.topology import make_nodes

from .conftest import NS, Api, container_wf, pod_of
from .segments import POD_IP


def _submit(
    cluster: LocalCluster, name: str, command: list[str] | None = None, cpu: str = "0"
) -> None:
    request = container_wf(name, cpu=cpu, command=command)
    container = request["workflow"]["spec"]["templates"][0]["container"]
    container["env"] = [*container.get("env", []), POD_IP]
    Api(cluster.argo_url, cluster.token)("POST", f"/api/v1/workflows/{NS}", json=request)


def test_every_pod_its_own_address(tmp_path: Path, clock: VirtualClock) -> None:
    runner = ScriptedRunner(default=Script(total_steps=100))
    with LocalCluster(nodes=2, cpus=1, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        for name in ("a", "b", "c", "d"):
            _submit(cluster, name)
        clock.advance(1)
        kube = Api(cluster.kube_url, cluster.token)
        pods = [pod_of(kube, n) for n in ("a", "b", "c", "d")]
        cidrs = {n.name: n.pod_cidr for n in cluster.nodes.nodes}
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 4 and "127.0.0.1" not in ips
    assert len(set(cidrs.values())) == 2
    for pod in pods:
        status = pod["status"]
        network = ipaddress.ip_network(cidrs[pod["spec"]["nodeName"]])
        assert ipaddress.ip_address(status["podIP"]) in network
        assert status["podIPs"] == [{"ip": status["podIP"]}]
        assert (status["hostIP"], status["hostIPs"]) == ("127.0.0.1", [{"ip": "127.0.0.1"}])
        assert runner.launched[pod["metadata"]["name"]].spec.env["POD_IP"] == status["podIP"]


def test_addresses_are_not_handed_out_again(tmp_path: Path) -> None:
    def one_pod(name: str, clock: VirtualClock) -> str:
        runner = ScriptedRunner(default=Script(total_steps=1))
        with LocalCluster(cpus=1, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
            _submit(cluster, name, cpu="1")
            for _ in range(3):
                clock.advance(1)
            pod = pod_of(Api(cluster.kube_url, cluster.token), name)
            assert pod["status"]["phase"] == "Succeeded"
            networks.add(cluster.nodes.nodes[0].network)
            return str(pod["status"]["podIP"])

    clock = VirtualClock()
    networks: set[int] = set()
    first, second = one_pod("a", clock), one_pod("b", clock)  # a restart between the two
    (network,) = networks  # the same state directory: the same network
    assert first == f"127.{network}.0.2" and second == f"127.{network}.0.3"


def test_allocation_skips_live_addresses_and_the_first(tmp_path: Path) -> None:
    node = make_nodes(2, 1, 2**30, network=254)[1]
    assert node.network == 1  # the networks wrap round after 127.254
    store = Store(tmp_path)
    assert address(node, 0) == "127.1.0.1" and address(node, 254) == "127.1.1.1"
    with socket.socket() as held:  # a socket anywhere on the host keeps its address taken
        held.bind(("127.1.0.3", 0))
        held.listen()
        assert "127.1.0.3" in host_addresses()
        assert allocate(store, node, {"127.1.0.2"}) == "127.1.0.4"
    store.counters[f"pod-address/{node.name}"] = 256 * 254 - 1  # the range wraps round
    assert allocate(store, node, set()) == "127.1.0.2"


PROGRAM = """
import os, socket, sys
s = socket.socket()
s.bind((os.environ["POD_IP"], 29400))
print("bound", os.environ["POD_IP"], flush=True)
"""


@pytest.mark.slow
def test_real_pods_bind_their_own_address(tmp_path: Path) -> None:
    with LocalCluster(cpus=2, state_dir=tmp_path / "state", isolation="shared") as cluster:
        for name in ("one", "two"):
            _submit(cluster, name, command=[sys.executable, "-c", PROGRAM])
        kube = Api(cluster.kube_url, cluster.token)

        def ended() -> bool:
            return all(
                pod_of(kube, n)["status"]["phase"] in ("Succeeded", "Failed")
                for n in ("one", "two")
            )

        cluster.wait_until(ended, timeout_s=30)
        for name in ("one", "two"):
            pod = pod_of(kube, name)
            log = kube("GET", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/log").text
            assert pod["status"]["phase"] == "Succeeded", log
            assert log.strip() == f"bound {pod['status']['podIP']}"
