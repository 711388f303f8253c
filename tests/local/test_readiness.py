"""Readiness probes (issue 18) as the kubelet runs them: the first probe after
``initialDelaySeconds``, then one every ``periodSeconds``; ready after ``successThreshold``
passes, not ready again after ``failureThreshold`` failures in a row. Argo does not look back: a
daemon that was ready stays daemoned, and a non-daemon step runs whether it is ready or not.
Scripted pods on a virtual clock, their probe answers scripted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
from qosflow.local.probes import ProbeAction, probe_action

from .conftest import NS, Api, container_wf, pod_of
from .segments import by_name, request, segment_spec


class Answers:
    """A scripted probe: answers ``True``/``False`` in turn (the last one forever); logs calls."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[float, ProbeAction]] = []
        self.clock: VirtualClock | None = None

    def __call__(self, action: ProbeAction) -> bool:
        self.calls.append((self.clock.now() if self.clock else 0.0, action))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[LocalCluster, VirtualClock, ScriptedRunner]]:
    clock = VirtualClock()
    runner = ScriptedRunner(default=Script(total_steps=1, rate=lambda c: 0.0))
    with LocalCluster(cpus=2, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        yield cluster, clock, runner


def _probed(name: str, probe: dict[str, Any]) -> dict[str, Any]:
    wf = container_wf(name, cpu="0")
    wf["workflow"]["spec"]["templates"][0]["container"]["readinessProbe"] = probe
    return wf


def _ready(cluster: LocalCluster, name: str) -> bool:
    pod = pod_of(Api(cluster.kube_url, cluster.token), name)
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"] == "True") is pod["status"]["containerStatuses"][0]["ready"]
    return bool(pod["status"]["containerStatuses"][0]["ready"])


def test_probe_timing_and_thresholds(
    setup: tuple[LocalCluster, VirtualClock, ScriptedRunner],
) -> None:
    cluster, clock, runner = setup
    probe = {
        "tcpSocket": {"port": "rdzv"},
        "initialDelaySeconds": 2,
        "periodSeconds": 3,
        "successThreshold": 2,
        "failureThreshold": 2,
    }
    wf = _probed("probed", probe)
    wf["workflow"]["spec"]["templates"][0]["container"]["ports"] = [
        {"name": "rdzv", "containerPort": 29400}
    ]
    Api(cluster.argo_url, cluster.token)("POST", f"/api/v1/workflows/{NS}", json=wf)
    answers = Answers(True, True, False, False, True)
    answers.clock = clock
    clock.advance(1)  # the pod starts at t=1
    runner.launched["probed"].probe = answers  # type: ignore[method-assign]
    seen = []
    for _ in range(16):
        clock.advance(1)
        seen.append(_ready(cluster, "probed"))
    started = clock.now() - 16
    assert [t - started for t, _ in answers.calls] == [2, 5, 8, 11, 14]
    assert answers.calls[0][1].port == 29400  # the named port
    assert (
        answers.calls[0][1].host
        == pod_of(Api(cluster.kube_url, cluster.token), "probed")["status"]["podIP"]
    )
    # passes at +2 and +5 (ready at +5), fails at +8 and +11 (not ready at +11), passes at +14
    assert seen[3] is False and seen[4] is True and seen[9] is True and seen[10] is False
    assert seen[12] is False  # one pass is not enough again


def test_a_step_runs_whether_ready_or_not(
    setup: tuple[LocalCluster, VirtualClock, ScriptedRunner],
) -> None:
    cluster, clock, runner = setup
    Api(cluster.argo_url, cluster.token)(
        "POST", f"/api/v1/workflows/{NS}", json=_probed("plain", {"exec": {"command": ["false"]}})
    )
    clock.advance(1)
    runner.launched["plain"].probe = Answers(False)  # type: ignore[method-assign]
    clock.advance(1)
    assert not _ready(cluster, "plain")
    assert cluster.workflow("plain")["status"]["nodes"]["plain"]["phase"] == "Running"  # type: ignore[index]


def test_a_daemon_that_was_ready_stays_daemoned(tmp_path: Path) -> None:
    clock = VirtualClock()
    runner = ScriptedRunner(default=Script(total_steps=1, rate=lambda c: 0.0))
    with LocalCluster(nodes=2, cpus=1, state_dir=tmp_path, clock=clock, runner=runner) as cluster:
        spec = segment_spec(pods=1)
        Api(cluster.argo_url, cluster.token)(
            "POST", f"/api/v1/workflows/{NS}", json=request("d", spec)
        )
        clock.advance(1)
        clock.advance(1)  # started, then probed: ready
        daemon = next(name for name in runner.launched if "-rendezvous-" in name)
        runner.launched[daemon].probe = Answers(False)  # type: ignore[method-assign]
        for _ in range(4):
            clock.advance(1)
        node = by_name(cluster.workflow("d"))["d[0].rendezvous"]  # type: ignore[arg-type]
    assert node["phase"] == "Running" and node["daemoned"] is True


def test_probe_actions_from_the_spec() -> None:
    container = {"ports": [{"name": "http", "containerPort": 8080}]}
    http = probe_action(
        {
            "httpGet": {
                "port": "http",
                "path": "/ready",
                "scheme": "https",
                "httpHeaders": [{"name": "X", "value": "1"}],
            },
            "timeoutSeconds": 3,
        },
        container,
        "127.9.0.2",
    )
    assert (http.kind, http.host, http.port, http.path, http.scheme) == (
        "httpGet",
        "127.9.0.2",
        8080,
        "/ready",
        "HTTPS",
    )
    assert (http.headers, http.timeout_s) == ((("X", "1"),), 3.0)
    assert probe_action({"tcpSocket": {"port": "nope"}}, container, "127.9.0.2").port == 0
    assert probe_action({"grpc": {"port": 1}}, container, "127.9.0.2").kind == "unsupported"
    assert probe_action({"exec": {"command": ["true"]}}, container, "x").command == ("true",)
