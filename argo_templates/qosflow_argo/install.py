"""``qosflow argo install`` (its arguments are the CLI's): qosflow's install objects on a cluster.

The target comes from flags or from the environment the contract suite reads
(``QOSFLOW_ARGO_URL``, ``QOSFLOW_ARGO_TOKEN``, ``QOSFLOW_KUBE_URL`` or ``KUBECONFIG``,
``QOSFLOW_NAMESPACE``), so the values ``qosflow local up`` prints work as they are. Idempotent
(:class:`qosflow_argo.installer.Installer`): it prints one line per object, ``created``,
``updated`` or ``unchanged``; ``--dry-run`` reads only and prints what an install would do.

The RBAC (``argo_templates/rbac.yaml``) is not applied by this command: it grants rights, so it
is applied by a cluster administrator with ``kubectl apply -f argo_templates/rbac.yaml``.
"""

from __future__ import annotations

import argparse
import os

from qosflow.core.errors import SpecError
from qosflow_argo.argo_cluster import ArgoCluster


def cluster_from(args: argparse.Namespace) -> ArgoCluster:
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
    return ArgoCluster.from_env(
        argo_url=args.argo_url,
        kube_url=args.kube_url,
        namespace=args.namespace,
        token=getattr(args, "token", None),
    )


def run(args: argparse.Namespace) -> int:
    """Install (or, with ``--dry-run``, report); print one line per object."""
    with cluster_from(args) as cluster:
        done = cluster.ensure_installed(dry_run=bool(args.dry_run))
        where = f"namespace {cluster.namespace} on {cluster.argo.url}"
    print(f"{'dry run: ' if args.dry_run else ''}qosflow's install objects in {where}")
    for name, what in done.items():
        print(f"{name}: {what}")
    return 0
