"""Daemon steps (issue 18) as Argo v4 runs them: the group of a daemon ends once its pod is
Running and ready, ``{{steps.rendezvous.ip}}`` is its pod's address, the daemon is terminated
(and its node Succeeds) when the steps template ends, however it ends, and the workflow takes its
final phase once the daemon's pod is gone. Scripted pods on a virtual clock; the real processes
are in ``test_multipod.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
from qosflow.local.runner import PodLaunch
from qosflow.local.scripted import ScriptedProcess
from qosflow.local.workflow import fnv32a

from .conftest import NS, Api, argo_validator, errors_of, kube_validator
from .segments import assert_segment_tree, by_name, node_id, request, segment_spec

WORKFLOW = argo_validator("Workflow")
POD = kube_validator("Pod")
DAEMON = Script(total_steps=1, rate=lambda cpus: 0.0)
WORKER = Script(total_steps=3)


class Segment:
    """A cluster of two 1-CPU nodes whose rendezvous pods follow ``daemon`` (workers ``worker``)."""

    def __init__(self, tmp_path: Path, daemon: Script, worker: Script, grace_s: float = 30) -> None:
        def select(spec: PodLaunch) -> Script:
            return daemon if "-rendezvous-" in spec.pod else worker

        self.clock = VirtualClock()
        self.runner = ScriptedRunner(select=select)
        self.cluster = LocalCluster(
            nodes=2,
            cpus=1,
            state_dir=tmp_path / "state",
            clock=self.clock,
            runner=self.runner,
            grace_s=grace_s,
        )

    def __enter__(self) -> Segment:
        self.cluster.start()
        self.argo = Api(self.cluster.argo_url, self.cluster.token)
        self.kube = Api(self.cluster.kube_url, self.cluster.token)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    def submit(self, name: str = "seg", **options: Any) -> None:
        answer = self.argo(
            "POST", f"/api/v1/workflows/{NS}", json=request(name, segment_spec(**options))
        )
        assert answer.status_code == 200, answer.text

    def tick(self, count: int = 1) -> dict[str, Any]:
        for _ in range(count):
            self.clock.advance(1)
        return self.wf()

    def finish(self, name: str = "seg", limit: int = 20) -> dict[str, Any]:
        """Tick until the workflow ends (at most ``limit`` ticks)."""
        for _ in range(limit):
            self.tick()
            wf = self.wf(name)
            if wf["status"].get("phase") in ("Succeeded", "Failed", "Error"):
                return wf
        raise AssertionError(f"{name} did not end: {wf['status']}")

    def wf(self, name: str = "seg") -> dict[str, Any]:
        answer: dict[str, Any] = self.argo("GET", f"/api/v1/workflows/{NS}/{name}").json()
        return answer

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"]
        return {p["metadata"]["name"]: p for p in items}

    def daemon(self) -> ScriptedProcess:
        return next(p for n, p in self.runner.launched.items() if "-rendezvous-" in n)


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[Segment]:
    with Segment(tmp_path, DAEMON, WORKER) as segment:
        yield segment


def test_the_segment_runs_with_argos_tree(seg: Segment) -> None:
    seg.submit()
    wf = seg.tick()  # the daemon's pod starts; its first probe comes at the next tick
    assert by_name(wf)["seg[0].rendezvous"]["phase"] == "Pending"
    wf = seg.tick()
    nodes = by_name(wf)
    daemon = nodes["seg[0].rendezvous"]
    assert (daemon["phase"], daemon["daemoned"]) == ("Running", True)
    pods = seg.pods()
    daemon_pod = pods[f"seg-rendezvous-{fnv32a('seg[0].rendezvous')}"]
    assert daemon["podIP"] == daemon_pod["status"]["podIP"]
    assert nodes["seg[0]"]["phase"] == "Succeeded"  # a ready daemon fulfils its group
    wf = seg.tick()
    workers = [f"seg-worker-cpu-{fnv32a(f'seg[1].worker({i}:{i})(0)')}" for i in (0, 1)]
    pods = seg.pods()
    for rank, name in enumerate(workers):
        env = {e["name"]: e.get("value") for e in pods[name]["spec"]["containers"][0]["env"]}
        assert env["QOSFLOW_RDZV_ENDPOINT"] == f"{daemon['podIP']}:29400"
        assert env["QOSFLOW_RANK"] == str(rank)
        assert pods[name]["metadata"]["labels"]["qosflow.dev/rank"] == str(rank)
        assert pods[name]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert {pods[n]["spec"]["nodeName"] for n in workers} == {"qosflow-local-0", "qosflow-local-1"}
    wf = seg.finish()
    assert wf["status"]["phase"] == "Succeeded", wf["status"]
    assert errors_of(WORKFLOW, wf) == []
    nodes = by_name(wf)
    assert nodes["seg[0].rendezvous"]["phase"] == "Succeeded"
    assert "daemoned" not in nodes["seg[0].rendezvous"]
    assert seg.daemon().signals == ["SIGTERM"]
    assert_segment_tree(wf, "seg", progress="7/7")  # 1/1 daemon + 2 x 3/3
    assert all(errors_of(POD, p) == [] for p in seg.pods().values())


def test_the_daemon_group_waits_for_readiness(tmp_path: Path) -> None:
    with Segment(
        tmp_path, Script(total_steps=1, rate=lambda c: 0.0, ready_after_s=3), WORKER
    ) as seg:
        seg.submit()
        for _ in range(2):
            wf = seg.tick()
            daemon = by_name(wf)["seg[0].rendezvous"]
            assert daemon["phase"] == "Pending" and "daemoned" not in daemon
            assert "seg[1]" not in by_name(wf) and len(seg.pods()) == 1
            pod = next(iter(seg.pods().values()))
            assert pod["status"]["phase"] == "Running"
            assert pod["status"]["containerStatuses"][0]["ready"] is False
            ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
        wf = seg.tick(2)
        assert by_name(wf)["seg[0].rendezvous"]["daemoned"] is True
        assert len(seg.pods()) == 3


def test_a_daemon_that_dies_before_it_is_ready_fails_the_workflow(tmp_path: Path) -> None:
    dying = Script(
        total_steps=1, rate=lambda c: 0.0, ready_after_s=None, exit_at_s=1, exit_code_at=1
    )
    with Segment(tmp_path, dying, WORKER) as seg:
        seg.submit()
        wf = seg.tick(3)
    daemon_id = node_id("seg", "seg[0].rendezvous")
    assert wf["status"]["phase"] == "Failed"
    assert wf["status"]["message"] == f"child '{daemon_id}' failed"
    nodes = by_name(wf)
    assert nodes["seg[0]"]["phase"] == "Failed" and nodes["seg"]["phase"] == "Failed"
    assert "seg[1]" not in nodes


def test_a_daemon_that_dies_later_leaves_its_group_succeeded(tmp_path: Path) -> None:
    dying = Script(total_steps=1, rate=lambda c: 0.0, exit_at_s=2, exit_code_at=0)
    with Segment(tmp_path, dying, WORKER) as seg:
        seg.submit()
        wf = seg.tick(3)
        nodes = by_name(wf)
        assert nodes["seg[0].rendezvous"]["phase"] == "Failed"  # a daemon should never end
        assert "daemoned" not in nodes["seg[0].rendezvous"]
        assert nodes["seg[0]"]["phase"] == "Succeeded"
        wf = seg.tick(5)
    assert wf["status"]["phase"] == "Succeeded"  # the workers decide, as upstream


def test_a_failed_worker_fails_the_workflow_and_ends_the_daemon(tmp_path: Path) -> None:
    with Segment(tmp_path, DAEMON, Script(total_steps=3, fail_at_step=1)) as seg:
        seg.submit(retry={"limit": 1, "retryPolicy": "Always"})
        wf = seg.tick(8)
        nodes = by_name(wf)
        assert wf["status"]["phase"] == "Failed"
        first = node_id("seg", "seg[1].worker(0:0)")
        assert wf["status"]["message"] == f"child '{first}' failed"
        assert nodes["seg[1].worker(0:0)"]["phase"] == "Failed"
        assert [nodes[f"seg[1].worker(1:1)({i})"]["phase"] for i in (0, 1)] == ["Failed", "Failed"]
        assert nodes["seg[1]"]["message"] == f"child '{first}' failed"
        assert nodes["seg[0].rendezvous"]["phase"] == "Succeeded"
        assert seg.daemon().signals == ["SIGTERM"]
        assert all(p["status"]["phase"] in ("Succeeded", "Failed") for p in seg.pods().values())
        assert errors_of(WORKFLOW, wf) == []


def test_stop_ends_every_pod_daemon_included(seg: Segment) -> None:
    seg.submit()
    seg.tick(2)
    seg.argo("PUT", f"/api/v1/workflows/{NS}/seg/stop", json={})
    wf = seg.finish()
    assert wf["status"]["phase"] == "Failed"
    assert wf["status"]["message"] == "Stopped with strategy 'Stop'"
    nodes = by_name(wf)
    for rank in (0, 1):
        node = nodes[f"seg[1].worker({rank}:{rank})(0)"]
        assert (node["phase"], node["message"]) == (
            "Failed",
            "workflow shutdown with strategy:  Stop",
        )
    assert nodes["seg[0].rendezvous"]["phase"] == "Succeeded"  # as upstream's e2e test expects
    assert all(p["status"]["phase"] in ("Succeeded", "Failed") for p in seg.pods().values())
    assert all(p.signals[:1] == ["SIGTERM"] for p in seg.runner.launched.values())


def test_the_deadline_ends_the_daemon_too(seg: Segment) -> None:
    spec = segment_spec()
    spec["activeDeadlineSeconds"] = 2
    seg.argo("POST", f"/api/v1/workflows/{NS}", json=request("late", spec))
    wf = seg.finish("late")
    assert (wf["status"]["phase"], wf["status"]["message"]) == (
        "Failed",
        "Step exceeded its deadline",
    )
    assert seg.daemon().signals == ["SIGTERM"]


def test_the_workflow_ends_once_its_daemon_pod_is_gone(tmp_path: Path) -> None:
    stubborn = Script(total_steps=1, rate=lambda c: 0.0, term_exit_s=None)
    with Segment(tmp_path, stubborn, WORKER, grace_s=5) as seg:
        seg.submit()
        wf = seg.tick(6)
        assert by_name(wf)["seg"]["phase"] == "Succeeded"
        assert wf["status"]["phase"] == "Running"  # the daemon ignores SIGTERM for now
        wf = seg.tick(5)
    assert wf["status"]["phase"] == "Succeeded"
    assert seg.daemon().signals == ["SIGTERM", "SIGKILL"]


def test_daemon_and_probe_fields_have_their_go_types(seg: Segment) -> None:
    for path, value, go_type in (
        (("templates", 1, "daemon"), "yes", "bool"),
        (("templates", 1, "container", "readinessProbe", "periodSeconds"), "1s", "int32"),
        (("templates", 0, "steps", 1, 0, "withSequence"), "2", "struct"),
    ):
        spec = segment_spec()
        target: Any = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        answer = seg.argo("POST", f"/api/v1/workflows/{NS}", json=request("typed", spec))
        assert answer.status_code == 400
        assert answer.json()["message"].endswith(f"of type {go_type}")
