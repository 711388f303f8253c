"""Golden YAML and schema checks of everything qosflow installs or submits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from qosflow.core.cluster import SubmitRequest
from qosflow.core.errors import SpecError
from qosflow.core.pod import Checkpoint, PodSettings
from qosflow.core.priority import LADDER
from qosflow_argo import manifests, render
from qosflow_argo.contract import check_manifest
from qosflow_argo.rbac import rbac

ROOT = Path(__file__).resolve().parents[2] / "argo_templates"
CKPT = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "retrain-ckpt"}}


def request(**over: object) -> SubmitRequest:
    base: dict[str, object] = dict(
        job="resnet",
        segment=1,
        units=3,
        unit="cpu",
        total_steps=1000,
        resume=True,
        priority_class="qosflow-high",
        priority=1234,
        image="ghcr.io/acme/trainer:1",
        command=("python", "-m", "qosflow_trainer", "--width", "64"),
        memory_per_unit="512Mi",
        deadline=1_800_000_000.0,
        checkpoint_dir="/ckpt/resnet",
        checkpoint_every_steps=50,
        plan='{"units": 3}',
        pod=PodSettings(volumes=(CKPT,)),
        checkpoint=Checkpoint("ckpt", "/ckpt"),
    )
    base.update(over)
    return SubmitRequest(**base)  # type: ignore[arg-type]


def test_committed_yaml_is_what_the_builders_render() -> None:
    # never writes: a stale file fails here; `qosflow argo render` regenerates them
    assert render.stale(ROOT, render.render()) == []
    assert render.main(["--check", "--out", str(ROOT)]) == 0


def test_check_mode_reports_a_stale_or_missing_file(tmp_path: Path) -> None:
    assert render.main(["--out", str(tmp_path)]) == 0
    assert render.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / "rbac.yaml"
    path.write_text(path.read_text().replace("pods/resize", "pods"))
    assert render.main(["--check", "--out", str(tmp_path)]) == 1
    path.unlink()
    assert render.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_rendered_manifest_validates() -> None:
    docs = [d for text in render.render().values() for d in yaml.safe_load_all(text)]
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted(
        {
            "WorkflowTemplate",
            "PriorityClass",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
        }
    )
    for doc in docs:
        check_manifest(doc)


def test_template_cpu_container_is_guaranteed_and_resizable() -> None:
    spec = manifests.workflow_template()["spec"]
    assert spec["entrypoint"] == "train-cpu"
    names = {p["name"] for p in spec["arguments"]["parameters"]}
    assert {
        "steps",
        "resume",
        "units",
        "image",
        "command",
        "memory",
        "checkpoint_dir",
        "checkpoint_every",
        "seed",
    } <= names
    cpu = next(t for t in spec["templates"] if t["name"] == "train-cpu")
    # resources come from the template's podSpecPatch: Argo's decoder refuses a templated quantity
    assert "resources" not in cpu["container"]
    (main,) = json.loads(cpu["podSpecPatch"])["containers"]
    res = main["resources"]
    assert main["name"] == "main" and res["requests"] == res["limits"]
    assert res["requests"]["cpu"] == "{{workflow.parameters.units}}"
    assert {p["resourceName"]: p["restartPolicy"] for p in cpu["container"]["resizePolicy"]} == {
        "cpu": "NotRequired",
        "memory": "NotRequired",
    }
    env = {e["name"]: e["value"] for e in cpu["container"]["env"]}
    assert env["QOSFLOW_TOTAL_STEPS"] == "{{workflow.parameters.steps}}"
    assert env["QOSFLOW_RESUME"] == "{{workflow.parameters.resume}}"
    assert "ARGO_PROGRESS_FILE" not in env  # Argo injects it
    assert cpu["retryStrategy"]["limit"] == 3
    gpu = next(t for t in spec["templates"] if t["name"] == "train-gpu")
    limits = json.loads(gpu["podSpecPatch"])["containers"][0]["resources"]["limits"]
    assert limits["{{workflow.parameters.gpu_resource}}"] == "{{workflow.parameters.units}}"
    assert "resizePolicy" not in gpu["container"]
    assert {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}[
        "gpu_resource"
    ] == "nvidia.com/gpu"


def test_no_container_quantity_is_templated() -> None:
    """Argo decodes templates into Kubernetes types: a quantity must be a literal."""
    for tmpl in manifests.workflow_template()["spec"]["templates"]:
        assert "{{" not in json.dumps((tmpl.get("container") or {}).get("resources") or {})


def test_retries_cover_any_segment_length_bounded_by_the_deadline() -> None:
    """No ``backoff.maxDuration``: Argo counts it from the first attempt's start, so a bound of
    minutes never retried a segment that had trained longer. The workflow's
    ``activeDeadlineSeconds`` (deadline + grace) bounds the retries instead."""
    for tmpl in manifests.workflow_template()["spec"]["templates"]:
        if "retryStrategy" not in tmpl:
            assert tmpl.get("daemon") or "steps" in tmpl, tmpl["name"]
            continue
        strategy = tmpl["retryStrategy"]
        assert strategy["limit"] == 3 and strategy["retryPolicy"] == "Always"
        assert "maxDuration" not in strategy["backoff"], tmpl["name"]
        assert strategy["backoff"] == {"duration": "10s", "factor": 2}
    committed = yaml.safe_load((ROOT / "workflow-template.yaml").read_text())
    assert "maxDuration" not in yaml.safe_dump(committed)
    wf = manifests.workflow(request(), namespace="ml", now=1_800_000_000.0 - 7200, grace_s=600)
    assert wf["spec"]["activeDeadlineSeconds"] == 7200 + 600


def test_ladder_matches_the_core_and_only_urgent_preempts() -> None:
    classes = manifests.priority_classes()
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == [
        (k.name, k.value) for k in LADDER
    ]
    assert [c["metadata"]["name"] for c in classes if c["preemptionPolicy"] != "Never"] == [
        "qosflow-urgent"
    ]
    assert all(isinstance(c["value"], int) for c in classes)


def _grants(doc: dict) -> dict[tuple[str, str], dict[str, object]]:
    """(group, resource) → verb → resourceNames (``None``: every object) of a role."""
    out: dict[tuple[str, str], dict[str, object]] = {}
    for rule in doc["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    names = rule.get("resourceNames")
                    out.setdefault((g, r), {})[v] = None if names is None else sorted(names)
    return out


def test_rbac_is_least_privilege() -> None:
    roles = {d["metadata"]["name"]: d for d in rbac() if d["kind"] in ("Role", "ClusterRole")}
    kinds = {name: d["kind"] for name, d in roles.items()}
    assert kinds == {
        "qosflow": "Role",
        "qosflow-executor": "Role",
        "qosflow-capacity": "ClusterRole",
        "qosflow-priorityclasses": "ClusterRole",
    }
    for doc in roles.values():  # every rule names its resources and verbs: no wildcard
        for rule in doc["rules"]:
            assert rule["resources"] and rule["verbs"] and rule["apiGroups"]
            assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]
    rules = {k: set(v) for k, v in _grants(roles["qosflow"]).items()}
    assert rules[("argoproj.io", "workflows")] == {"create", "get", "list", "watch", "patch"}
    # pods, their log and their resize: in the job namespace only (a Role)
    assert rules[("", "pods")] == {"get", "list"}
    assert rules[("", "pods/log")] == {"get"}
    assert rules[("", "pods/resize")] == {"patch"}
    assert ("", "pods/exec") not in rules and not any("delete" in v for v in rules.values())
    executor = roles["qosflow-executor"]["rules"]
    assert executor == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflowtaskresults"],
            "verbs": ["create", "patch"],
        }
    ]
    # cluster-wide: read-only, and only what the free-capacity computation lists
    assert _grants(roles["qosflow-capacity"]) == {
        ("", "nodes"): {"list": None},
        ("", "pods"): {"list": None},
    }
    # PriorityClasses: read them all, update only the ladder's, never create or delete
    ladder = sorted(k.name for k in LADDER)
    assert _grants(roles["qosflow-priorityclasses"]) == {
        ("scheduling.k8s.io", "priorityclasses"): {"get": None, "list": None, "update": ladder}
    }
    every_verb = {v for doc in roles.values() for g in _grants(doc).values() for v in g}
    assert not every_verb & {"delete", "deletecollection", "escalate", "bind", "impersonate"}
    assert all("create" not in g for g in _grants(roles["qosflow-priorityclasses"]).values())


def test_every_binding_binds_exactly_the_account_that_needs_the_role() -> None:
    docs = rbac()
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    bindings = {
        (d["kind"], d["roleRef"]["kind"], d["roleRef"]["name"]): d["subjects"]
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }

    def subject(name: str) -> list[dict[str, str]]:
        return [{"kind": "ServiceAccount", "name": name, "namespace": manifests.NAMESPACE}]

    # the training pods run as the executor account: it alone reports workflowtaskresults
    template = manifests.workflow_template()["spec"]
    assert template["serviceAccountName"] == manifests.EXECUTOR_ACCOUNT
    assert bindings == {
        ("RoleBinding", "Role", "qosflow-executor"): subject(manifests.EXECUTOR_ACCOUNT),
        ("RoleBinding", "Role", "qosflow"): subject(manifests.CLIENT_ACCOUNT),
        ("ClusterRoleBinding", "ClusterRole", "qosflow-capacity"): subject(
            manifests.CLIENT_ACCOUNT
        ),
        ("ClusterRoleBinding", "ClusterRole", "qosflow-priorityclasses"): subject(
            manifests.CLIENT_ACCOUNT
        ),
    }
    assert {s[0]["name"] for s in bindings.values()} == accounts
    # the committed YAML binds the same subjects
    committed = list(yaml.safe_load_all((ROOT / "rbac.yaml").read_text()))
    assert [d for d in committed if d["kind"].endswith("Binding")] == [
        d for d in docs if d["kind"].endswith("Binding")
    ]
    # another namespace moves the subjects with it
    other = {
        d["metadata"]["name"]: d["subjects"][0] for d in rbac("ml") if d["kind"].endswith("Binding")
    }
    assert other["qosflow-executor"] == {
        "kind": "ServiceAccount",
        "name": "qosflow-executor",
        "namespace": "ml",
    }


def test_segment_workflow_references_the_template_with_its_arguments() -> None:
    wf = manifests.workflow(request(), namespace="ml", now=1_799_990_000.0, grace_s=600)
    check_manifest(wf)
    assert wf["metadata"]["name"] == "resnet-s1"
    assert wf["metadata"]["labels"] == {
        "qosflow.dev/job": "resnet",
        "qosflow.dev/segment": "1",
        "qosflow.dev/managed": "true",
        "qosflow.dev/unit": "cpu",
    }
    assert wf["metadata"]["annotations"]["qosflow.dev/deadline"] == "2027-01-15T08:00:00Z"
    spec = wf["spec"]
    assert spec["workflowTemplateRef"] == {"name": "qosflow-train"}
    assert spec["activeDeadlineSeconds"] == 10_000 + 600
    assert spec["priority"] == 1234 and spec["podPriorityClassName"] == "qosflow-high"
    args = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert args["units"] == "3" and args["memory"] == "1536Mi" and args["resume"] == "true"
    assert args["command"] == "python -m qosflow_trainer --width 64"
    assert "entrypoint" not in spec


def test_gpu_segment_selects_the_gpu_template_and_best_effort_has_no_deadline() -> None:
    wf = manifests.workflow(
        request(unit="gpu", deadline=float("inf"), resume=False),
        namespace="ml",
        now=0.0,
        gpu_resource="amd.com/gpu",
    )
    check_manifest(wf)
    assert wf["spec"]["entrypoint"] == "train-gpu"
    args = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    assert args["gpu_resource"] == "amd.com/gpu"
    with pytest.raises(SpecError, match="gpu_resource"):
        manifests.workflow(request(unit="gpu"), namespace="ml", now=0.0, gpu_resource="gpus")
    assert "activeDeadlineSeconds" not in wf["spec"]
    assert wf["metadata"]["annotations"]["qosflow.dev/deadline"] == "none"
    assert {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}[
        "resume"
    ] == "auto"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"job": "Bad_Name"}, "job"),
        ({"job": "x" * 61}, "job"),
        ({"image": None}, "image"),
        ({"checkpoint": None}, "checkpoint"),
        ({"pod": PodSettings(volumes=({"name": "ckpt", "emptyDir": {}},))}, "checkpoint.volume"),
        ({"checkpoint_dir": "/elsewhere/resnet"}, "checkpoint_dir"),
        ({"unit": "worker"}, "launcher"),
        ({"units": 16, "per_node": 8}, "launcher"),
        ({"memory_per_unit": "lots"}, "memory_per_unit"),
        ({"units": 0}, "units"),
    ],
)
def test_bad_requests_never_become_manifests(over: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        manifests.workflow(request(**over), namespace="ml", now=0.0)
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("spec", "podPriority"), 3, "podPriority"),  # removed in Argo v4
        (("spec", "activeDeadlineSeconds"), "soon", "activeDeadlineSeconds"),
        (("spec", "priority"), "high", "priority"),
    ],
)
def test_schema_catches_typos_removed_fields_and_wrong_types(
    path: tuple[str, str], value: object, needle: str
) -> None:
    wf = manifests.workflow(request(), namespace="ml", now=1_799_990_000.0)
    bad = copy.deepcopy(wf)
    bad[path[0]][path[1]] = value
    with pytest.raises(SpecError, match=needle):
        check_manifest(bad)


def test_core_kinds_are_checked_strictly() -> None:
    klass = copy.deepcopy(manifests.priority_classes()[0])
    klass["value"] = "100000"
    with pytest.raises(SpecError, match="PriorityClass/qosflow-urgent"):
        check_manifest(klass)
    role = copy.deepcopy(rbac()[1])
    role["rules"][0]["verb"] = ["get"]
    with pytest.raises(SpecError, match="Role/qosflow"):
        check_manifest(role)


def test_template_without_entrypoint_or_image_is_rejected() -> None:
    tpl = manifests.workflow_template()
    no_entry = copy.deepcopy(tpl)
    del no_entry["spec"]["entrypoint"]
    with pytest.raises(SpecError, match="entrypoint: is required"):
        check_manifest(no_entry)
    no_image = copy.deepcopy(tpl)
    del no_image["spec"]["templates"][0]["container"]["image"]
    with pytest.raises(SpecError, match="image"):
        check_manifest(no_image)
