"""The reference trainer as a pod of the rendered ``qosflow-train`` WorkflowTemplate: progress,
stop -> checkpoint -> resubmit with resume -> exactly the requested total steps.

The checkpoints live on a PersistentVolumeClaim the Workflow mounts (``spec.volumes`` and
``templateDefaults.container.volumeMounts``): a pod's own file system does not outlive it, so a
checkpoint written anywhere else would be lost, as on Kubernetes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qosflow.local import LocalCluster

from .conftest import NS, Api

pytestmark = pytest.mark.slow
TEMPLATES = Path(__file__).resolve().parents[2] / "argo_templates"


def install(cluster: LocalCluster) -> None:
    """``kubectl apply`` of the committed PriorityClasses and WorkflowTemplate, over HTTP."""
    kube, argo = Api(cluster.kube_url, cluster.token), Api(cluster.argo_url, cluster.token)
    for doc in yaml.safe_load_all((TEMPLATES / "priority-classes.yaml").read_text()):
        assert (
            kube("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", json=doc).status_code == 201
        )
    template = yaml.safe_load((TEMPLATES / "workflow-template.yaml").read_text())
    assert (
        argo("POST", f"/api/v1/workflow-templates/{NS}", json={"template": template}).status_code
        == 200
    )


CLAIM = "qosflow-checkpoints"
MOUNT = "/var/lib/qosflow/checkpoints"


def create_claim(cluster: LocalCluster) -> Path:
    """The checkpoint claim, over HTTP; returns its folder on the host."""
    kube = Api(cluster.kube_url, cluster.token)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    response = kube("POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json=claim)
    assert response.status_code == 201, response.text
    return cluster.state_dir.resolve() / "volumes" / NS / "pvc" / CLAIM


def segment(name: str, checkpoints: str, *, steps: int, segment: int) -> dict[str, object]:
    params = {
        "job": "e2e",
        "segment": str(segment),
        "steps": str(steps),
        "units": "1",
        "memory": "256Mi",
        "checkpoint_dir": checkpoints,
        "checkpoint_every": "5",
        "resume": "auto",
    }
    return {
        "workflow": {
            "metadata": {"name": name, "labels": {"qosflow.dev/job": "e2e"}},
            "spec": {
                "workflowTemplateRef": {"name": "qosflow-train"},
                "arguments": {"parameters": [{"name": k, "value": v} for k, v in params.items()]},
                "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}],
                "templateDefaults": {
                    "container": {"volumeMounts": [{"name": "checkpoints", "mountPath": MOUNT}]}
                },
            },
        }
    }


@pytest.mark.skipif(
    not (TEMPLATES / "workflow-template.yaml").exists(), reason="templates not rendered"
)
def test_trainer_stop_then_resume_finishes_exactly(tmp_path: Path) -> None:
    checkpoints = f"{MOUNT}/e2e"
    with LocalCluster(cpus=2, state_dir=tmp_path / "state", progress_tick_s=0.1) as cluster:
        install(cluster)
        claim = create_claim(cluster)
        argo = Api(cluster.argo_url, cluster.token)
        assert (
            argo(
                "POST",
                f"/api/v1/workflows/{NS}",
                json=segment("e2e-s0", checkpoints, steps=20, segment=0),
            ).status_code
            == 200
        )

        def done_steps(name: str) -> int:
            wf = cluster.workflow(name) or {}
            return int((wf.get("status", {}).get("progress") or "0/1").split("/")[0])

        cluster.wait_until(lambda: done_steps("e2e-s0") >= 6, timeout_s=120)
        pod = cluster.pods("e2e-s0")[0]
        assert pod["metadata"]["name"].startswith("e2e-s0-train-cpu-")
        assert (
            pod["spec"]["priorityClassName"] == "qosflow-normal"
            and pod["spec"]["priority"] == 20000
        )
        assert argo("PUT", f"/api/v1/workflows/{NS}/e2e-s0/stop").status_code == 200
        cluster.wait_until(
            lambda: (cluster.workflow("e2e-s0") or {})["status"].get("phase") == "Failed",
            timeout_s=90,
        )
        stopped = cluster.workflow("e2e-s0") or {}
        assert stopped["status"]["message"] == "Stopped with strategy 'Stop'"
        assert (
            len(stopped["status"]["nodes"]) == 2
        )  # the Retry node and one attempt: no retry after a stop
        assert (
            argo(
                "POST",
                f"/api/v1/workflows/{NS}",
                json=segment("e2e-s1", checkpoints, steps=20, segment=1),
            ).status_code
            == 200
        )
        cluster.wait_until(
            lambda: (
                (cluster.workflow("e2e-s1") or {})["status"].get("phase") in ("Succeeded", "Failed")
            ),
            timeout_s=180,
        )
        finished = cluster.workflow("e2e-s1") or {}
        assert finished["status"]["phase"] == "Succeeded"
        assert finished["status"]["progress"] == "20/20"
        assert json.loads((claim / "e2e" / "result.json").read_text())["steps"] == 20
        pod = cluster.pods("e2e-s1")[0]
        assert {"name": "checkpoints", "mountPath": MOUNT} in pod["spec"]["containers"][0][
            "volumeMounts"
        ]
        log = Api(cluster.kube_url, cluster.token)(
            "GET", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/log"
        ).text
        events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        resumed = [e for e in events if e.get("event") == "resume"]
        assert resumed and resumed[0]["step"] >= 5  # segment 1 went on from segment 0's checkpoint
