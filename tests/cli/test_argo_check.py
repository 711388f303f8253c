"""``qosflow argo check``: a cluster is checked before the first run, every failure with its fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from in_process import qosflow

pytestmark = pytest.mark.slow  # a local cluster in this process


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from qosflow.local.cluster import LocalCluster

    with LocalCluster(cpus=2, state_dir=tmp_path / "local", token="check-token") as cluster:
        monkeypatch.setenv("QOSFLOW_ARGO_URL", cluster.argo_url)
        monkeypatch.setenv("QOSFLOW_KUBE_URL", cluster.kube_url)
        monkeypatch.setenv("QOSFLOW_ARGO_TOKEN", cluster.token)
        monkeypatch.setenv("QOSFLOW_NAMESPACE", cluster.namespace)
        monkeypatch.delenv("QOSFLOW_KUBE_TOKEN", raising=False)
        monkeypatch.delenv("KUBECONFIG", raising=False)
        yield cluster


def _fails(out: str) -> list[str]:
    lines = out.splitlines()
    return [
        f"{line} | {lines[i + 1].strip()}"
        for i, line in enumerate(lines)
        if line.startswith("FAIL")
    ]


def test_a_fresh_cluster_fails_naming_what_is_missing_and_the_fix(local: Any) -> None:
    out = qosflow("argo", "check", "--checkpoint-claim", "qosflow-checkpoints")
    assert out.returncode == 1
    fails = _fails(out.stdout)
    assert any(
        "WorkflowTemplate qosflow-train is not installed | fix: run `qosflow argo install`" in f
        for f in fails
    ), out.stdout
    assert any("PriorityClass qosflow-urgent" in f for f in fails), out.stdout
    assert any("checkpoint claim qosflow-checkpoints does not exist" in f for f in fails)
    assert "check failed: 3 problem(s)" in out.stdout
    assert qosflow("argo", "install", "--checkpoint-claim", "qosflow-checkpoints").returncode == 0
    again = qosflow("argo", "check", "--checkpoint-claim", "qosflow-checkpoints")
    assert again.returncode == 0, again.stdout
    assert "ok    the token has all 13 rights the client uses" in again.stdout
    assert "Kubernetes 1.35: CPU jobs rescale in place" in again.stdout
    assert "WARN  no node offers nvidia.com/gpu" in again.stdout  # a warning, not a failure
    assert again.stdout.rstrip().endswith("check passed (1 warning(s))")
    gpu = qosflow("argo", "check", "--require-gpu")
    assert gpu.returncode == 1 and "FAIL  no node offers nvidia.com/gpu" in gpu.stdout


def test_the_qosflow_accounts_token_has_every_right_and_a_missing_one_is_named(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qosflow_argo import ArgoCluster
    from qosflow_argo.rbac import rbac

    with ArgoCluster.from_local(local) as admin:
        admin.ensure_installed(rbac=True)
        monkeypatch.setenv("QOSFLOW_ARGO_TOKEN", local.token_for(local.namespace, "qosflow"))
        out = qosflow("argo", "check")
        assert out.returncode == 0, out.stdout
        role = next(
            d
            for d in rbac(local.namespace)
            if d["kind"] == "Role" and d["metadata"]["name"] == "qosflow"
        )
        current = admin.kube.read_object("Role", "qosflow")
        role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods/resize"]]
        role["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        admin.kube.replace_object(role)
    out = qosflow("argo", "check")
    assert out.returncode == 1
    (fail,) = _fails(out.stdout)
    assert "this token may not: patch pods/resize (resize a pod in place)" in fail
    assert "qosflow argo install" in fail


def test_an_old_kubernetes_is_a_warning_naming_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qosflow.local.cluster import LocalCluster

    with LocalCluster(
        cpus=1, state_dir=tmp_path / "old", token="t", kubernetes_version="1.32"
    ) as old:
        monkeypatch.setenv("QOSFLOW_ARGO_TOKEN", old.token)
        monkeypatch.delenv("KUBECONFIG", raising=False)
        target = ("--argo-url", old.argo_url, "--kube-url", old.kube_url)
        assert qosflow("argo", "install", *target).returncode == 0
        out = qosflow("argo", "check", *target)
    assert out.returncode == 0, out.stdout
    assert (
        "WARN  Kubernetes 1.32 has no pods/resize (1.33+): CPU jobs rescale by checkpoint-restart"
        in out.stdout
    )


def test_an_unreachable_server_fails_at_once_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QOSFLOW_ARGO_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("QOSFLOW_KUBE_URL", "http://127.0.0.1:9")
    out = qosflow("argo", "check")
    assert out.returncode == 1
    assert "FAIL  Argo Server http://127.0.0.1:9" in out.stdout
    assert "fix: check --argo-url / QOSFLOW_ARGO_URL" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
