"""Real local processes: progress file, PATH and cwd, CPU affinity and in-place resize, SIGTERM on
stop and SIGKILL after the grace period. Wall clock, short runs.

Each pod works in a hostPath volume (its ``workingDir``), so the test reads what it wrote from the
host folder: a pod's own file system is gone when it ends, as on Kubernetes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster

from .conftest import NS, Api, container_wf
from .outputs import out_dir, with_output

pytestmark = pytest.mark.slow

SCRIPT = """
import os, pathlib, signal, sys, time
total, mode = int(sys.argv[1]), sys.argv[2]
pathlib.Path("exe").write_text(sys.executable)
term = []
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else (lambda s, f: term.append(s)))
progress = pathlib.Path(os.environ["ARGO_PROGRESS_FILE"])
for step in range(total + 1):
    tmp = progress.with_name("progress.tmp")
    tmp.write_text(f"{step}/{total}\\n")
    os.replace(tmp, progress)
    pathlib.Path("cpus").write_text(",".join(map(str, sorted(os.sched_getaffinity(0)))))
    if term:
        pathlib.Path("got-sigterm").write_text("checkpointed at %d" % step)
        sys.exit(0)
    time.sleep(0.05)
"""


@pytest.fixture
def real(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        cpus=2, state_dir=tmp_path / "state", progress_tick_s=0.05, grace_s=1
    ) as cluster:
        yield cluster


def _submit(
    cluster: LocalCluster, name: str, total: int, mode: str = "trap", cpu: str = "1"
) -> Api:
    argo = Api(cluster.argo_url, cluster.token)
    request = container_wf(name, cpu=cpu, command=["python", "-c", SCRIPT, str(total), mode])
    assert (
        argo("POST", f"/api/v1/workflows/{NS}", json=with_output(request, name)).status_code == 200
    )
    return argo


def _phase(cluster: LocalCluster, name: str) -> str:
    wf = cluster.workflow(name) or {}
    return str(wf.get("status", {}).get("phase") or "")


def _workdir(cluster: LocalCluster, pod: str) -> Path:
    return cluster.state_dir / "pods" / NS / pod


def _progress(cluster: LocalCluster, name: str) -> int:
    wf: dict[str, Any] = cluster.workflow(name) or {}
    return int(wf.get("status", {}).get("progress", "0/1").split("/")[0])


def test_process_reports_progress_and_succeeds(real: LocalCluster) -> None:
    _submit(real, "ok", 10)
    real.wait_until(lambda: _phase(real, "ok") in ("Succeeded", "Failed"), timeout_s=60)
    wf = real.workflow("ok") or {}
    assert wf["status"]["phase"] == "Succeeded"
    assert wf["status"]["progress"] == "10/10"
    assert (_workdir(real, "ok") / "main.log").exists()
    assert Path((out_dir(real, "ok") / "exe").read_text()).parent == Path(sys.executable).parent


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 host CPUs to see affinity grow"
)
def test_resize_changes_the_affinity_of_the_running_process(real: LocalCluster) -> None:
    _submit(real, "pin", 400)
    real.wait_until(lambda: _progress(real, "pin") >= 2, timeout_s=60)
    cpus_file = out_dir(real, "pin") / "cpus"
    assert len(cpus_file.read_text().split(",")) == 1
    kube = Api(real.kube_url, real.token)
    body = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "2", "memory": "64Mi"},
                        "limits": {"cpu": "2", "memory": "64Mi"},
                    },
                }
            ]
        }
    }
    response = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/pin/resize",
        json=body,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert response.status_code == 200
    real.wait_until(lambda: len(cpus_file.read_text().split(",")) == 2, timeout_s=30)
    Api(real.argo_url, real.token)("PUT", f"/api/v1/workflows/{NS}/pin/terminate")
    real.wait_until(lambda: _phase(real, "pin") == "Failed", timeout_s=30)


def test_stop_sends_sigterm_to_the_process(real: LocalCluster) -> None:
    argo = _submit(real, "term", 2000)
    real.wait_until(lambda: _progress(real, "term") >= 3, timeout_s=60)
    assert argo("PUT", f"/api/v1/workflows/{NS}/term/stop").status_code == 200
    real.wait_until(lambda: _phase(real, "term") == "Failed", timeout_s=30)
    assert (out_dir(real, "term") / "got-sigterm").read_text().startswith("checkpointed at")
    wf = real.workflow("term") or {}
    assert wf["status"]["message"] == "Stopped with strategy 'Stop'"
    pod = real.pods("term")[0]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_sigkill_after_grace_period(real: LocalCluster) -> None:
    argo = _submit(real, "deaf", 2000, mode="ignore")
    real.wait_until(lambda: _progress(real, "deaf") >= 2, timeout_s=60)
    argo("PUT", f"/api/v1/workflows/{NS}/deaf/stop")
    real.wait_until(lambda: _phase(real, "deaf") == "Failed", timeout_s=30)
    pod = real.pods("deaf")[0]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert not (out_dir(real, "deaf") / "got-sigterm").exists()


def test_server_shutdown_lets_processes_checkpoint(tmp_path: Path) -> None:
    cluster = LocalCluster(cpus=2, state_dir=tmp_path / "state", progress_tick_s=0.05).start()
    _submit(cluster, "bye", 2000)
    cluster.wait_until(lambda: _progress(cluster, "bye") >= 2, timeout_s=60)
    cluster.stop()
    assert (out_dir(cluster, "bye") / "got-sigterm").exists()
    wf = cluster.workflow("bye") or {}
    assert wf["status"]["phase"] == "Failed"
    assert "the local cluster was shut down" in wf["status"]["message"]


def test_missing_program_exits_127_with_a_message(real: LocalCluster) -> None:
    argo = Api(real.argo_url, real.token)
    argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json=container_wf("nocmd", command=["no-such-program-here"]),
    )
    real.wait_until(lambda: _phase(real, "nocmd") == "Failed", timeout_s=60)
    assert (real.workflow("nocmd") or {})["status"]["message"] == "Error (exit code 127)"
    assert "no-such-program-here" in (_workdir(real, "nocmd") / "main.log").read_text()


ENV_DUMP = (
    "import json, os, pathlib; pathlib.Path('env.json').write_text(json.dumps(dict(os.environ)))"
)


def test_a_pod_sees_none_of_the_servers_secrets(
    real: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QOSFLOW_LOCAL_TOKEN", "s3cret-token")
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_DEFAULT", '{"password": "hunter2"}')
    argo = Api(real.argo_url, real.token)
    request = container_wf("env", command=["python", "-c", ENV_DUMP])
    request["workflow"]["spec"]["templates"][0]["container"]["env"] = [
        {"name": "MINE", "value": "declared"}
    ]
    assert (
        argo("POST", f"/api/v1/workflows/{NS}", json=with_output(request, "env")).status_code == 200
    )
    real.wait_until(lambda: _phase(real, "env") in ("Succeeded", "Failed"), timeout_s=60)
    assert _phase(real, "env") == "Succeeded"
    text = (out_dir(real, "env") / "env.json").read_text()
    assert "s3cret-token" not in text and "hunter2" not in text
    env = json.loads(text)
    assert "QOSFLOW_LOCAL_TOKEN" not in env and "AIRFLOW_CONN_QOSFLOW_DEFAULT" not in env
    assert env["MINE"] == "declared" and env["ARGO_POD_NAME"] == "env"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    allowed = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HOSTNAME", "MINE", "PWD", "LC_CTYPE"}
    assert {k for k in env if not k.startswith("ARGO_")} <= allowed
