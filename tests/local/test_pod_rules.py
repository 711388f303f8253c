"""Pure rules of pods as Kubernetes and Argo apply them: ``$(VAR)`` expansion, the downward API,
Argo's spec merges, node affinity, and the path rewriting of isolation ``shared``."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from qosflow.local.pod_env import expand, field_value, resource_value
from qosflow.local.sandbox import Mount, rewrite, shared_cwd
from qosflow.local.scheduling import fits_node
from qosflow.local.spec_merge import join_workflow_spec, merge_template_defaults

VARS = {"A": "x", "B": "y"}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)", "x"),
        ("$(A)-$(B)", "x-y"),
        ("$$(A)", "$(A)"),  # an escaped reference stays as text
        ("$$$(A)", "$x"),
        ("$(C)", "$(C)"),  # an unknown variable stays as written
        ("a$b", "a$b"),
        ("$(A", "$(A"),  # an unterminated reference stays
        ("$", "$"),
        ("$$", "$"),
        ("100$", "100$"),
    ],
)
def test_dollar_references_expand_as_kubernetes_expands_them(text: str, expanded: str) -> None:
    assert expand(text, VARS.get) == expanded


POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "train"},
        "annotations": {"a/b": "c"},
    },
    "spec": {"nodeName": "node", "serviceAccountName": "sa"},
    "status": {"podIP": "10.0.0.1", "hostIP": "10.0.0.2"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['app']", "train"),
        ("metadata.labels['nope']", ""),
        ("metadata.annotations['a/b']", "c"),
        ("spec.nodeName", "node"),
        ("spec.serviceAccountName", "sa"),
        ("status.podIP", "10.0.0.1"),
        ("status.hostIP", "10.0.0.2"),
    ],
)
def test_field_refs_read_the_pod(path: str, value: str) -> None:
    assert field_value(POD, path) == value


NODE = {"cpu": Decimal(4), "memory": Decimal(8 * 2**30)}


@pytest.mark.parametrize(
    ("resources", "ref", "value"),
    [
        ({"limits": {"cpu": "1500m"}}, {"resource": "limits.cpu"}, "2"),  # cores round up
        ({"limits": {"cpu": "1500m"}}, {"resource": "limits.cpu", "divisor": "1m"}, "1500"),
        ({"requests": {"cpu": "250m"}}, {"resource": "requests.cpu"}, "1"),
        ({"limits": {"cpu": "2"}}, {"resource": "requests.cpu"}, "2"),  # requests from limits
        ({}, {"resource": "requests.cpu"}, "0"),
        ({}, {"resource": "limits.cpu"}, "4"),  # an unset limit is the node's allocatable
        ({}, {"resource": "limits.memory", "divisor": "1Gi"}, "8"),
        ({"limits": {"memory": "1Gi"}}, {"resource": "limits.memory", "divisor": "1Mi"}, "1024"),
        (
            {"requests": {"memory": "1500Ki"}},
            {"resource": "requests.memory", "divisor": "1Mi"},
            "2",
        ),
    ],
)
def test_resource_field_refs_round_up_like_the_kubelet(
    resources: dict[str, Any], ref: dict[str, Any], value: str
) -> None:
    assert resource_value({"resources": resources}, ref, NODE) == value


def test_a_workflow_is_merged_over_its_template_as_argo_joins_them() -> None:
    template = {
        "entrypoint": "train",
        "arguments": {"parameters": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]},
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "templates": [
            {"name": "train", "container": {"image": "t", "command": ["run"], "args": ["x"]}},
            {"name": "other", "container": {"image": "o"}},
        ],
    }
    workflow = {
        "workflowTemplateRef": {"name": "tp"},
        "arguments": {"parameters": [{"name": "b", "value": "20"}, {"name": "c", "value": "3"}]},
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}],
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}],
        "templates": [{"name": "train", "container": {"args": ["y"]}}],
        "nodeSelector": {"pool": "a"},
        "priority": None,
    }
    joined = join_workflow_spec(workflow, template)
    assert joined["arguments"]["parameters"] == [
        {"name": "a", "value": "1"},
        {"name": "b", "value": "20"},
        {"name": "c", "value": "3"},
    ]
    assert [v["name"] for v in joined["volumes"]] == ["data", "ckpt"]
    assert joined["tolerations"] == [{"key": "gpu", "operator": "Equal", "value": "yes"}]
    train = joined["templates"][0]
    assert train["container"] == {"image": "t", "command": ["run"], "args": ["y"]}
    assert [t["name"] for t in joined["templates"]] == ["train", "other"]
    assert joined["nodeSelector"] == {"pool": "a"} and "workflowTemplateRef" not in joined
    assert "priority" not in joined  # a null never overrides


def test_template_defaults_merge_into_a_template_which_wins() -> None:
    defaults = {
        "container": {
            "image": "default",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            "envFrom": [{"configMapRef": {"name": "d"}}],
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
        },
        "steps": [[{"name": "ignored"}]],  # another template type: dropped
        "retryStrategy": {"limit": 2},
    }
    template = {
        "name": "t",
        "container": {
            "image": "own",
            "env": [{"name": "B", "value": "own"}],
            "envFrom": [{"secretRef": {"name": "s"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
    }
    merged = merge_template_defaults(template, defaults)
    container = merged["container"]
    assert container["image"] == "own"
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "own"}]
    assert container["envFrom"] == [{"secretRef": {"name": "s"}}]  # no merge key: replaced
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/ckpt", "/data"]
    assert "steps" not in merged and merged["retryStrategy"] == {"limit": 2}


LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "n", "cores": "8"}


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def _term(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({}, True),
        ({"nodeSelector": {"kubernetes.io/os": "linux"}}, True),
        ({"nodeSelector": {"kubernetes.io/os": "windows"}}, False),
        ({"nodeSelector": {"gpu": "yes"}}, False),
        (_required(_term("kubernetes.io/os", "In", "linux", "darwin")), True),
        (_required(_term("kubernetes.io/os", "NotIn", "linux")), False),
        (_required(_term("gpu", "NotIn", "yes")), True),
        (_required(_term("gpu", "Exists")), False),
        (_required(_term("gpu", "DoesNotExist")), True),
        (_required(_term("cores", "Gt", "4")), True),
        (_required(_term("cores", "Lt", "4")), False),
        (_required(_term("gpu", "Exists"), _term("cores", "Gt", "2")), True),  # terms are ORed
        (_required({}), False),  # an empty term matches nothing
        (
            _required(
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
            ),
            False,
        ),
    ],
)
def test_node_selection_matches_the_nodes_labels(spec: dict[str, Any], fits: bool) -> None:
    assert fits_node(spec, LABELS, "n") is fits


def test_shared_isolation_rewrites_container_paths_to_host_folders(tmp_path: Path) -> None:
    mounts = [
        Mount(tmp_path / "claim", "/ckpt"),
        Mount(tmp_path / "argo", "/var/run/argo"),
        Mount(tmp_path / "deep", "/ckpt/deep"),
    ]
    assert rewrite("--dir=/ckpt/run1", mounts) == f"--dir={tmp_path}/claim/run1"
    assert rewrite("/ckpt/deep/x", mounts) == f"{tmp_path}/deep/x"  # the longest mount wins
    assert rewrite("/var/run/argo/progress", mounts) == f"{tmp_path}/argo/progress"
    assert rewrite("exec run --out /ckpt", mounts) == f"exec run --out {tmp_path}/claim"
    assert (
        rewrite("/ckpts/other /data/ckpt", mounts) == "/ckpts/other /data/ckpt"
    )  # not paths under it
    assert shared_cwd(tmp_path, "/ckpt/work", mounts) == tmp_path / "claim" / "work"
    assert shared_cwd(tmp_path, "/elsewhere", mounts) == tmp_path / "rootfs" / "cwd"
