"""One broken object never stops the local cluster (issue 15, A): the controller fails that one
workflow (or the node that one pod) with a message and everything else moves on; a state file
with poisoned objects still starts, quarantining what it cannot serve."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock

from .conftest import NS, Api, container_wf

WORKFLOWS = f"/api/v1/workflows/{NS}"


def _phase(argo: Api, name: str) -> str:
    return str(argo("GET", f"{WORKFLOWS}/{name}").json()["status"].get("phase") or "")


def _run(clock: VirtualClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.advance(1)


def test_template_update_that_breaks_a_queued_workflow_fails_only_it(
    argo: Api, clock: VirtualClock
) -> None:
    spec = container_wf("x", steps=3)["workflow"]["spec"]
    spec["arguments"] = {"parameters": [{"name": "cpu", "value": "1"}]}
    spec["templates"][0]["container"].pop("resources")
    spec["podSpecPatch"] = (
        '{"containers": [{"name": "main", "resources": '
        '{"requests": {"cpu": "{{workflow.parameters.cpu}}"}}}]}'
    )
    created = argo(
        "POST",
        f"/api/v1/workflow-templates/{NS}",
        json={"template": {"metadata": {"name": "tp"}, "spec": spec}},
    ).json()
    ref = {"metadata": {"name": "victim"}, "spec": {"workflowTemplateRef": {"name": "tp"}}}
    assert argo("POST", WORKFLOWS, json={"workflow": ref}).status_code == 200
    spec["arguments"]["parameters"][0]["value"] = "abc"  # a valid template, a poisoned default
    created["spec"] = spec
    assert (
        argo("PUT", f"/api/v1/workflow-templates/{NS}/tp", json={"template": created}).status_code
        == 200
    )
    assert argo("POST", WORKFLOWS, json=container_wf("bystander", steps=3)).status_code == 200
    _run(clock, 6)
    victim = argo("GET", f"{WORKFLOWS}/victim").json()
    assert victim["status"]["phase"] in ("Failed", "Error")  # its pod could not be created
    assert "Error applying PodSpecPatch" in victim["status"]["message"]
    assert "quantities must match" in victim["status"]["message"]
    assert _phase(argo, "bystander") == "Succeeded"


def test_a_workflow_whose_stored_status_is_corrupt_fails_alone(
    cluster: LocalCluster, argo: Api, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    argo("POST", WORKFLOWS, json=container_wf("corrupt", steps=50))
    clock.advance(1)
    with cluster.store.lock:  # a bug or a hand edit left a node that is not an object
        wf = cluster.store.get("Workflow", NS, "corrupt")
        assert wf is not None
        wf["status"]["nodes"]["corrupt"] = "not a node"
    argo("POST", WORKFLOWS, json=container_wf("fine", steps=3))
    with caplog.at_level(logging.ERROR):
        _run(clock, 5)
    corrupt = argo("GET", f"{WORKFLOWS}/corrupt").json()
    assert corrupt["status"]["phase"] == "Error"
    assert "the local cluster could not run this workflow" in corrupt["status"]["message"]
    assert any("corrupt failed in the controller" in r.getMessage() for r in caplog.records)
    assert _phase(argo, "fine") == "Succeeded"
    pod = cluster.pods("corrupt")[0]  # its pod was stopped, not left running
    assert pod["status"]["phase"] in ("Succeeded", "Failed")


def test_a_pod_with_an_unreadable_quantity_fails_alone(
    cluster: LocalCluster, argo: Api, clock: VirtualClock
) -> None:
    argo("POST", WORKFLOWS, json=container_wf("poisoned", steps=50))
    clock.advance(1)
    with cluster.store.lock:
        pod = cluster.store.get("Pod", NS, "poisoned")
        assert pod is not None
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "abc"
    argo("POST", WORKFLOWS, json=container_wf("next", steps=3))
    _run(clock, 5)
    poisoned = argo("GET", f"{WORKFLOWS}/poisoned").json()
    assert poisoned["status"]["phase"] == "Failed"
    assert "the local cluster cannot run this pod" in poisoned["status"]["message"]
    assert _phase(argo, "next") == "Succeeded"


def _write_poisoned_state(state: Path) -> None:
    """A state file (of a real run) with poisoned objects added."""
    doc = json.loads((state / "state.json").read_text())
    good = next(r["object"] for r in doc["objects"] if r["object"]["metadata"]["name"] == "waiting")

    def clone(name: str, **meta: Any) -> dict[str, Any]:
        obj = json.loads(json.dumps(good))
        obj["metadata"].update(name=name, uid=f"uid-{name}", **meta)
        return obj

    bad_cpu = clone("bad-cpu")
    bad_cpu["spec"]["templates"][0]["container"]["resources"]["requests"]["cpu"] = "abc"
    escape = clone("state.json", namespace="..")
    bad_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "odd", "namespace": NS, "labels": {}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "abc"}}}]},
        "status": {"phase": "Pending"},
    }
    rows = [bad_cpu, escape, bad_pod, "garbage", {"kind": "Mystery", "metadata": {"name": "m"}}]
    start = max(r["order"] for r in doc["objects"])
    doc["objects"] += [{"order": start + i + 1, "object": o} for i, o in enumerate(rows)]
    doc["runtime"]["qosflow/ghost"] = "not a record"
    (state / "state.json").write_text(json.dumps(doc))


def test_a_poisoned_state_file_still_starts_and_quarantines(tmp_path: Path) -> None:
    clock, state = VirtualClock(), tmp_path / "state"
    with LocalCluster(cpus=1, state_dir=state, clock=clock, runner=ScriptedRunner()) as first:
        argo = Api(first.argo_url, first.token)
        argo("POST", WORKFLOWS, json=container_wf("waiting", steps=2))
    _write_poisoned_state(state)
    with LocalCluster(cpus=1, state_dir=state, clock=clock, runner=ScriptedRunner()) as second:
        argo = Api(second.argo_url, second.token)
        _run(clock, 4)
        assert _phase(argo, "waiting") == "Succeeded"
        bad = argo("GET", f"{WORKFLOWS}/bad-cpu").json()
        assert bad["status"]["phase"] == "Error"
        assert "templates.main.container.resources.requests.cpu" in bad["status"]["message"]
        names = [w["metadata"]["name"] for w in argo("GET", WORKFLOWS).json()["items"]]
        assert sorted(names) == ["bad-cpu", "waiting"]
        assert second.pods("odd") == [] and not (state / "pods" / NS / "odd").exists()
    quarantined = json.loads((state / "quarantine.json").read_text())
    reasons = [q["reason"] for q in quarantined]
    assert len(quarantined) == 4
    assert any("metadata.namespace" in r for r in reasons)
    assert any("quantities must match" in r for r in reasons)
    assert any("unknown kind 'Mystery'" in r for r in reasons)
    assert (state / "quarantine.json").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "state.json").exists()  # nothing escaped the state directory
    saved = json.loads((state / "state.json").read_text())
    assert all(r["object"]["metadata"].get("namespace") != ".." for r in saved["objects"])


def test_an_unreadable_state_file_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"objects": [ torn')
    with LocalCluster(state_dir=tmp_path, clock=VirtualClock(), runner=ScriptedRunner()) as c:
        argo = Api(c.argo_url, c.token)
        assert argo("GET", WORKFLOWS).status_code == 200
    aside = list(tmp_path.glob("state.json.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_text() == '{"objects": [ torn'


def test_stop_completes_even_when_the_settle_step_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    cluster = LocalCluster(
        state_dir=tmp_path, clock=clock, runner=ScriptedRunner(default=Script())
    ).start()
    Api(cluster.argo_url, cluster.token)("POST", WORKFLOWS, json=container_wf("w"))

    def broken(now: float) -> None:
        raise RuntimeError("settle failed")

    cluster.controller.settle = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        cluster.stop()
    assert "shutdown step failed" in caplog.text
    assert json.loads((tmp_path / "state.json").read_text())["objects"]
