"""``qosflow argo install`` and ``qosflow local up``: the install objects, from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from in_process import qosflow

from qosflow.core.priority import LADDER

pytestmark = pytest.mark.slow  # a local cluster, in this process or as the daemon


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_a_dry_run_writes_nothing_and_an_install_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qosflow.core.errors import NotFoundError
    from qosflow.local.cluster import LocalCluster
    from qosflow_argo import ArgoCluster

    with LocalCluster(cpus=1, state_dir=tmp_path / "local", token="install-token") as local:
        monkeypatch.setenv("QOSFLOW_ARGO_TOKEN", local.token)
        monkeypatch.setenv("QOSFLOW_KUBE_URL", local.kube_url)
        monkeypatch.delenv("KUBECONFIG", raising=False)
        target = ("--argo-url", local.argo_url, "--namespace", local.namespace)
        dry = qosflow("argo", "install", *target, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        said = _lines(dry.stdout)
        assert said["WorkflowTemplate/qosflow-train"] == "would be created", dry.stdout
        assert dry.stdout.startswith("dry run: ")
        with ArgoCluster.from_local(local) as cluster, pytest.raises(NotFoundError):
            cluster.argo.get_template("qosflow-train")  # nothing was written
        first = qosflow("argo", "install", *target)
        assert first.returncode == 0, first.stderr
        assert _lines(first.stdout)["WorkflowTemplate/qosflow-train"] == "created"
        assert any(k.startswith("PriorityClass/qosflow-urgent") for k in _lines(first.stdout))
        made = _lines(first.stdout)
        for rbac in ("ServiceAccount/qosflow", "Role/qosflow", "ClusterRole/qosflow-capacity"):
            assert made[rbac] == "created", first.stdout
        again = _lines(qosflow("argo", "install", *target).stdout)
        objects = {k: v for k, v in again.items() if "/" in k}
        assert len(objects) == 1 + len(LADDER) + 10 and set(objects.values()) == {"unchanged"}
        claim = qosflow("argo", "install", *target, "--checkpoint-claim", "ckpt", "--dry-run")
        assert _lines(claim.stdout)["PersistentVolumeClaim/ckpt"] == "would be created"
        claim = qosflow("argo", "install", *target, "--checkpoint-claim", "ckpt")
        assert _lines(claim.stdout)["PersistentVolumeClaim/ckpt"].startswith("created (Bound, 10Gi")


def test_without_a_target_the_install_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QOSFLOW_ARGO_URL", raising=False)
    out = qosflow("argo", "install", "--dry-run")
    assert out.returncode == 2
    assert out.stderr.startswith("error: --argo-url: must be given, or QOSFLOW_ARGO_URL set")


def test_local_up_installs_everything_and_argo_check_passes_with_what_it_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = str(tmp_path / "local")
    try:
        up = qosflow("local", "up", "--cpus", "1", "--port", "0", "--state-dir", state)
        assert up.returncode == 0, up.stderr
        said = _lines(up.stdout)
        assert said["WorkflowTemplate/qosflow-train"] == "created", up.stdout
        assert said["PriorityClass/qosflow-urgent"] in ("created", "unchanged"), up.stdout
        assert said["RoleBinding/qosflow"] == "created", up.stdout
        assert said["PersistentVolumeClaim/qosflow-checkpoints"].startswith("created (Bound")
        exports = [
            line.split(" ", 1)[1] for line in up.stdout.splitlines() if line.startswith("export ")
        ]
        monkeypatch.delenv("KUBECONFIG", raising=False)
        for name, value in (e.split("=", 1) for e in exports):
            monkeypatch.setenv(name, value)
        check = qosflow("argo", "check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "WorkflowTemplate qosflow-train is installed and current" in check.stdout
        assert "checkpoint claim qosflow-checkpoints: Bound" in check.stdout
        again = qosflow("local", "up", "--port", "0", "--state-dir", state)
        assert "already running" in again.stdout
        assert _lines(again.stdout)["WorkflowTemplate/qosflow-train"] == "unchanged"
    finally:
        qosflow("local", "down", "--state-dir", state)
