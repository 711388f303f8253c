"""Argo side of qosflow: hera manifest builders and the Argo/Kubernetes client (ArgoCluster)."""

__version__ = "0.1.0"
