"""Argo side of qosflow: hera manifest builders and the Argo/Kubernetes client (ArgoCluster).

Importing the package is cheap and side-effect free; ``ArgoCluster`` (which pulls in ``requests``
and ``kubernetes``) and the hera builders load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qosflow import __version__ as __version__  # one version: src/qosflow/__init__.py

__all__ = ["ArgoCluster", "RetryPolicy"]

if TYPE_CHECKING:
    from qosflow_argo.argo_cluster import ArgoCluster
    from qosflow_argo.retry import RetryPolicy


def __getattr__(name: str) -> Any:
    if name == "ArgoCluster":
        from qosflow_argo.argo_cluster import ArgoCluster

        return ArgoCluster
    if name == "RetryPolicy":
        from qosflow_argo.retry import RetryPolicy

        return RetryPolicy
    raise AttributeError(f"module 'qosflow_argo' has no attribute {name!r}")
