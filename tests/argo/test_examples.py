"""The example job specs render to the committed segment Workflows (golden files), schema-valid.

Each ``examples/*.yaml`` job spec is loaded with a fixed submission time and the example
connection's defaults, and segment 0 at its smallest size is rendered as ``ArgoCluster.submit``
would send it. ``examples/rendered/<name>.workflow.yaml`` must equal it; set
``QOSFLOW_REGENERATE=1`` to rewrite them (never in CI: the test fails there instead).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from qosflow.core.pod import PodDefaults
from qosflow.core.spec import load_job
from qosflow_argo import manifests
from qosflow_argo.contract import check_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RENDERED = EXAMPLES / "rendered"
NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)
DEFAULTS = PodDefaults(
    image="registry.example.com/ml/qosflow-trainer:0.1.0", checkpoint_claim="qosflow-checkpoints"
)
JOBS = sorted(p for p in EXAMPLES.glob("*.yaml") if "total_steps" in p.read_text())
HEADER = "# Rendered from examples/{name}.yaml by tests/argo/test_examples.py; do not edit.\n"


def render(path: Path) -> str:
    spec = load_job(yaml.safe_load(path.read_text()), now=NOW, defaults=DEFAULTS)
    gpu = "amd.com/gpu" if "amd" in path.name else manifests.GPU_RESOURCE
    doc = manifests.workflow(
        manifests.first_segment(spec, f"{spec.name}-0a1b2c"),
        namespace="ml",
        now=NOW.timestamp(),
        gpu_resource=gpu,
    )
    check_manifest(doc)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
    return HEADER.format(name=path.stem) + body


def test_there_are_examples() -> None:
    assert {p.stem for p in JOBS} >= {"ctr-nightly", "ranking-retrain", "gpu-finetune"}


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_example_renders_its_committed_workflow(path: Path) -> None:
    text = render(path)
    golden = RENDERED / f"{path.stem}.workflow.yaml"
    if os.environ.get("QOSFLOW_REGENERATE") == "1" and not os.environ.get("CI"):
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"{golden} missing: run QOSFLOW_REGENERATE=1 pytest {__file__}"
    assert golden.read_text(encoding="utf-8") == text, f"{golden} is stale (QOSFLOW_REGENERATE=1)"


def test_the_team_example_carries_every_pod_setting_to_the_workflow() -> None:
    doc = yaml.safe_load((RENDERED / "ranking-retrain.workflow.yaml").read_text())
    spec = doc["spec"]
    container = spec["templateDefaults"]["container"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/data",
        "/etc/ranking",
        "/checkpoints",  # the checkpoint volume, mounted by qosflow itself
    ]
    assert [e["name"] for e in container["env"]] == ["WANDB_MODE", "WANDB_API_KEY"]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert spec["imagePullSecrets"] == [{"name": "registry-ranking"}]
    assert spec["nodeSelector"] == {"pool": "training"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert spec["podMetadata"] == {
        "labels": {"team": "ranking"},
        "annotations": {"example.com/owner": "ranking@example.com"},
    }
    args = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert args["checkpoint_dir"] == "/checkpoints/ranking-retrain-0a1b2c"
    assert args["image"] == container["image"] == "registry.example.com/ranking/trainer:2026.11"


def test_a_job_without_a_checkpoint_gets_the_connections_claim() -> None:
    doc = yaml.safe_load((RENDERED / "ctr-nightly.workflow.yaml").read_text())
    assert doc["spec"]["volumes"] == [
        {
            "name": "qosflow-checkpoints",
            "persistentVolumeClaim": {"claimName": "qosflow-checkpoints"},
        }
    ]
    assert doc["spec"]["templateDefaults"]["container"]["image"] == DEFAULTS.image
    gpu = yaml.safe_load((RENDERED / "gpu-finetune.workflow.yaml").read_text())
    assert gpu["spec"]["entrypoint"] == "train-gpu"
    mounts = gpu["spec"]["templateDefaults"]["container"]["volumeMounts"]
    assert mounts[-1] == {"name": "checkpoints", "mountPath": "/var/lib/qosflow/checkpoints"}


def test_sixteen_gpus_on_eight_gpu_nodes_render_as_two_pods_of_eight() -> None:
    doc = yaml.safe_load((RENDERED / "ddp-gpu-pretrain.workflow.yaml").read_text())
    args = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    assert doc["spec"]["entrypoint"] == "train-workers-gpu"
    assert (args["pods"], args["units"], args["nproc"]) == ("2", "8", "8")
    assert doc["metadata"]["annotations"]["qosflow.dev/units"] == "16"
    template = manifests.workflow_template()
    steps = next(t for t in template["spec"]["templates"] if t["name"] == "train-workers-gpu")
    (rendezvous,), (workers,) = steps["steps"]
    assert rendezvous["template"] == "rendezvous"
    assert workers["withSequence"] == {"count": "{{workflow.parameters.pods}}"}
    daemon = next(t for t in template["spec"]["templates"] if t["name"] == "rendezvous")
    assert daemon["daemon"] is True and daemon["container"]["readinessProbe"]["tcpSocket"]
