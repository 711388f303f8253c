"""``qosflow argo check`` against servers that do not answer (no cluster needed)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from qosflow.core.errors import ClusterError
from qosflow_argo.check import report, run_checks


def _cluster(argo_version: Any, server_version: Any) -> Any:
    """What the reachability checks read of an ``ArgoCluster``."""
    return SimpleNamespace(
        argo=SimpleNamespace(url="http://argo.invalid:2746", version=argo_version),
        kube=SimpleNamespace(server_version=server_version),
        server_version=lambda: (1, 35),
    )


def test_the_two_servers_are_asked_side_by_side_so_a_missing_cluster_costs_one_retry_budget() -> (
    None
):
    # each ask waits for the other at the barrier: asked one after the other, the first would
    # wait alone, the barrier would break, and its error is not a ClusterError
    both = threading.Barrier(2, timeout=30)

    def unreachable() -> None:
        both.wait()
        raise ClusterError("connection refused after 5.0 s of retries", retryable=True)

    findings = run_checks(_cluster(unreachable, unreachable))
    text, code = report(findings)
    assert code == 1
    assert [f.status for f in findings] == ["fail", "fail"], text  # nothing else is asked
    assert findings[0].what.startswith("Argo Server http://argo.invalid:2746: connection refused")
    assert findings[1].what.startswith("Kubernetes API: connection refused")
    assert "fix: check --argo-url / QOSFLOW_ARGO_URL" in text
    assert "fix: check --kube-url / QOSFLOW_KUBE_URL" in text


def test_an_answering_argo_server_and_a_missing_kubernetes_api_name_only_the_missing_one() -> None:
    def refused() -> None:
        raise ClusterError("connection refused", retryable=True)

    findings = run_checks(_cluster(lambda: {"version": "v4.0.1"}, refused))
    assert [(f.status, f.what.split(":")[0]) for f in findings] == [
        ("ok", "Argo Server http"),
        ("fail", "Kubernetes API"),
    ]
    assert findings[0].what.endswith("answers: v4.0.1")
