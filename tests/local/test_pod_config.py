"""What a pod gets from its Workflow and the cluster's objects, on a virtual clock with scripted
pods: its environment (Secrets, ConfigMaps, the downward API, ``$(VAR)``), its volumes as host
folders, the scheduler's node selection and PersistentVolumeClaim check, and the Workflow fields
Argo applies (``podSpecPatch``, ``templateDefaults``, ``podMetadata``, the template merge)."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, ScriptedRunner, VirtualClock, sandbox
from qosflow.local.errors import LocalClusterError

from .conftest import NS, Api, container_wf, errors_of, kube_validator

WORKFLOWS = f"/api/v1/workflows/{NS}"
PODS = f"/api/v1/namespaces/{NS}/pods"


def put(cluster: LocalCluster, kind: str, name: str, **fields: Any) -> None:
    """Store a ConfigMap, Secret or PersistentVolumeClaim as the Kubernetes API would."""
    with cluster.store.lock:
        obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": NS}}
        cluster.store.put({**obj, **fields})


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _main(request: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = request["workflow"]["spec"]["templates"][0]["container"]
    return container


def _submit(argo: Api, request: dict[str, Any]) -> None:
    response = argo("POST", WORKFLOWS, json=request)
    assert response.status_code == 200, response.text


def _node(argo: Api, name: str) -> dict[str, Any]:
    node: dict[str, Any] = argo("GET", f"{WORKFLOWS}/{name}").json()["status"]["nodes"][name]
    return node


def test_the_environment_comes_from_secrets_config_maps_and_the_downward_api(
    cluster: LocalCluster, argo: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    put(cluster, "ConfigMap", "settings", data={"LR": "0.1", "MODE": "fast", "bad=key": "x"})
    put(cluster, "Secret", "creds", data={"TOKEN": b64("s3cret")})
    request = container_wf("env", cpu="1500m")
    container = _main(request)
    container["args"] = ["--token=$(TOKEN)", "$$(TOKEN)", "$(UNKNOWN)"]
    container["envFrom"] = [
        {"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
        {"secretRef": {"name": "creds"}},
        {"configMapRef": {"name": "absent", "optional": True}},
        {"configMapRef": {"name": "settings"}},
    ]
    container["env"] = [
        {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LR"}}},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}},
        {
            "name": "OPT",
            "valueFrom": {"secretKeyRef": {"name": "no", "key": "x", "optional": True}},
        },
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "JOB",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['qosflow.dev/job']"}},
        },
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {
            "name": "MEM_MI",
            "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}},
        },
        {"name": "URL", "value": "http://$(POD):$(LR)/$$(LR)/$(LATER)"},
        {"name": "MODE", "value": "slow"},
        {"name": "LATER", "value": "defined after URL"},
    ]
    _submit(argo, request)
    clock.advance(1)
    launched = runner.launched["env"].spec
    env = dict(launched.env)
    assert {k: env.get(k) for k in ("CFG_LR", "CFG_MODE", "TOKEN", "LR", "KEY")} == {
        "CFG_LR": "0.1",
        "CFG_MODE": "fast",
        "TOKEN": "s3cret",
        "LR": "0.1",
        "KEY": "s3cret",
    }
    assert "CFG_bad=key" not in env and "bad=key" not in env and "OPT" not in env
    assert env["MODE"] == "slow"  # env wins over envFrom
    assert (env["POD"], env["JOB"], env["NODE"]) == ("env", "env", "qosflow-local")
    assert env["CPUS"] == "2" and env["MEM_MI"] == "64"  # 1500m rounds up to 2 cores
    assert env["URL"] == "http://env:0.1/$(LR)/$(LATER)"  # only earlier variables expand
    assert env["ARGO_PROGRESS_FILE"] == "/var/run/argo/progress"
    assert launched.argv[-3:] == ("--token=s3cret", "$(TOKEN)", "$(UNKNOWN)")


def test_a_missing_secret_keeps_the_container_from_starting_until_it_exists(
    cluster: LocalCluster, argo: Api, kube: Api, clock: VirtualClock
) -> None:
    request = container_wf("wait", steps=2)
    ref = {"name": "creds", "key": "TOKEN"}
    _main(request)["env"].append({"name": "TOKEN", "valueFrom": {"secretKeyRef": ref}})
    _submit(argo, request)
    clock.advance(1)
    pod = kube("GET", f"{PODS}/wait").json()
    assert pod["status"]["phase"] == "Pending" and pod["spec"]["nodeName"] == "qosflow-local"
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "creds" not found',
    }
    assert errors_of(kube_validator("Pod"), pod) == []
    node = _node(argo, "wait")
    assert node["phase"] == "Pending"
    assert node["message"] == 'CreateContainerConfigError: secret "creds" not found'
    put(cluster, "Secret", "creds", data={"OTHER": b64("x")})
    clock.advance(1)
    assert _node(argo, "wait")["message"] == (
        f"CreateContainerConfigError: couldn't find key TOKEN in Secret {NS}/creds"
    )
    put(cluster, "Secret", "creds", data={"TOKEN": b64("t")})
    for _ in range(4):
        clock.advance(1)
    assert argo("GET", f"{WORKFLOWS}/wait").json()["status"]["phase"] == "Succeeded"


def test_a_waiting_pod_holds_its_cpus_on_the_node(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    request = container_wf("holder", cpu="2")
    _main(request)["envFrom"] = [{"configMapRef": {"name": "missing"}}]
    _submit(argo, request)
    clock.advance(1)
    _submit(argo, container_wf("next", cpu="1"))
    clock.advance(1)
    pod = kube("GET", f"{PODS}/next").json()
    assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]
    assert "1 Insufficient cpu" in _node(argo, "next")["message"]


def test_volumes_are_host_folders_under_the_state_directory(
    cluster: LocalCluster, argo: Api, kube: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    put(cluster, "PersistentVolumeClaim", "ckpt", spec={})
    put(cluster, "ConfigMap", "cfg", data={"a.yaml": "a: 1", "b.txt": "b"})
    put(cluster, "Secret", "sec", data={"key": b64("k3y")})
    request = container_wf("vols", steps=3)
    request["workflow"]["spec"]["volumes"] = [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}},
        {"name": "share", "nfs": {"server": "nfs.example", "path": "/exports/x"}},
        {"name": "host", "hostPath": {"path": "/data/../etc/host"}},
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "cfg",
            "configMap": {"name": "cfg", "items": [{"key": "a.yaml", "path": "conf/a.yaml"}]},
        },
        {"name": "sec", "secret": {"secretName": "sec"}},
        {"name": "unused", "emptyDir": {}},
    ]
    _main(request)["volumeMounts"] = [
        {"name": "ckpt", "mountPath": "/ckpt"},
        {"name": "ckpt", "mountPath": "/ckpt-ro", "readOnly": True, "subPath": "run1"},
        {"name": "share", "mountPath": "/share"},
        {"name": "host", "mountPath": "/host"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "cfg", "mountPath": "/etc/app"},
        {"name": "sec", "mountPath": "/secrets"},
    ]
    _submit(argo, request)
    clock.advance(1)
    pod = kube("GET", f"{PODS}/vols").json()
    names = [v["name"] for v in pod["spec"]["volumes"]]
    assert names == ["var-run-argo", "ckpt", "share", "host", "scratch", "cfg", "sec"]
    state, workdir = cluster.state_dir.resolve(), cluster.state_dir.resolve() / "pods" / NS / "vols"
    mounts = {m.path: (m.host, m.read_only) for m in runner.launched["vols"].spec.mounts}
    assert mounts == {
        "/ckpt": (state / "volumes" / NS / "pvc" / "ckpt", False),
        "/ckpt-ro": (state / "volumes" / NS / "pvc" / "ckpt" / "run1", True),
        "/share": (state / "volumes" / "nfs" / "nfs.example" / "exports" / "x", False),
        "/host": (state / "volumes" / "hostpath" / "etc" / "host", False),
        "/scratch": (workdir / "volumes" / "scratch", False),
        "/etc/app": (workdir / "volumes" / "cfg", True),
        "/secrets": (workdir / "volumes" / "sec", True),
        "/var/run/argo": (workdir / "argo", False),
    }
    assert sorted(p.name for p in (workdir / "volumes" / "cfg").rglob("*")) == ["a.yaml", "conf"]
    assert (workdir / "volumes" / "cfg" / "conf" / "a.yaml").read_text() == "a: 1"
    assert (workdir / "volumes" / "sec" / "key").read_text() == "k3y"
    (state / "volumes" / NS / "pvc" / "ckpt" / "kept").write_text("checkpoint")
    for _ in range(4):
        clock.advance(1)
    assert argo("GET", f"{WORKFLOWS}/vols").json()["status"]["phase"] == "Succeeded"
    assert not (workdir / "volumes").exists()  # emptyDir, configMap, secret: gone with the pod
    assert (state / "volumes" / NS / "pvc" / "ckpt" / "kept").read_text() == "checkpoint"
    assert (workdir / "argo" / "progress").exists()  # the node still reads the last progress


def test_a_missing_config_map_volume_keeps_the_container_creating(
    cluster: LocalCluster, argo: Api, clock: VirtualClock
) -> None:
    request = container_wf("cm", steps=2)
    request["workflow"]["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "settings"}},
        {"name": "maybe", "secret": {"secretName": "maybe", "optional": True}},
    ]
    _main(request)["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/cfg"},
        {"name": "maybe", "mountPath": "/maybe"},
    ]
    _submit(argo, request)
    clock.advance(1)
    assert _node(argo, "cm")["message"] == (
        'ContainerCreating: MountVolume.SetUp failed for volume "cfg" : configmap "settings" '
        "not found"
    )
    put(cluster, "ConfigMap", "settings", data={"k": "v"})
    for _ in range(4):
        clock.advance(1)
    assert argo("GET", f"{WORKFLOWS}/cm").json()["status"]["phase"] == "Succeeded"


def test_a_missing_claim_keeps_the_pod_unschedulable(
    cluster: LocalCluster, argo: Api, kube: Api, clock: VirtualClock
) -> None:
    request = container_wf("claim", steps=2)
    request["workflow"]["spec"]["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    ]
    _main(request)["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    _submit(argo, request)
    clock.advance(1)
    pod = kube("GET", f"{PODS}/claim").json()
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    message = '0/1 nodes are available: persistentvolumeclaim "data" not found.'
    assert (scheduled["reason"], scheduled["message"]) == ("Unschedulable", message)
    assert _node(argo, "claim")["message"] == f"Unschedulable: {message}"
    put(cluster, "PersistentVolumeClaim", "data", spec={}, status={"phase": "Pending"})
    clock.advance(1)
    assert "unbound immediate PersistentVolumeClaims" in _node(argo, "claim")["message"]
    put(cluster, "PersistentVolumeClaim", "data", spec={}, status={"phase": "Bound"})
    for _ in range(4):
        clock.advance(1)
    assert argo("GET", f"{WORKFLOWS}/claim").json()["status"]["phase"] == "Succeeded"


def test_volume_mistakes_fail_where_argo_and_kubernetes_fail_them(
    argo: Api, clock: VirtualClock
) -> None:
    undeclared = container_wf("undeclared")
    _main(undeclared)["volumeMounts"] = [{"name": "nope", "mountPath": "/x"}]
    patched = container_wf("patched")
    mount = {"name": "main", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}
    patched["workflow"]["spec"]["podSpecPatch"] = json.dumps({"containers": [mount]})
    exotic = container_wf("exotic")
    exotic["workflow"]["spec"]["volumes"] = [
        {"name": "ebs", "awsElasticBlockStore": {"volumeID": "v"}}
    ]
    _main(exotic)["volumeMounts"] = [{"name": "ebs", "mountPath": "/ebs"}]
    escaping = container_wf("escaping")
    escaping["workflow"]["spec"]["volumes"] = [{"name": "../../x", "emptyDir": {}}]
    _main(escaping)["volumeMounts"] = [{"name": "../../x", "mountPath": "/x"}]
    for request in (undeclared, patched, exotic, escaping):
        _submit(argo, request)
    clock.advance(1)
    assert _node(argo, "undeclared")["phase"] == "Error"
    assert _node(argo, "undeclared")["message"] == "volume 'nope' not found in workflow spec"
    assert _node(argo, "patched")["phase"] == "Error"
    assert (
        'spec.containers[0].volumeMounts[0].name: Not found: "nope"'
        in _node(argo, "patched")["message"]
    )
    assert _node(argo, "escaping")["phase"] == "Error"
    assert 'spec.volumes[1].name: Invalid value: "../../x"' in _node(argo, "escaping")["message"]
    failed = _node(argo, "exotic")
    assert failed["phase"] == "Failed"
    assert "awsElasticBlockStore" in failed["message"] and "cannot provide it" in failed["message"]


def test_node_selection_keeps_a_pod_that_matches_no_node_pending(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    away = container_wf("away")
    away["workflow"]["spec"]["nodeSelector"] = {"qosflow.dev/pool": "gpu"}
    here = container_wf("here", steps=2)
    spec = here["workflow"]["spec"]
    spec["nodeSelector"] = {"qosflow.dev/pool": "gpu"}  # the template's selection wins
    term = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [term]}]
        }
    }
    spec["templates"][0]["nodeSelector"] = {"kubernetes.io/hostname": "qosflow-local"}
    spec["templates"][0]["affinity"] = {"nodeAffinity": affinity}
    spec["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec["imagePullSecrets"] = [{"name": "registry"}]
    spec["podMetadata"] = {"labels": {"team": "ml"}, "annotations": {"note": "from podMetadata"}}
    spec["templates"][0]["metadata"] = {"labels": {"team": "ml-train"}}
    _submit(argo, away)
    _submit(argo, here)
    clock.advance(1)
    message = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    assert _node(argo, "away")["message"] == f"Unschedulable: {message}"
    assert kube("GET", f"{PODS}/away").json()["status"]["phase"] == "Pending"
    pod = kube("GET", f"{PODS}/here").json()
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "qosflow-local"}
    assert pod["spec"]["affinity"] == {"nodeAffinity": affinity}
    assert pod["spec"]["tolerations"] == spec["tolerations"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["metadata"]["labels"]["team"] == "ml-train"  # the template's over podMetadata
    assert pod["metadata"]["annotations"]["note"] == "from podMetadata"
    assert errors_of(kube_validator("Pod"), pod) == []


def test_pod_spec_patches_set_the_resources_the_node_accounts(
    argo: Api, kube: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    big = container_wf("big", cpu="1", steps=50)
    spec = big["workflow"]["spec"]
    spec["arguments"] = {"parameters": [{"name": "units", "value": "2"}]}
    spec["podSpecPatch"] = json.dumps(  # the workflow's first, then the template's
        {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "128Mi"},
                        "limits": {"cpu": "1", "memory": "128Mi"},
                    },
                }
            ]
        }
    )
    spec["templates"][0]["podSpecPatch"] = (
        "containers:\n- name: main\n  resources:\n"
        "    requests: {cpu: '{{workflow.parameters.units}}'}\n"
        "    limits: {cpu: '{{workflow.parameters.units}}'}\n"
    )
    _submit(argo, big)
    clock.advance(1)
    pod = kube("GET", f"{PODS}/big").json()
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "2", "memory": "128Mi"},
        "limits": {"cpu": "2", "memory": "128Mi"},
    }
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert runner.launched["big"].cpus == 2
    _submit(argo, container_wf("small", cpu="1"))
    clock.advance(1)
    assert "1 Insufficient cpu" in _node(argo, "small")["message"]


def test_a_workflow_is_merged_over_its_template_and_defaults_into_its_templates(
    argo: Api, kube: Api, clock: VirtualClock, runner: ScriptedRunner
) -> None:
    base = container_wf("x", steps=2)["workflow"]["spec"]
    base["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    base["templateDefaults"] = {"container": {"env": [{"name": "FROM", "value": "template"}]}}
    template = {"template": {"metadata": {"name": "tp"}, "spec": base}}
    assert argo("POST", f"/api/v1/workflow-templates/{NS}", json=template).status_code == 200
    request = {
        "workflow": {
            "metadata": {"name": "merged"},
            "spec": {
                "workflowTemplateRef": {"name": "tp"},
                "volumes": [{"name": "extra", "emptyDir": {}}],
                "templateDefaults": {
                    "container": {
                        "env": [
                            {"name": "FROM", "value": "workflow"},
                            {"name": "MORE", "value": "1"},
                        ],
                        "volumeMounts": [
                            {"name": "scratch", "mountPath": "/scratch"},
                            {"name": "extra", "mountPath": "/extra"},
                        ],
                    }
                },
            },
        }
    }
    _submit(argo, request)
    clock.advance(1)
    pod = kube("GET", f"{PODS}/merged").json()
    main = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env == {"QOSFLOW_TOTAL_STEPS": "2", "FROM": "workflow", "MORE": "1"}
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/scratch", "/extra", "/var/run/argo"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["var-run-argo", "scratch", "extra"]
    own = {
        "workflow": {
            "metadata": {"name": "own"},
            "spec": {**request["workflow"]["spec"], "templates": base["templates"]},
        }
    }
    response = argo("POST", WORKFLOWS, json=own)
    assert response.status_code == 400
    assert response.json()["message"] == (
        "Templates is invalid field in spec if workflow referred WorkflowTemplate reference"
    )


def test_a_scripted_cluster_reports_shared_isolation(tmp_path: Path) -> None:
    with LocalCluster(state_dir=tmp_path, clock=VirtualClock(), runner=ScriptedRunner()) as c:
        assert c.isolation == "shared"  # scripted pods run nothing, so nothing is isolated


def test_a_host_without_private_file_systems_falls_back_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox, "probe", lambda state_dir: "unshare: Operation not permitted")
    with caplog.at_level(logging.WARNING):
        cluster = LocalCluster(state_dir=tmp_path / "auto", clock=VirtualClock(), cpu_weights=False)
    assert cluster.isolation == "shared"
    assert "SHARE this host's file system" in caplog.text and "not permitted" in caplog.text
    with pytest.raises(LocalClusterError, match="private pod file systems do not work here"):
        LocalCluster(state_dir=tmp_path / "strict", isolation="private", cpu_weights=False)
    with pytest.raises(LocalClusterError, match="isolation: must be one of"):
        LocalCluster(state_dir=tmp_path / "typo", isolation="privat", cpu_weights=False)
