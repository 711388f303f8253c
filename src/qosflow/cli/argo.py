"""``qosflow argo render|install|check``: qosflow's install objects, and whether a cluster is ready.

* ``render`` writes the manifests (WorkflowTemplate, PriorityClass ladder, RBAC) as YAML;
* ``install`` creates or updates them on a cluster (with ``--checkpoint-claim``, the claim jobs
  keep their checkpoints on), ``--dry-run`` reports what it would do;
* ``check`` verifies a cluster before the first run, every failure with its fix.

The target comes from flags or from ``QOSFLOW_ARGO_URL``, ``QOSFLOW_ARGO_TOKEN``,
``QOSFLOW_KUBE_URL`` (or ``KUBECONFIG``) and ``QOSFLOW_NAMESPACE``: what ``qosflow local up``
prints. The work is in :mod:`qosflow_argo` (the ``argo`` extra), loaded only when a command runs.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from qosflow.core.errors import QosflowError

LOCAL_CLAIM = "qosflow-checkpoints"
"""The checkpoint claim ``qosflow local up`` creates (the provider's local connection uses it)."""
TARGET = (
    "the cluster the flags or QOSFLOW_ARGO_URL, QOSFLOW_ARGO_TOKEN, QOSFLOW_KUBE_URL (or "
    "KUBECONFIG) and QOSFLOW_NAMESPACE point at"
)


def _module(name: str, command: str) -> Any:
    try:
        return importlib.import_module(f"qosflow_argo.{name}")
    except ImportError as exc:
        raise QosflowError(
            f"`qosflow {command}` needs the argo extra (pip install 'qosflow[argo]'): {exc}"
        ) from None


def _render(args: argparse.Namespace) -> int:
    argv = ["--out", args.out] if args.out else []
    argv += ["--namespace", args.namespace] if args.namespace else []
    code: int = _module("render", "argo render").main([*argv, "--check"] if args.check else argv)
    return code


def _install(args: argparse.Namespace) -> int:
    code: int = _module("install", "argo install").run(args)
    return code


def _check(args: argparse.Namespace) -> int:
    code: int = _module("check", "argo check").run(args)
    return code


def install_on_local(info: dict[str, Any]) -> int:
    """After ``qosflow local up``: install everything on it, print the variables to use it."""
    try:
        install = importlib.import_module("qosflow_argo.install")
    except ImportError:  # the argo extra is not installed: nothing would use the template
        print("note: without the argo extra nothing was installed on the local cluster")
        return 0
    args = argparse.Namespace(
        argo_url=info["argo_url"], kube_url=info["kube_url"], namespace=info["namespace"],
        token=str(info["token"]), dry_run=False, no_rbac=False, checkpoint_claim=LOCAL_CLAIM,
        claim_size="10Gi", claim_access_mode="ReadWriteOnce", storage_class=None,
    )  # fmt: skip
    code: int = install.run(args)
    print("\nto use it from this shell (qosflow argo check, the contract suite, Airflow):")
    for name, value in (
        ("QOSFLOW_ARGO_URL", info["argo_url"]),
        ("QOSFLOW_KUBE_URL", info["kube_url"]),
        ("QOSFLOW_ARGO_TOKEN", info["token"]),
        ("QOSFLOW_NAMESPACE", info["namespace"]),
        ("QOSFLOW_CHECKPOINT_CLAIM", LOCAL_CLAIM),
    ):
        print(f"export {name}={value}")
    return code


def _target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--argo-url", help="Argo Server URL (default: $QOSFLOW_ARGO_URL)")
    parser.add_argument(
        "--kube-url", help="Kubernetes API URL (default: $QOSFLOW_KUBE_URL, else KUBECONFIG)"
    )
    parser.add_argument(
        "--namespace", help="qosflow's namespace (default: $QOSFLOW_NAMESPACE or qosflow)"
    )
    parser.add_argument(
        "--gpu-resource",
        default=None,
        help="the extended resource a GPU is on this cluster (default: nvidia.com/gpu)",
    )


def _add_render(argo: Any) -> None:
    render = argo.add_parser(
        "render",
        help="write the install manifests (workflow-template, priority-classes, rbac .yaml)",
        description="Write workflow-template.yaml, priority-classes.yaml and rbac.yaml, each "
        "validated, to the --out directory.",
    )
    render.add_argument(
        "--out",
        metavar="DIR",
        help="directory to write (or, with --check, to compare); default: the checkout's "
        "argo_templates/ when run from a source checkout, else the current directory",
    )
    render.add_argument(
        "--namespace",
        metavar="NS",
        help="namespace of the WorkflowTemplate and the RBAC (default: qosflow)",
    )
    render.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a file in the --out directory is missing or stale",
    )
    render.set_defaults(func=_render)


def _add_install(argo: Any) -> None:
    install = argo.add_parser(
        "install",
        help="install (or --dry-run: report) the WorkflowTemplate, PriorityClasses and RBAC",
        description=f"Create or update qosflow's WorkflowTemplate, PriorityClass ladder and RBAC "
        f"(ServiceAccounts qosflow and qosflow-executor, their Roles and bindings) on {TARGET}. "
        "Idempotent; prints one line per object. Granting rights needs an administrator's "
        "token; --no-rbac leaves the RBAC to `kubectl apply -f argo_templates/rbac.yaml`.",
    )
    _target(install)
    install.add_argument(
        "--dry-run", action="store_true", help="read only: print what an install would do"
    )
    install.add_argument("--no-rbac", action="store_true", help="leave the RBAC out")
    install.add_argument(
        "--checkpoint-claim",
        metavar="NAME",
        help="also create this PersistentVolumeClaim for the jobs' checkpoints when missing "
        "(name it as the connection's checkpoint_claim)",
    )
    install.add_argument("--claim-size", default="10Gi", help="its storage request (10Gi)")
    install.add_argument(
        "--claim-access-mode",
        default="ReadWriteOnce",
        choices=("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"),
        help="its access mode (ReadWriteOnce: one pod at a time, as a qosflow job runs)",
    )
    install.add_argument("--storage-class", help="its StorageClass (default: the cluster's)")
    install.set_defaults(func=_install)


def _add_check(argo: Any) -> None:
    check = argo.add_parser(
        "check",
        help="verify a cluster before the first run (every failure with its fix)",
        description=f"Check {TARGET}: both APIs reachable, the token's rights (one "
        "SelfSubjectAccessReview per request kind the client makes), the WorkflowTemplate "
        "installed and current, the PriorityClass ladder, pods/resize (Kubernetes 1.33+), the "
        "GPU resource on the nodes and the checkpoint claim. Reads only. Exit 1 when anything "
        "would make the first run fail.",
    )
    _target(check)
    check.add_argument(
        "--checkpoint-claim",
        metavar="NAME",
        help="the checkpoint claim to check (default: $QOSFLOW_CHECKPOINT_CLAIM)",
    )
    check.add_argument(
        "--require-gpu", action="store_true", help="fail (not warn) when no node offers a GPU"
    )
    check.set_defaults(func=_check)


def add_subcommands(sub: Any) -> None:
    """Register ``argo render``, ``argo install`` and ``argo check``."""
    argo = sub.add_parser("argo", help="qosflow on Argo + Kubernetes: manifests, install, check")
    verbs = argo.add_subparsers(dest="argo_command", required=True)
    _add_render(verbs)
    _add_install(verbs)
    _add_check(verbs)
