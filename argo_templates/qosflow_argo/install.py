"""``qosflow argo install`` (its arguments are the CLI's): qosflow's install objects on a cluster.

The target comes from flags or from the environment the contract suite reads
(``QOSFLOW_ARGO_URL``, ``QOSFLOW_ARGO_TOKEN``, ``QOSFLOW_KUBE_URL`` or ``KUBECONFIG``,
``QOSFLOW_NAMESPACE``), so the values ``qosflow local up`` prints work as they are. Idempotent
(:class:`qosflow_argo.installer.Installer`): it prints one line per object, ``created``,
``updated`` or ``unchanged``; ``--dry-run`` reads only and prints what an install would do.

It installs the WorkflowTemplate, the PriorityClass ladder and the RBAC (``--no-rbac`` leaves the
RBAC to an administrator's ``kubectl apply -f argo_templates/rbac.yaml``: granting rights needs
rights), and with ``--checkpoint-claim`` the claim jobs keep their checkpoints on.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from qosflow.core.errors import SpecError
from qosflow_argo.argo_cluster import ArgoCluster


def cluster_from(args: argparse.Namespace, **kwargs: Any) -> ArgoCluster:
    """The cluster the flags, then the environment, point at.

    The token is never a flag (other users can read a command line): ``args.token`` is set only
    by callers that hold one (``qosflow local up``), else it comes from the environment.

    Raises:
        SpecError: When no Argo Server URL is given.
    """
    if not (args.argo_url or os.environ.get("QOSFLOW_ARGO_URL")):
        raise SpecError(
            "--argo-url", "must be given, or QOSFLOW_ARGO_URL set (see `qosflow local up`)"
        )
    gpu = getattr(args, "gpu_resource", None)
    if gpu:
        kwargs["gpu_resource"] = gpu
    return ArgoCluster.from_env(
        argo_url=args.argo_url,
        kube_url=args.kube_url,
        namespace=args.namespace,
        token=getattr(args, "token", None),
        **kwargs,
    )


def run(args: argparse.Namespace) -> int:
    """Install (or, with ``--dry-run``, report); print one line per object."""
    with cluster_from(args) as cluster:
        done = cluster.ensure_installed(
            dry_run=bool(args.dry_run),
            rbac=not getattr(args, "no_rbac", False),
            checkpoint_claim=getattr(args, "checkpoint_claim", None),
            claim_size=getattr(args, "claim_size", "10Gi"),
            claim_access_mode=getattr(args, "claim_access_mode", "ReadWriteOnce"),
            storage_class=getattr(args, "storage_class", None),
        )
        where = f"namespace {cluster.namespace} on {cluster.argo.url}"
    print(f"{'dry run: ' if args.dry_run else ''}qosflow's install objects in {where}")
    for name, what in done.items():
        print(f"{name}: {what}")
    return 0
