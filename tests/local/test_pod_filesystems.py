"""Pod file systems with real processes (issue 17): what a pod writes outside its volumes dies
with it, its volumes are the host folders the next pods see, its working directory and the local
cluster's state are its own business, and the fallback without mount namespaces still sends
volume paths to the volumes' host folders. Wall clock, short runs."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster

from .conftest import NS, Api

pytestmark = pytest.mark.slow
CLAIM = "work"
CHECKS = """
import json, os, pathlib, sys
problems = []
for path, want in json.loads(sys.argv[1]).items():
    p = pathlib.Path(path)
    if want == "absent" and p.exists():
        problems.append(f"{path} exists")
    elif want == "empty" and p.exists() and any(p.iterdir()):
        problems.append(f"{path} is not empty: {sorted(os.listdir(p))}")
    elif want not in ("absent", "empty") and not (p.exists() and p.read_text() == want):
        problems.append(f"{path} does not hold {want!r}")
for path, text in json.loads(sys.argv[2]).items():
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(text)
print("\\n".join(problems), file=sys.stderr)
sys.exit(1 if problems else 0)
"""


def check(expect: dict[str, str], write: dict[str, str] | None = None) -> dict[str, Any]:
    """A container that checks files (``absent``, ``empty`` or their text), then writes some."""
    command = ["python", "-c", CHECKS, json.dumps(expect), json.dumps(write or {})]
    return {"image": "ignored", "command": command}


def workflow(name: str, *steps: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A Workflow running ``steps`` (containers) one after the other, with the claim mounted."""
    templates = [{"name": f"s{i}", "container": c} for i, c in enumerate(steps)]
    if len(steps) > 1:
        order = [[{"name": f"s{i}", "template": f"s{i}"}] for i in range(len(steps))]
        templates.insert(0, {"name": "main", "steps": order})
    volumes = [
        {"name": "work", "persistentVolumeClaim": {"claimName": CLAIM}},
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts = [{"name": "work", "mountPath": "/work"}, {"name": "scratch", "mountPath": "/scratch"}]
    body = {
        "entrypoint": "main" if len(steps) > 1 else "s0",
        "templates": templates,
        "volumes": volumes,
        "templateDefaults": {"container": {"volumeMounts": mounts}},
        **spec,
    }
    return {"workflow": {"metadata": {"name": name}, "spec": body}}


def _run(cluster: LocalCluster, request: dict[str, Any]) -> dict[str, Any]:
    argo = Api(cluster.argo_url, cluster.token)
    response = argo("POST", f"/api/v1/workflows/{NS}", json=request)
    assert response.status_code == 200, response.text
    name = request["workflow"]["metadata"]["name"]

    def done() -> dict[str, Any] | None:
        wf = cluster.workflow(name) or {}
        return wf if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error") else None

    finished: dict[str, Any] = cluster.wait_until(done, timeout_s=60)
    return finished


def _logs(cluster: LocalCluster, name: str) -> str:
    return "\n".join(
        (cluster.state_dir / "pods" / NS / p["metadata"]["name"] / "main.log").read_text()
        for p in cluster.pods(name)
        if (cluster.state_dir / "pods" / NS / p["metadata"]["name"] / "main.log").exists()
    )


def _succeeded(cluster: LocalCluster, request: dict[str, Any]) -> None:
    wf = _run(cluster, request)
    name = request["workflow"]["metadata"]["name"]
    assert wf["status"]["phase"] == "Succeeded", _logs(cluster, name)


def _claim(cluster: LocalCluster) -> Path:
    with cluster.store.lock:
        meta = {"name": CLAIM, "namespace": NS}
        cluster.store.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta})
    return cluster.state_dir.resolve() / "volumes" / NS / "pvc" / CLAIM


@pytest.fixture
def private(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(cpus=2, state_dir=tmp_path / "state", progress_tick_s=0.05) as cluster:
        if cluster.isolation != "private":
            pytest.skip("this host cannot give pods private file systems (isolation 'shared')")
        yield cluster


def test_files_outside_the_volumes_die_with_the_pod_and_the_claim_keeps_its_files(
    private: LocalCluster,
) -> None:
    claim = _claim(private)
    marker = f"/tmp/qosflow-test-{uuid.uuid4().hex}"
    writes = {marker: "leak", "/etc/qosflow-leak": "leak", "/work/ckpt/step": "7"}
    after = {marker: "absent", "/etc/qosflow-leak": "absent", "/work/ckpt/step": "7"}
    _succeeded(private, workflow("same", check({}, writes), check(after)))
    _succeeded(private, workflow("other", check(after)))
    assert not Path(marker).exists() and not Path("/etc/qosflow-leak").exists()  # not the host's
    assert (claim / "ckpt" / "step").read_text() == "7"
    pods = private.state_dir / "pods" / NS
    assert not any(pods.glob("*/rootfs"))  # the container layers went with the pods


def test_an_empty_dir_belongs_to_one_pod(private: LocalCluster) -> None:
    _claim(private)
    first = check({"/scratch": "empty"}, {"/scratch/mine": "1"})
    _succeeded(private, workflow("scratch", first, check({"/scratch": "empty"})))
    assert not any((private.state_dir / "pods" / NS).glob("*/volumes"))


def test_a_pod_works_in_its_own_directory_and_cannot_see_the_cluster(
    private: LocalCluster,
) -> None:
    _claim(private)
    state = str(private.state_dir.resolve())
    script = (
        "import os, pathlib, sys\n"
        "assert os.getcwd() == sys.argv[1], os.getcwd()\n"
        "assert os.listdir(sys.argv[2]) == [], os.listdir(sys.argv[2])\n"
        "progress = pathlib.Path(os.environ['ARGO_PROGRESS_FILE'])\n"
        "assert str(progress) == '/var/run/argo/progress', progress\n"
        "progress.write_text('3/4\\n')\n"
        "try:\n"
        "    pathlib.Path('/ro/nope').write_text('x')\n"
        "    sys.exit('a read-only volume took a write')\n"
        "except OSError as exc:\n"
        "    assert exc.errno == 30, exc\n"  # EROFS
        "pathlib.Path('here').write_text('cwd')\n"
    )
    default_dir = {"image": "i", "command": ["python", "-c", script, "/", state]}
    own_dir = {
        "image": "i",
        "command": ["python", "-c", script, "/home/app", state],
        "workingDir": "/home/app",
        "volumeMounts": [{"name": "work", "mountPath": "/ro", "readOnly": True}],
    }
    default_dir["volumeMounts"] = own_dir["volumeMounts"]
    _succeeded(private, workflow("cwd", default_dir, own_dir))
    assert not Path("/here").exists() and not Path("/home/app/here").exists()
    wf = private.workflow("cwd") or {}
    assert wf["status"]["progress"] == "8/8"  # each pod's progress file was read (then M/M)


def test_config_map_and_secret_volumes_hold_their_keys_read_only(private: LocalCluster) -> None:
    _claim(private)
    with private.store.lock:
        meta = {"name": "app", "namespace": NS}
        private.store.put(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"lr": "0.1"}}
        )
        secret = {"token": base64.b64encode(b"s3cret").decode()}
        private.store.put({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": secret})
    step = check({"/etc/app/lr": "0.1", "/run/secrets/app/token": "s3cret"})
    request = workflow("objects", step)
    request["workflow"]["spec"]["volumes"] += [
        {"name": "cfg", "configMap": {"name": "app"}},
        {"name": "sec", "secret": {"secretName": "app"}},
    ]
    step["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/etc/app"},
        {"name": "sec", "mountPath": "/run/secrets/app"},
    ]
    _succeeded(private, request)
    refused = check({}, {"/etc/app/lr": "changed"})
    refused["volumeMounts"] = step["volumeMounts"]
    denied = workflow("ro-objects", refused)
    denied["workflow"]["spec"]["volumes"] = request["workflow"]["spec"]["volumes"]
    assert _run(private, denied)["status"]["phase"] == "Failed"
    assert "Read-only file system" in _logs(private, "ro-objects")


def test_without_mount_namespaces_volume_paths_are_rewritten_to_host_folders(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with LocalCluster(cpus=2, state_dir=state, progress_tick_s=0.05, isolation="shared") as cluster:
        assert cluster.isolation == "shared"
        claim = _claim(cluster)
        script = (
            "import os, pathlib, sys\n"
            "pathlib.Path(sys.argv[1]).parent.mkdir(parents=True, exist_ok=True)\n"
            "pathlib.Path(sys.argv[1]).write_text('from args')\n"
            "pathlib.Path(os.environ['OUT']).write_text('from env')\n"
            "pathlib.Path(sys.argv[2].split('=', 1)[1]).write_text('from an option')\n"
            "pathlib.Path('relative').write_text('private cwd')\n"
        )
        writer = {
            "image": "i",
            "command": ["python", "-c", script, "/work/run/a", "--out=/work/run/c"],
            "env": [{"name": "OUT", "value": "/work/run/b"}],
        }
        _succeeded(cluster, workflow("shared", writer, check({"/work/run/b": "from env"})))
        assert (claim / "run" / "a").read_text() == "from args"
        assert (claim / "run" / "b").read_text() == "from env"
        assert (claim / "run" / "c").read_text() == "from an option"
        assert not (Path.cwd() / "relative").exists()
        wf = cluster.workflow("shared") or {}
        assert wf["status"]["progress"] == "2/2"
