"""Pod settings and the checkpoint volume in a job spec: what loads, what is refused and why."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from qosflow.core.errors import SpecError
from qosflow.core.pod import (
    DEFAULT_CHECKPOINT_PATH,
    DEFAULT_CHECKPOINT_VOLUME,
    Checkpoint,
    PodDefaults,
    checkpoint_problem,
)
from qosflow.core.spec import load_job

NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)
CLAIM = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "retrain-ckpt"}}


def job(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "retrain",
        "total_steps": 1000,
        "deadline": "PT4H",
        "resources": {"unit": "cpu", "min": 1, "max": 4},
        "image": "registry.example/team/trainer:1.4",
        "pod": {"volumes": [CLAIM]},
        "checkpoint": {"volume": "ckpt", "path": "/checkpoints"},
    }
    base.update(over)
    return base


def refused(data: dict[str, Any], defaults: PodDefaults | None = None) -> SpecError:
    with pytest.raises(SpecError) as err:
        load_job(data, now=NOW, defaults=defaults)
    return err.value


def test_a_teams_pod_settings_load_as_written() -> None:
    pod = {
        "image_pull_policy": "IfNotPresent",
        "image_pull_secrets": ["regcred", {"name": "mirror"}],
        "env": [
            {"name": "WANDB_MODE", "value": "offline"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ],
        "env_from": [{"secretRef": {"name": "s3-credentials"}}],
        "volumes": [CLAIM, {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
        "volume_mounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "node_selector": {"pool": "training"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account_name": "trainer",
        "labels": {"team": "ranking"},
        "annotations": {"example.com/owner": "ranking@example.com"},
    }
    spec = load_job(job(pod=pod), now=NOW)
    assert spec.image == "registry.example/team/trainer:1.4"
    assert spec.pod.image_pull_secrets == ("regcred", "mirror")
    assert [e["name"] for e in spec.pod.env] == ["WANDB_MODE", "HF_TOKEN"]
    assert spec.pod.volume("data") == pod["volumes"][1]
    assert spec.pod.tolerations == tuple(pod["tolerations"])
    assert spec.checkpoint == Checkpoint("ckpt", "/checkpoints")
    assert spec.checkpoint.folder("retrain-x1") == "/checkpoints/retrain-x1"
    # the spec's own form loads back into the same settings (XCom carries it so)
    again = load_job(job(pod=spec.pod.to_spec()), now=NOW)
    assert again.pod == spec.pod


def test_env_takes_a_mapping_of_strings_as_a_shorthand() -> None:
    spec = load_job(job(pod={"volumes": [CLAIM], "env": {"WANDB_MODE": "offline"}}), now=NOW)
    assert spec.pod.env == ({"name": "WANDB_MODE", "value": "offline"},)
    err = refused(job(pod={"volumes": [CLAIM], "env": {"RETRIES": 3}}))
    assert err.field == "pod.env[0].value" and 'quote it in YAML, e.g. "1"' in err.rule


@pytest.mark.parametrize(
    ("env", "field", "words"),
    [
        ([{"name": "QOSFLOW_CHECKPOINT_DIR", "value": "/x"}], "pod.env[0].name", "set by qosflow"),
        ([{"name": "ARGO_PROGRESS_FILE", "value": "/x"}], "pod.env[0].name", "Argo's executor"),
        ([{"name": "1ST", "value": "x"}], "pod.env[0].name", "not starting with a digit"),
        (
            [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
            "pod.env[1].name",
            "set twice",
        ),
        ([{"name": "A"}], "pod.env[0]", "exactly one of value and valueFrom"),
        ("A=1", "pod.env", "must be a list of EnvVar objects"),
    ],
)
def test_bad_environment_is_refused_naming_the_entry(env: Any, field: str, words: str) -> None:
    err = refused(job(pod={"volumes": [CLAIM], "env": env}))
    assert err.field == field and words in err.rule


@pytest.mark.parametrize(
    ("pod", "field", "words"),
    [
        ({"volumes": [CLAIM, CLAIM]}, "pod.volumes[1].name", "declared twice"),
        ({"volumes": [{"name": "Ckpt", "emptyDir": {}}]}, "pod.volumes[0].name", "RFC 1123"),
        ({"volumes": [{"name": "x"}]}, "pod.volumes[0]", "exactly one volume source"),
        (
            {"volumes": [CLAIM], "volume_mounts": [{"name": "data", "mountPath": "/data"}]},
            "pod.volume_mounts[0].name",
            "not a volume of pod.volumes",
        ),
        (
            {"volumes": [CLAIM], "volume_mounts": [{"name": "ckpt", "mountPath": "data"}]},
            "pod.volume_mounts[0].mountPath",
            "absolute path",
        ),
        (
            {"volumes": [CLAIM], "volume_mounts": [{"name": "ckpt", "mountPath": "/checkpoints"}]},
            "pod.volume_mounts[0].mountPath",
            "checkpoint.path",
        ),
        (
            {"volumes": [CLAIM], "volume_mounts": [{"name": "ckpt", "mountPath": "/var/run/argo"}]},
            "pod.volume_mounts[0].mountPath",
            "Argo's executor",
        ),
        (
            {"volumes": [CLAIM], "labels": {"qosflow.dev/job": "x"}},
            "pod.labels.qosflow.dev/job",
            "prefix",
        ),
        ({"volumes": [CLAIM], "labels": {"team": "a b"}}, "pod.labels.team", "label value"),
        ({"volumes": [CLAIM], "image_pull_policy": "Sometimes"}, "pod.image_pull_policy", "one of"),
        ({"volumes": [CLAIM], "tolerations": {"key": "x"}}, "pod.tolerations", "list"),
        ({"volumes": [CLAIM], "nodeSelector": {"a": "b"}}, "pod.nodeSelector", "not a known field"),
    ],
)
def test_bad_pod_settings_are_refused_naming_the_field(
    pod: dict[str, Any], field: str, words: str
) -> None:
    err = refused(job(pod=pod))
    assert err.field == field, err
    assert words in err.rule, err


@pytest.mark.parametrize(
    ("volume", "why"),
    [
        ({"name": "ckpt", "emptyDir": {}}, "lives and dies with one pod"),
        ({"name": "ckpt", "hostPath": {"path": "/ckpt"}}, "may start on another"),
        ({"name": "ckpt", "configMap": {"name": "c"}}, "read-only"),
        ({"name": "ckpt", "ephemeral": {}}, "deleted with its pod"),
        (
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c", "readOnly": True}},
            "read-only",
        ),
        ({"name": "ckpt", "awsElasticBlockStore": {"volumeID": "v"}}, "PersistentVolumeClaim"),
    ],
)
def test_a_checkpoint_the_next_pod_could_not_see_is_refused_saying_why(
    volume: dict[str, Any], why: str
) -> None:
    err = refused(job(pod={"volumes": [volume]}))
    assert err.field == "checkpoint.volume" and why in err.rule


def test_a_checkpoint_on_an_undeclared_volume_is_refused() -> None:
    err = refused(job(checkpoint={"volume": "nope"}))
    assert err.field == "checkpoint.volume" and "declared: ckpt" in err.rule


def test_no_checkpoint_loads_for_planning_but_is_named_before_a_submit() -> None:
    spec = load_job(job(pod={}, checkpoint=None), now=NOW)
    problem = checkpoint_problem(spec.pod, spec.checkpoint)
    assert problem is not None and problem.field == "checkpoint"
    assert "pod's own disk" in problem.rule and "step 0" in problem.rule


def test_the_connection_fills_what_the_job_leaves_unset() -> None:
    defaults = PodDefaults(
        image="registry.example/qosflow-trainer:0.1.0",
        image_pull_secrets=("regcred",),
        checkpoint_claim="shared-ckpt",
        tolerations=({"key": "gpu", "operator": "Exists"},),
        node_selector={"pool": "train"},
    )
    spec = load_job(job(image=None, pod={}, checkpoint=None), now=NOW, defaults=defaults)
    assert spec.image == "registry.example/qosflow-trainer:0.1.0"
    assert spec.checkpoint == Checkpoint(DEFAULT_CHECKPOINT_VOLUME, DEFAULT_CHECKPOINT_PATH)
    assert spec.pod.volume(DEFAULT_CHECKPOINT_VOLUME) == {
        "name": DEFAULT_CHECKPOINT_VOLUME,
        "persistentVolumeClaim": {"claimName": "shared-ckpt"},
    }
    assert spec.pod.image_pull_secrets == ("regcred",)
    assert spec.pod.tolerations == defaults.tolerations
    assert checkpoint_problem(spec.pod, spec.checkpoint) is None
    # the job's own values win, an explicit empty list included
    own = load_job(job(pod={"volumes": [CLAIM], "tolerations": []}), now=NOW, defaults=defaults)
    assert own.image == "registry.example/team/trainer:1.4"
    assert own.checkpoint == Checkpoint("ckpt", "/checkpoints")
    assert own.pod.tolerations == () and own.pod.volume(DEFAULT_CHECKPOINT_VOLUME) is None


def test_the_default_checkpoint_volume_never_replaces_a_jobs_own_volume() -> None:
    taken = {"name": DEFAULT_CHECKPOINT_VOLUME, "emptyDir": {}}
    err = refused(job(pod={"volumes": [taken]}, checkpoint=None), PodDefaults(checkpoint_claim="c"))
    assert err.field == "pod.volumes" and "rename this volume" in err.rule
