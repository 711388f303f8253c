"""A trainer pod's usage lines reach the watch through ``pods/log``, as on Kubernetes (issue 13)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qosflow.core.usage import usage_in_log
from qosflow.local import LocalCluster
from qosflow.local.cgroups import CpuWeights, shares_for, weight_for
from qosflow_argo import ArgoCluster

from .conftest import NS, Api, container_wf

pytestmark = pytest.mark.slow

SMALL = {"QOSFLOW_WIDTH": "64", "QOSFLOW_DEPTH": "1", "QOSFLOW_INPUT_DIM": "16"}


def test_a_trainer_pod_reports_usage_in_its_log_and_the_client_reads_it(tmp_path: Path) -> None:
    with LocalCluster(cpus=2, state_dir=tmp_path / "state", progress_tick_s=0.1) as cluster:
        argo, kube = Api(cluster.argo_url, cluster.token), Api(cluster.kube_url, cluster.token)
        body = container_wf("usage", command=[sys.executable, "-m", "qosflow_trainer"], steps=0)
        container = body["workflow"]["spec"]["templates"][0]["container"]
        container["env"] = [
            {"name": k, "value": v}
            for k, v in {
                **SMALL,
                "QOSFLOW_TOTAL_STEPS": "100000",
                "QOSFLOW_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
                "QOSFLOW_CHECKPOINT_EVERY": "0",
                "QOSFLOW_USAGE_INTERVAL": "0.3",
            }.items()
        ]
        assert argo("POST", f"/api/v1/workflows/{NS}", json=body).status_code == 200
        client = ArgoCluster.from_local(cluster)
        pod = cluster.wait_until(
            lambda: [p for p in cluster.pods("usage") if p["spec"].get("nodeName")]
        )
        name = pod[0]["metadata"]["name"]
        reports = cluster.wait_until(lambda: len(client.usage(name)) >= 3 and client.usage(name))
        assert all(r.cpus == 1 and r.wall_s > 0 and 0 < (r.share or 0) <= 1 for r in reports)
        assert reports == sorted(reports, key=lambda r: r.t)
        # the endpoint itself: tailLines as the kubelet reads it, the log as text
        one = kube("GET", f"/api/v1/namespaces/{NS}/pods/{name}/log", params={"tailLines": "1"})
        assert one.status_code == 200 and one.headers["Content-Type"].startswith("text/plain")
        assert len(one.text.splitlines()) == 1
        bad = kube("GET", f"/api/v1/namespaces/{NS}/pods/{name}/log", params={"tailLines": "x"})
        assert bad.status_code == 400 and "tailLines" in bad.json()["message"]
        wrong = kube(
            "GET", f"/api/v1/namespaces/{NS}/pods/{name}/log", params={"container": "wait"}
        )
        assert wrong.status_code == 400
        assert client.usage("no-such-pod") == []
        if cluster.weighted:  # pods sit in cgroups weighted by their CPU request, as on a node
            assert cluster.weights is not None
            group = cluster.weights.node / f"{NS}_{name}"
            assert group.is_dir()
            knob = "cpu.weight" if cluster.weights.v2 else "cpu.shares"
            want = weight_for(shares_for(1000)) if cluster.weights.v2 else shares_for(1000)
            assert int((group / knob).read_text()) == want
        assert argo("PUT", f"/api/v1/workflows/{NS}/usage/terminate").status_code == 200


def test_usage_lines_parse_whatever_else_the_log_holds() -> None:
    text = "\n".join(
        [
            "plain text from the user's loop",
            '{"event": "step", "step": 3}',
            '{"event": "usage", "t": 10.0, "wall_s": 2.0, "cpu_s": 3.0, "wait_s": 1.0, '
            '"cpus": 2, "steps": 40}',
            '{"event": "usage", "t": "x"}',
            '{"event": "usage", "t": 12.0, "wall_s": 0, "cpu_s": 1, "wait_s": 0, "cpus": 2, "st',
        ]
    )
    (report,) = usage_in_log(text)
    assert (report.share, report.start, report.steps) == (0.75, 8.0, 40)


def test_cpu_weights_follow_the_kubelet_formulas(tmp_path: Path) -> None:
    assert shares_for(1000) == 1024 and shares_for(0) == 2 and shares_for(250) == 256
    assert weight_for(2) == 1 and weight_for(1024) == 39 and weight_for(262144) == 10000
    root = tmp_path / "cgroup"
    (root / "cpu").mkdir(parents=True)
    weights = CpuWeights.detect("node", 2, root=root)  # a v1 tree the test owns
    assert weights is not None and not weights.v2
    procs = weights.pod("ns/pod-a", 2000)
    assert procs is not None and procs.name == "cgroup.procs"
    assert (weights.node / "ns_pod-a" / "cpu.shares").read_text() == "2048"
    weights.resize("ns/pod-a", 1000)
    assert (weights.node / "ns_pod-a" / "cpu.shares").read_text() == "1024"
    assert int((weights.node / "cpu.shares").read_text()) > 2048  # the node outweighs the host
    for f in (weights.node / "ns_pod-a").iterdir():
        f.unlink()  # a real cgroupfs has no files to remove; a test tree has
    weights.release("ns/pod-a")
    assert not (weights.node / "ns_pod-a").exists()
