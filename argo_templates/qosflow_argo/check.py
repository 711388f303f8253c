"""``qosflow argo check``: is this cluster ready for qosflow's first run? Every failure with its fix.

It asks, in order: is the Argo Server reachable, is the Kubernetes API reachable (and which
version), does the token have every right the client uses at run time (one
SelfSubjectAccessReview per :data:`qosflow_argo.rbac.CLIENT_ACCESS` entry), is the WorkflowTemplate
installed and current, is the PriorityClass ladder there, does the API server have the
``pods/resize`` subresource (Kubernetes ≥ 1.33; else CPU jobs rescale by checkpoint-restart), do
the nodes offer the GPU resource, and is the checkpoint claim there and bound. It reads only.

A finding is ``ok``, ``warn`` (qosflow works, with a limit the line names) or ``fail`` (the first
run would fail; the line after it says how to fix it). The target comes from flags or the
environment the contract suite reads (:func:`qosflow_argo.install.cluster_from`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from qosflow.core.errors import ClusterError, NotFoundError, QosflowError
from qosflow_argo.argo_cluster import ArgoCluster
from qosflow_argo.installer import Installer, claim_state
from qosflow_argo.manifests import CLIENT_ACCOUNT, priority_classes
from qosflow_argo.rbac import CLIENT_ACCESS
from qosflow_argo.retry import RetryPolicy

Status = Literal["ok", "warn", "fail"]
RESIZE_VERSION = (1, 33)
INSTALL = "qosflow argo install"


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the check.

    Attributes:
        status: ``ok``, ``warn`` or ``fail``.
        what: What was found, in words.
        fix: How to fix a failure (or lift a warning's limit); ``""`` when nothing to do.
    """

    status: Status
    what: str
    fix: str = ""


def _reach(what: str, call: Callable[[], object], fix: str) -> Finding | None:
    """``None`` when ``call`` works, else the failure (an unreachable or refusing server)."""
    try:
        call()
    except ClusterError as exc:
        if exc.status == 401:
            return Finding("fail", f"{what}: the token was refused (401)", TOKEN_FIX)
        return Finding("fail", f"{what}: {exc}", fix)
    return None


TOKEN_FIX = (
    f"set QOSFLOW_ARGO_TOKEN to a token of the {CLIENT_ACCOUNT} ServiceAccount "
    f"(`kubectl -n <namespace> create token {CLIENT_ACCOUNT}`), or to the token "
    "`qosflow local up` printed"
)


def argo_server(cluster: ArgoCluster) -> Finding:
    """The Argo Server answers (its version)."""
    version: dict[str, object] = {}

    def ask() -> None:
        version.update(cluster.argo.version())

    failed = _reach(
        f"Argo Server {cluster.argo.url}",
        ask,
        "check --argo-url / QOSFLOW_ARGO_URL (e.g. `kubectl -n argo port-forward "
        "svc/argo-server 2746:2746` and https://localhost:2746); for a self-signed certificate "
        "set QOSFLOW_ARGO_CA",
    )
    return failed or Finding(
        "ok", f"Argo Server {cluster.argo.url} answers: {version.get('version', '?')}"
    )


def kubernetes(cluster: ArgoCluster) -> Finding:
    """The Kubernetes API answers; in-place resize needs 1.33."""
    failed = _reach(
        "Kubernetes API",
        cluster.kube.server_version,
        "check --kube-url / QOSFLOW_KUBE_URL (with QOSFLOW_KUBE_TOKEN) or KUBECONFIG",
    )
    if failed is not None:
        return failed
    major, minor = cluster.server_version()
    if (major, minor) >= RESIZE_VERSION:
        return Finding("ok", f"Kubernetes {major}.{minor}: CPU jobs rescale in place (pods/resize)")
    return Finding(
        "warn",
        f"Kubernetes {major}.{minor} has no pods/resize (1.33+): CPU jobs rescale by "
        "checkpoint-restart, each rescale costs a pod start and up to one checkpoint interval",
        "upgrade the cluster to Kubernetes 1.33 or later for in-place CPU resize",
    )


def permissions(cluster: ArgoCluster) -> Finding:
    """Every right the client uses, asked with SelfSubjectAccessReviews."""
    denied = []
    for access in CLIENT_ACCESS:
        try:
            review = cluster.kube.access_review(
                access.verb,
                access.resource,
                group=access.group,
                subresource=access.subresource,
                name=access.name,
                namespaced=access.namespaced,
            )
        except ClusterError as exc:
            return Finding("warn", f"could not ask the API server about rights: {exc}")
        if not (review.get("status") or {}).get("allowed"):
            denied.append(f"{access} ({access.why})")
    if denied:
        return Finding(
            "fail",
            f"this token may not: {'; '.join(denied)}",
            f"install qosflow's RBAC as an administrator (`{INSTALL}`, or `kubectl apply -f "
            f"argo_templates/rbac.yaml`) and use the {CLIENT_ACCOUNT} ServiceAccount's token",
        )
    return Finding("ok", f"the token has all {len(CLIENT_ACCESS)} rights the client uses")


def template(cluster: ArgoCluster) -> Finding:
    """The WorkflowTemplate is installed and what this qosflow renders."""
    try:
        state = Installer(cluster.argo, cluster.kube, dry_run=True).ensure_template(
            cluster.namespace, cluster.template
        )
    except ClusterError as exc:
        if exc.status == 401:
            return Finding("fail", "the Argo Server refused the token (401)", TOKEN_FIX)
        return Finding("fail", f"WorkflowTemplate {cluster.template}: {exc}")
    name = f"WorkflowTemplate {cluster.template}"
    if state == "unchanged":
        return Finding("ok", f"{name} is installed and current")
    if state == "would be created":
        return Finding("fail", f"{name} is not installed", f"run `{INSTALL}`")
    return Finding(
        "fail", f"{name} differs from what this qosflow renders (older or edited)", INSTALL
    )


def ladder(cluster: ArgoCluster) -> Finding:
    """Every PriorityClass of the ladder exists."""
    missing = []
    for klass in priority_classes():
        name = klass["metadata"]["name"]
        try:
            cluster.kube.read_priority_class(name)
        except NotFoundError:
            missing.append(name)
        except ClusterError as exc:
            return Finding("warn", f"could not read PriorityClass {name}: {exc}")
    if missing:
        return Finding(
            "fail", f"PriorityClass {', '.join(missing)} missing", f"run `{INSTALL}` as an admin"
        )
    return Finding("ok", f"PriorityClass ladder: all {len(priority_classes())} classes installed")


def gpus(cluster: ArgoCluster, *, required: bool) -> Finding:
    """The nodes' allocatable GPUs (the connection's GPU resource)."""
    try:
        capacity = cluster.capacity("gpu")
    except ClusterError as exc:
        return Finding("warn", f"could not read the nodes: {exc}")
    nodes = sum(1 for free in capacity.free_per_node.values() if free > 0)
    if capacity.total > 0:
        return Finding(
            "ok",
            f"GPUs: {capacity.total} {cluster.gpu_resource} ({capacity.free} free, {nodes} node(s))",
        )
    return Finding(
        "fail" if required else "warn",
        f"no node offers {cluster.gpu_resource}: GPU jobs are refused at plan",
        "install the GPU device plugin, or set gpu_resource (--gpu-resource) to the resource "
        "your nodes advertise (e.g. amd.com/gpu)",
    )


def claim(cluster: ArgoCluster, name: str) -> Finding:
    """The checkpoint claim exists and is bound."""
    try:
        pvc = cluster.kube.read_object("PersistentVolumeClaim", name)
    except NotFoundError:
        return Finding(
            "fail",
            f"checkpoint claim {name} does not exist: jobs using it would stay Pending",
            f"run `{INSTALL} --checkpoint-claim {name}` (or create the claim yourself)",
        )
    except ClusterError as exc:
        return Finding("warn", f"could not read checkpoint claim {name}: {exc}")
    state = claim_state(pvc)
    if state.startswith("Bound"):
        return Finding("ok", f"checkpoint claim {name}: {state}")
    return Finding(
        "warn",
        f"checkpoint claim {name}: {state} (a WaitForFirstConsumer class binds it when the first "
        "pod starts)",
        "see `kubectl describe pvc` if it stays Pending",
    )


def run_checks(
    cluster: ArgoCluster, *, checkpoint_claim: str | None = None, require_gpu: bool = False
) -> list[Finding]:
    """Every check, in order; later checks are skipped when a server cannot be reached.

    The two servers are asked side by side: each may spend its whole retry budget before it
    counts as unreachable, and a check of a cluster that is not there waits for one budget, not
    two.
    """
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="qosflow-check") as pool:
        servers = [pool.submit(argo_server, cluster), pool.submit(kubernetes, cluster)]
        findings = [server.result() for server in servers]
    if any(f.status == "fail" for f in findings):
        return findings
    findings += [permissions(cluster), template(cluster), ladder(cluster)]
    findings.append(gpus(cluster, required=require_gpu))
    if checkpoint_claim:
        findings.append(claim(cluster, checkpoint_claim))
    return findings


def report(findings: list[Finding]) -> tuple[str, int]:
    """The printed lines and the exit code (1 when anything failed)."""
    lines = []
    for f in findings:
        lines.append(f"{f.status.upper() if f.status != 'ok' else 'ok':<5} {f.what}")
        if f.fix and f.status != "ok":
            lines.append(f"      fix: {f.fix}")
    fails = sum(f.status == "fail" for f in findings)
    warns = sum(f.status == "warn" for f in findings)
    verdict = f"check failed: {fails} problem(s)" if fails else "check passed"
    lines.append(verdict + (f" ({warns} warning(s))" if warns else ""))
    return "\n".join(lines), 1 if fails else 0


def run(args: argparse.Namespace) -> int:
    """``qosflow argo check``: print the findings; exit 1 when anything failed."""
    from qosflow_argo.install import cluster_from

    claim_name = args.checkpoint_claim or os.environ.get("QOSFLOW_CHECKPOINT_CLAIM") or None
    try:
        cluster = cluster_from(args, retry=RetryPolicy(budget_s=5.0, timeout_s=5.0))
    except QosflowError as exc:
        print(f"FAIL  {exc}")
        return 1
    with cluster:
        print(f"qosflow argo check: namespace {cluster.namespace}, Argo Server {cluster.argo.url}")
        findings = run_checks(
            cluster, checkpoint_claim=claim_name, require_gpu=bool(args.require_gpu)
        )
    text, code = report(findings)
    print(text)
    return code
