"""A multi-pod segment of real processes (issue 18): a rendezvous daemon (a tiny socket server on
``$POD_IP:29400``, not torch) and two workers on two nodes that connect to
``{{steps.rendezvous.ip}}:29400``; the daemon is ready once its readiness probe passes
(``tcpSocket``, ``exec`` in the pod's own view, ``httpGet``), and is terminated with SIGTERM when
the steps end, whether they succeed, fail or are stopped."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster
from qosflow.local.workflow import fnv32a

from .conftest import NS, Api, argo_validator, errors_of
from .segments import RDZV_PORT, assert_segment_tree, by_name, node_id, request, segment_spec

pytestmark = pytest.mark.slow
WORKFLOW = argo_validator("Workflow")
DAEMON = f"""
import os, signal, socket, sys
def stop(*_):
    print("terminated", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
server = socket.socket()
server.bind((os.environ["POD_IP"], {RDZV_PORT}))
server.listen(8)
print("listening", os.environ["POD_IP"], flush=True)
while True:
    client, _ = server.accept()
    client.sendall(b"hello")
    client.close()
"""
WORKER = """
import os, socket, sys, time
host, port = os.environ["QOSFLOW_RDZV_ENDPOINT"].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=10) as conn:
    got = conn.recv(5).decode()
rank = os.environ["QOSFLOW_RANK"]
print(f"rank {rank} of {os.environ['POD_IP']} reached {host}: {got}", flush=True)
if os.environ.get("FAIL_RANK") == rank:
    sys.exit(3)
if os.environ.get("LINGER"):
    time.sleep(600)
"""
DONE = ("Succeeded", "Failed", "Error")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=2, cpus=1, state_dir=tmp_path / "state", grace_s=5) as local:
        yield local


def _segment(cluster: LocalCluster, name: str, **env: str) -> dict[str, Any]:
    spec = segment_spec(
        daemon_command=[sys.executable, "-c", DAEMON],
        worker_command=[sys.executable, "-c", WORKER],
    )
    worker = spec["templates"][2]["container"]
    worker["env"] += [{"name": k, "value": v} for k, v in env.items()]
    return spec


def _submit(cluster: LocalCluster, name: str, spec: dict[str, Any]) -> Api:
    argo = Api(cluster.argo_url, cluster.token)
    answer = argo("POST", f"/api/v1/workflows/{NS}", json=request(name, spec))
    assert answer.status_code == 200, answer.text
    return argo


def _wait(cluster: LocalCluster, name: str, timeout_s: float = 60) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        wf = cluster.workflow(name)
        return wf if wf and wf["status"].get("phase") in DONE else None

    result: dict[str, Any] = cluster.wait_until(ended, timeout_s=timeout_s)
    return result


def _log(cluster: LocalCluster, pod: str) -> str:
    return Api(cluster.kube_url, cluster.token)(
        "GET", f"/api/v1/namespaces/{NS}/pods/{pod}/log"
    ).text


def _pods(cluster: LocalCluster, name: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.pods(name)}


def test_a_segment_of_real_processes(cluster: LocalCluster) -> None:
    _submit(cluster, "seg", _segment(cluster, "seg"))
    wf = _wait(cluster, "seg")
    assert wf["status"]["phase"] == "Succeeded", wf["status"]
    assert errors_of(WORKFLOW, wf) == []
    assert_segment_tree(wf, "seg", progress="3/3")
    pods = _pods(cluster, "seg")
    daemon = pods[f"seg-rendezvous-{fnv32a('seg[0].rendezvous')}"]
    ip = daemon["status"]["podIP"]
    assert _log(cluster, daemon["metadata"]["name"]).split() == ["listening", ip, "terminated"]
    assert by_name(wf)["seg[0].rendezvous"]["podIP"] == ip
    assert by_name(wf)["seg[0].rendezvous"]["phase"] == "Succeeded"
    workers = [pods[f"seg-worker-cpu-{fnv32a(f'seg[1].worker({r}:{r})(0)')}"] for r in (0, 1)]
    assert {w["spec"]["nodeName"] for w in workers} == {"qosflow-local-0", "qosflow-local-1"}
    for rank, worker in enumerate(workers):
        own = worker["status"]["podIP"]
        line = f"rank {rank} of {own} reached {ip}: hello"
        assert _log(cluster, worker["metadata"]["name"]).strip() == line
    assert len({p["status"]["podIP"] for p in pods.values()}) == 3
    assert all(p["status"]["phase"] in DONE for p in pods.values())


def test_a_failed_worker_fails_the_segment_and_ends_the_daemon(cluster: LocalCluster) -> None:
    _submit(cluster, "bad", _segment(cluster, "bad", FAIL_RANK="1"))
    wf = _wait(cluster, "bad")
    assert wf["status"]["phase"] == "Failed"
    assert wf["status"]["message"] == f"child '{node_id('bad', 'bad[1].worker(1:1)')}' failed"
    nodes = by_name(wf)
    assert nodes["bad[1].worker(1:1)(0)"]["message"] == "Error (exit code 3)"
    assert nodes["bad[0].rendezvous"]["phase"] == "Succeeded"
    pods = _pods(cluster, "bad")
    assert all(p["status"]["phase"] in DONE for p in pods.values())
    daemon = next(n for n in pods if "-rendezvous-" in n)
    assert _log(cluster, daemon).split()[-1] == "terminated"


def test_stop_ends_every_pod(cluster: LocalCluster) -> None:
    argo = _submit(cluster, "halt", _segment(cluster, "halt", LINGER="1"))

    def workers_run() -> bool:
        pods = cluster.pods("halt")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return len(running) == 3

    cluster.wait_until(workers_run, timeout_s=30)
    argo("PUT", f"/api/v1/workflows/{NS}/halt/stop", json={})
    wf = _wait(cluster, "halt", timeout_s=30)
    assert (wf["status"]["phase"], wf["status"]["message"]) == (
        "Failed",
        "Stopped with strategy 'Stop'",
    )
    assert by_name(wf)["halt[0].rendezvous"]["phase"] == "Succeeded"
    assert all(p["status"]["phase"] in DONE for p in cluster.pods("halt"))


EXEC_DAEMON = """
import os, time
open(f"/tmp/qosflow-ready-{os.environ['HOSTNAME']}", "w").close()
time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["exec", "httpGet"])
def test_exec_and_http_readiness_probes(cluster: LocalCluster, kind: str) -> None:
    if kind == "exec":
        command = [sys.executable, "-c", EXEC_DAEMON]
        probe: dict[str, Any] = {
            "exec": {"command": ["sh", "-c", "test -f /tmp/qosflow-ready-$HOSTNAME"]},
            "periodSeconds": 1,
        }
    else:
        command = ["sh", "-c", f"exec python -m http.server --bind $POD_IP {RDZV_PORT}"]
        probe = {"httpGet": {"path": "/", "port": RDZV_PORT}, "periodSeconds": 1}
    spec = segment_spec(pods=1, daemon_command=command, probe=probe)
    _submit(cluster, "probed", spec)
    wf = _wait(cluster, "probed")
    assert wf["status"]["phase"] == "Succeeded", wf["status"]
    assert by_name(wf)["probed[0].rendezvous"]["podIP"].startswith("127.")
    if kind == "exec" and cluster.isolation == "private":  # the file was in the pod's own /tmp
        daemon = next(p for p in cluster.pods("probed") if "-rendezvous-" in p["metadata"]["name"])
        assert not Path(f"/tmp/qosflow-ready-{daemon['metadata']['name']}").exists()
