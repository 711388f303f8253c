"""A job's Kubernetes objects reach the Workflow as written, and a typo in them names the field."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from qosflow.core.errors import SpecError
from qosflow.core.spec import load_job
from qosflow_argo import manifests
from qosflow_argo.rbac import CLIENT_ACCESS, rbac

NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)
CKPT = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}


def render(**pod: Any) -> dict[str, Any]:
    pod.setdefault("volumes", [CKPT])
    spec = load_job(
        {
            "name": "retrain",
            "total_steps": 100,
            "deadline": "PT1H",
            "resources": {"max": 2},
            "image": "registry.example/trainer:1",
            "pod": pod,
            "checkpoint": {"volume": "ckpt"},
        },
        now=NOW,
    )
    return manifests.workflow(
        manifests.first_segment(spec, "retrain-1"), namespace="ml", now=NOW.timestamp()
    )


@pytest.mark.parametrize(
    ("pod", "field", "words"),
    [
        (
            {"tolerations": [{"key": "gpu", "operater": "Exists"}]},
            "pod.tolerations[0]",
            "'operater' was unexpected",
        ),
        (
            {"volumes": [CKPT, {"name": "data", "persistentVolumeClaim": {"claimNam": "d"}}]},
            "pod.volumes[1].persistentVolumeClaim",
            "'claimName' is a required property",
        ),
        (
            {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"nme": "s", "key": "k"}}}]},
            "pod.env[0].valueFrom.secretKeyRef",
            "'nme' was unexpected",
        ),
        (
            {"env_from": [{"secretRefs": {"name": "s3"}}]},
            "pod.env_from[0]",
            "'secretRefs' was unexpected",
        ),
        (
            {"affinity": {"nodeAffinity": {"required": {}}}},
            "pod.affinity.nodeAffinity",
            "'required' was unexpected",
        ),
        (
            {
                "volumes": [CKPT, {"name": "d", "emptyDir": {}}],
                "volume_mounts": [{"name": "d", "mountPath": "/d", "readOnly": "yes"}],
            },
            "pod.volume_mounts[0].readOnly",
            "is not of type 'boolean'",
        ),
    ],
)
def test_a_typo_in_a_kubernetes_object_names_the_job_field(
    pod: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        render(**pod)
    assert err.value.field == field and words in err.value.rule


def test_the_checkpoint_volume_is_mounted_last_at_its_path() -> None:
    doc = render(volume_mounts=[], env={"A": "1"})
    container = doc["spec"]["templateDefaults"]["container"]
    assert container["volumeMounts"] == [
        {"name": "ckpt", "mountPath": "/var/lib/qosflow/checkpoints"}
    ]
    assert container["env"] == [{"name": "A", "value": "1"}]
    bad = manifests.first_segment(
        load_job(
            {
                "name": "retrain",
                "total_steps": 100,
                "deadline": "PT1H",
                "resources": {"max": 2},
                "image": "i",
                "pod": {"volumes": [CKPT]},
                "checkpoint": {"volume": "ckpt"},
            },
            now=NOW,
        ),
        "retrain-1",
    )
    with pytest.raises(SpecError) as err:  # a checkpoint directory off the volume
        manifests.workflow(replace(bad, checkpoint_dir="/tmp/x"), namespace="ml", now=0.0)
    assert err.value.field == "checkpoint_dir"


def _allows(docs: list[dict[str, Any]], want: Any) -> bool:
    """Whether the client account's roles grant ``want`` (an :class:`rbac.Access`)."""
    resource = want.resource + (f"/{want.subresource}" if want.subresource else "")
    for doc in docs:
        if doc["kind"] not in ("Role", "ClusterRole") or (
            want.namespaced is False and doc["kind"] == "Role"
        ):
            continue
        if doc["metadata"]["name"] not in (
            "qosflow",
            "qosflow-capacity",
            "qosflow-priorityclasses",
        ):
            continue
        for rule in doc["rules"]:
            names = rule.get("resourceNames")
            if (
                want.group in rule["apiGroups"]
                and resource in rule["resources"]
                and want.verb in rule["verbs"]
                and (names is None or want.name in names)
            ):
                return True
    return False


def test_the_shipped_rbac_grants_every_request_the_client_makes() -> None:
    docs = rbac()
    missing = [str(a) for a in CLIENT_ACCESS if not _allows(docs, a)]
    assert missing == []
    # and the check would notice a missing one
    trimmed = [d for d in docs if d["metadata"]["name"] != "qosflow-capacity"]
    assert not all(_allows(trimmed, a) for a in CLIENT_ACCESS)
