"""Fault injection (error answers, dropped connections, slow answers) and persistence across a
restart of the local cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from qosflow.local import FaultPlan, FaultRule, LocalCluster, Script, ScriptedRunner, VirtualClock

from .conftest import NS, Api, container_wf


@pytest.mark.parametrize(("status", "code"), [(500, 13), (503, 14), (429, 8)])
def test_injected_status_uses_each_listeners_error_format(
    tmp_path: Path, status: int, code: int
) -> None:
    faults = FaultPlan().add(
        FaultRule("status", method="GET", path=r"/workflows/", status=status, retry_after=2)
    )
    faults.add(
        FaultRule("status", method="GET", path=r"/api/v1/nodes", status=status, listener="kube")
    )
    with LocalCluster(
        state_dir=tmp_path, clock=VirtualClock(), runner=ScriptedRunner(), faults=faults
    ) as cluster:
        argo, kube = Api(cluster.argo_url, cluster.token), Api(cluster.argo_url, cluster.token)
        kube = Api(cluster.kube_url, cluster.token)
        first = argo("GET", f"/api/v1/workflows/{NS}/x")
        assert first.status_code == status and first.json()["code"] == code
        assert first.headers["Retry-After"] == "2"
        assert argo("GET", f"/api/v1/workflows/{NS}/x").status_code == 404  # count used up
        node = kube("GET", "/api/v1/nodes")
        assert (
            node.status_code == status
            and node.json()["kind"] == "Status"
            and node.json()["code"] == status
        )
        assert faults.fired == [1, 1]


def test_dropped_connection_before_and_after_handling(tmp_path: Path) -> None:
    faults = FaultPlan()
    with LocalCluster(
        state_dir=tmp_path, clock=VirtualClock(), runner=ScriptedRunner(), faults=faults
    ) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        faults.add(FaultRule("drop", method="POST", path=r"/workflows/"))
        with pytest.raises(requests.ConnectionError):
            argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("lost"))
        assert argo("GET", f"/api/v1/workflows/{NS}/lost").status_code == 404  # never stored
        faults.add(FaultRule("drop_after", method="POST", path=r"/workflows/"))
        with pytest.raises(requests.ConnectionError):
            argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("kept"))
        assert argo("GET", f"/api/v1/workflows/{NS}/kept").status_code == 200  # stored, answer lost
        again = argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("kept"))
        assert again.status_code == 409  # a blind retry cannot create a duplicate


def test_delay_fault_waits_before_answering(tmp_path: Path) -> None:
    waits: list[float] = []
    faults = FaultPlan(sleep=waits.append).add(
        FaultRule("delay", path="/api/v1/version", delay_s=0.3)
    )
    with LocalCluster(
        state_dir=tmp_path, clock=VirtualClock(), runner=ScriptedRunner(), faults=faults
    ) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        assert argo("GET", "/api/v1/version").status_code == 200
        assert argo("GET", "/api/v1/version").status_code == 200
        assert waits == [0.3]  # once (count 1), then answered normally


def test_restart_keeps_records_and_fails_pods_of_the_dead_server(tmp_path: Path) -> None:
    clock = VirtualClock()
    first = LocalCluster(cpus=1, state_dir=tmp_path, clock=clock, runner=ScriptedRunner()).start()
    argo = Api(first.argo_url, first.token)
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("done", steps=2))
    for _ in range(4):
        clock.advance(1)
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("running", steps=100))
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("queued", steps=3))
    for _ in range(3):
        clock.advance(1)
    first._argo.stop()  # type: ignore[union-attr]  # a crash: no clean shutdown of the pods
    first._kube.stop()  # type: ignore[union-attr]
    first.clock.unsubscribe(first._on_advance)  # type: ignore[attr-defined]
    state = json.loads((tmp_path / "state.json").read_text())
    assert {
        o["object"]["metadata"]["name"]
        for o in state["objects"]
        if o["object"]["kind"] == "Workflow"
    } == {"done", "running", "queued"}
    with LocalCluster(cpus=1, state_dir=tmp_path, clock=clock, runner=ScriptedRunner()) as second:
        argo = Api(second.argo_url, second.token)
        assert argo("GET", f"/api/v1/workflows/{NS}/done").json()["status"]["phase"] == "Succeeded"
        running = argo("GET", f"/api/v1/workflows/{NS}/running").json()
        assert running["status"]["phase"] == "Failed"
        assert (
            "the local cluster restarted while this pod was running" in running["status"]["message"]
        )
        for _ in range(6):
            clock.advance(1)
        assert (
            argo("GET", f"/api/v1/workflows/{NS}/queued").json()["status"]["phase"] == "Succeeded"
        )


def test_state_file_is_never_torn(tmp_path: Path) -> None:
    clock = VirtualClock()
    with LocalCluster(
        state_dir=tmp_path, clock=clock, runner=ScriptedRunner(default=Script())
    ) as cluster:
        argo = Api(cluster.argo_url, cluster.token)
        for index in range(5):
            argo("POST", f"/api/v1/workflows/{NS}", json=container_wf(f"w-{index}"))
            clock.advance(1)
            json.loads((tmp_path / "state.json").read_text())  # always a complete document
        assert not list(tmp_path.glob(".state.json.*"))


def test_restart_replans_template_workflows_with_template_defaults(tmp_path: Path) -> None:
    clock = VirtualClock()
    spec = container_wf("x")["workflow"]["spec"]
    spec["arguments"] = {
        "parameters": [{"name": "cpu", "value": "2"}, {"name": "tag", "value": "t"}]
    }
    spec["templates"][0]["container"].pop("resources")
    spec["podSpecPatch"] = (  # quantities are parameterised through podSpecPatch, as in Argo
        '{"containers": [{"name": "main", "resources": '
        '{"requests": {"cpu": "{{workflow.parameters.cpu}}"}}}]}'
    )
    spec["templates"][0]["container"]["args"] = ["{{workflow.parameters.tag}}"]
    first = LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=ScriptedRunner()).start()
    argo = Api(first.argo_url, first.token)
    argo(
        "POST",
        f"/api/v1/workflow-templates/{NS}",
        json={"template": {"metadata": {"name": "tp"}, "spec": spec}},
    )
    for name in ("tp-1", "tp-2"):  # each needs both CPUs: tp-2 queues behind tp-1
        request = {
            "workflow": {
                "metadata": {"name": name},
                "spec": {
                    "workflowTemplateRef": {"name": "tp"},
                    "arguments": {"parameters": [{"name": "tag", "value": name}]},
                },
            }
        }
        assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 200
    clock.advance(1)
    first.stop()
    with LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=ScriptedRunner()) as second:
        argo = Api(second.argo_url, second.token)
        for _ in range(15):
            clock.advance(1)
        queued = argo("GET", f"/api/v1/workflows/{NS}/tp-2").json()
        assert queued["status"]["phase"] == "Succeeded"
        assert second.pods("tp-2")[0]["spec"]["containers"][0]["args"] == ["tp-2"]
