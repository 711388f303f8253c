"""``ArgoCluster``: qosflow's ``ClusterView`` and ``Actuator`` over Argo Workflows on Kubernetes.

Workflows go through the Argo Server REST API; pods, in-place resize, PriorityClasses, node
capacity and the Workflow custom resource (for the priority merge-patch) through the Kubernetes API.
The same class talks to a real cluster and to the embedded local cluster (``qosflow.local``).

Idempotency: the workflow of a segment has the deterministic name ``workflow_name(job, segment)``.
``submit`` creates it; when the server answers 409 AlreadyExists (a retried submit, a re-planned
run, or a caller that crashed between create and recording it) it returns the existing workflow
when it is the same submit (:mod:`qosflow_argo.adopt`), so a segment never runs twice. Every manifest is validated (:func:`~qosflow_argo.contract.check_manifest`) before it is sent.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

import requests

from qosflow.core.cluster import (
    LABEL_JOB,
    LABEL_MANAGED,
    Capacity,
    JobStatus,
    ResizeResult,
    ResizeState,
    SubmitRequest,
)
from qosflow.core.errors import ClusterError, NotFoundError, SpecError
from qosflow.core.layout import job_problem
from qosflow.core.spec import JobSpec, Unit
from qosflow.core.usage import UsageReport, usage_in_log
from qosflow_argo import distributed, manifests, podspec
from qosflow_argo.adopt import check_same_submit
from qosflow_argo.argo_server import ArgoServer
from qosflow_argo.capacity import free_capacity
from qosflow_argo.contract import check_manifest
from qosflow_argo.installer import Installer
from qosflow_argo.kube import KubeApi, api_client_from_kubeconfig, api_client_from_url
from qosflow_argo.resize import MEMORY_SHRINK_VERSION, resize_body, resize_memory
from qosflow_argo.retry import Retrier, RetryPolicy
from qosflow_argo.workflow_status import (
    WORKFLOW_LABEL,
    job_status,
    main_container,
    phase_of,
    pod_for,
    pod_units,
    resize_state,
)

log = logging.getLogger(__name__)
INT32 = (-(2**31), 2**31 - 1)


class ArgoCluster:
    """A cluster running qosflow jobs as Argo Workflows.

    Args:
        argo_url: Argo Server base URL.
        token: Bearer token for the Argo Server (and for Kubernetes unless ``kube_token``).
        namespace: Namespace of the workflows and pods.
        kube_url: Kubernetes API URL; without it ``kubeconfig`` (or ``$KUBECONFIG``) is used.
        kube_token: Kubernetes bearer token (defaults to ``token``).
        kubeconfig: Path of a kubeconfig file.
        kube_context: Context inside the kubeconfig.
        verify: TLS verification for both APIs.
        ca_cert: CA bundle path for both APIs.
        retry: Retry policy of every call.
        clock: Epoch seconds; virtual in tests.
        sleep: Waits between polls and retries; a no-op or a virtual advance in tests.
        rng: Jitter source (seeded for reproducible tests).
        session: ``requests.Session`` for the Argo Server (tests hook contract checks into it).
        api_client: A ready ``kubernetes.client.ApiClient`` (overrides url/kubeconfig).
        template: Name of the WorkflowTemplate.
        grace_s: Seconds past the deadline before Argo kills a workflow.
        poll_s: Interval of the stop and resize waits.
        stop_timeout_s: Longest wait for a stopped workflow to end.
        resize_timeout_s: Longest wait for a resize to be applied.
        gpu_resource: The extended resource a GPU is on this cluster (``nvidia.com/gpu``,
            ``amd.com/gpu``...): what GPU jobs request and capacity counts.
    """

    def __init__(
        self,
        argo_url: str,
        *,
        token: str | None = None,
        namespace: str = manifests.NAMESPACE,
        kube_url: str | None = None,
        kube_token: str | None = None,
        kubeconfig: str | None = None,
        kube_context: str | None = None,
        verify: bool = True,
        ca_cert: str | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        session: requests.Session | None = None,
        api_client: Any = None,
        template: str = manifests.TEMPLATE_NAME,
        grace_s: float = manifests.DEFAULT_GRACE_S,
        poll_s: float = 1.0,
        stop_timeout_s: float = 120.0,
        resize_timeout_s: float = 30.0,
        gpu_resource: str = manifests.GPU_RESOURCE,
    ) -> None:
        """Build both API clients; no request is sent."""
        self.namespace = namespace
        self.gpu_resource = podspec.gpu_resource_name(gpu_resource)
        self.template = template
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.stop_timeout_s = stop_timeout_s
        self.resize_timeout_s = resize_timeout_s
        self._clock = clock
        self._sleep = sleep
        self.retrier = Retrier(retry or RetryPolicy(), clock, sleep, rng or random.Random(0))
        self.argo = ArgoServer(
            argo_url,
            token=token,
            namespace=namespace,
            verify=ca_cert or verify,
            retrier=self.retrier,
            session=session,
        )
        if api_client is None:
            if kube_url:
                api_client = api_client_from_url(
                    kube_url, token=kube_token or token, verify=verify, ca_cert=ca_cert
                )
            else:
                api_client = api_client_from_kubeconfig(kubeconfig, kube_context)
        self.kube = KubeApi(api_client, namespace=namespace, retrier=self.retrier)
        self._server_version: tuple[int, int] | None = None

    @classmethod
    def from_local(cls, local: Any, **kwargs: Any) -> ArgoCluster:
        """Connect to a ``qosflow.local.LocalCluster`` (``argo_url``, ``kube_url``, ``token``)."""
        return cls(
            local.argo_url,
            token=local.token,
            namespace=local.namespace,
            kube_url=local.kube_url,
            **kwargs,
        )

    @classmethod
    def from_env(
        cls,
        *,
        argo_url: str | None = None,
        kube_url: str | None = None,
        namespace: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> ArgoCluster:
        """Connect with the ``QOSFLOW_ARGO_*`` variables and ``KUBECONFIG``.

        Reads ``QOSFLOW_ARGO_URL``, ``QOSFLOW_ARGO_TOKEN``, ``QOSFLOW_NAMESPACE``,
        ``QOSFLOW_ARGO_CA``, and for the Kubernetes API ``QOSFLOW_KUBE_URL`` (with
        ``QOSFLOW_KUBE_TOKEN``, default the Argo token: what ``qosflow local up`` prints) or else
        ``KUBECONFIG``. ``argo_url``, ``kube_url``, ``namespace`` and ``token``, when given, win
        over their variables (a given ``token`` serves both APIs).

        Raises:
            SpecError: When no Argo Server URL is given and ``QOSFLOW_ARGO_URL`` is not set.
        """
        url = argo_url or os.environ.get("QOSFLOW_ARGO_URL")
        if not url:
            raise SpecError("QOSFLOW_ARGO_URL", "must be set to the Argo Server URL")
        return cls(
            url,
            token=token or os.environ.get("QOSFLOW_ARGO_TOKEN") or None,
            namespace=namespace or os.environ.get("QOSFLOW_NAMESPACE", manifests.NAMESPACE),
            kube_url=kube_url or os.environ.get("QOSFLOW_KUBE_URL") or None,
            kube_token=None if token else os.environ.get("QOSFLOW_KUBE_TOKEN") or None,
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            ca_cert=os.environ.get("QOSFLOW_ARGO_CA") or None,
            **kwargs,
        )

    def __repr__(self) -> str:
        """No credentials."""
        return f"ArgoCluster(argo={self.argo.url!r}, namespace={self.namespace!r})"

    def __enter__(self) -> ArgoCluster:
        """Use as a context manager."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the connection pools."""
        self.close()

    def close(self) -> None:
        """Close the connection pools."""
        self.kube.close()

    # ------------------------------------------------------------------ ClusterView

    def now(self) -> float:
        """Current epoch seconds (the injected clock)."""
        return self._clock()

    def capacity(self, unit: Unit) -> Capacity:
        """Node allocatable minus requests of non-terminal pods, per node and in total."""
        return free_capacity(
            unit,
            self.kube.list_nodes(),
            self.kube.list_active_pods(),
            gpu_resource=self.gpu_resource,
        )

    def status(self, name: str) -> JobStatus:
        """Status of one workflow; ``NotFoundError`` when it does not exist."""
        wf = self.argo.get_workflow(name)
        return self._status(wf)

    def _status(self, wf: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> JobStatus:
        phase = phase_of(wf)
        pod = None
        if not phase.finished or pods is not None:
            if pods is None:
                name = wf["metadata"]["name"]
                pods = self.kube.list_pods(f"{WORKFLOW_LABEL}={name}")
            pod = pod_for(wf, pods)
        resize = None
        if pod is not None:
            asked = manifests_units(wf)
            desired = pod_units({"spec": pod.get("spec")}, "cpu")
            if desired is not None and asked is not None and desired != asked:
                resize = resize_state(pod, desired)[0]
        return job_status(wf, pod, resize)

    def usage(self, pod_name: str, *, tail_lines: int = 200) -> list[UsageReport]:
        """The CPU usage a training pod reported in its log (:mod:`qosflow.core.usage`).

        ``[]`` when the pod wrote none (a training loop without qosflow's helpers) or its
        container has not started; other errors propagate like every call's.
        """
        try:
            text = self.kube.pod_log(pod_name, tail_lines=tail_lines)
        except ClusterError as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return []
            raise
        return usage_in_log(text)

    def list_jobs(self, job: str | None = None) -> list[JobStatus]:
        """All qosflow workflows of the namespace, optionally of one job."""
        selector = f"{LABEL_MANAGED}=true" + (f",{LABEL_JOB}={job}" if job else "")
        wfs = self.argo.list_workflows(selector)
        active = any(not phase_of(wf).finished for wf in wfs)
        pods = self.kube.list_pods() if active else []
        out = [self._status(wf, pods) for wf in wfs]
        return sorted(out, key=lambda s: (s.job, s.segment))

    # ------------------------------------------------------------------ Actuator

    def submit(self, request: SubmitRequest) -> JobStatus:
        """Create the segment's workflow, or return it when this very submit already made it.

        On 409 AlreadyExists the existing workflow is adopted only when it is the same submit
        (:func:`~qosflow_argo.adopt.check_same_submit`): same job and segment labels, and the same
        run identity in the plan annotation (a re-planned run re-attaches whatever it sized);
        without run identities, the same deadline annotation, submitted units and total steps.
        A job name reused on another run is refused, so yesterday's workflow is never taken for
        today's, and no second workflow is created.

        Raises:
            SpecError: The request makes an invalid manifest (nothing was sent).
            ClusterError: The server refused; or the name belongs to another job or another run
                of it (status 409, not retryable).
        """
        manifest = self.manifest(request)
        check_manifest(manifest)
        try:
            created = self.argo.create_workflow(manifest)
        except ClusterError as exc:
            if exc.status != 409:
                raise
            existing = self.argo.get_workflow(request.name)
            check_same_submit(existing, manifest, request)
            log.info("submit %s: already exists (the same submit), adopting it", request.name)
            return self._status(existing)
        log.info("submitted %s (%d %s)", request.name, request.units, request.unit)
        return job_status(created)

    def manifest(self, request: SubmitRequest) -> dict[str, Any]:
        """The Workflow ``submit`` would create for ``request`` (nothing is sent).

        Raises:
            SpecError: The request makes an invalid manifest, naming the job spec's field.
        """
        return manifests.workflow(
            request,
            namespace=self.namespace,
            now=self.now(),
            grace_s=self.grace_s,
            template=self.template,
            gpu_resource=self.gpu_resource,
        )

    def check_job(self, job: JobSpec, job_id: str) -> dict[str, Any]:
        """Refuse, before anything is submitted or promised, a job this cluster could not run.

        Renders segment 0's Workflow (:func:`manifests.first_segment`) and checks it: an image,
        a checkpoint on a persistent volume, pod settings Kubernetes accepts.

        Returns:
            The Workflow segment 0 would be.

        Raises:
            SpecError: Naming the job spec's field and why.
        """
        res = job.resources
        problem = job_problem(res.unit, res.levels, per_node=res.per_node, launcher=job.launcher)
        if problem is not None:
            raise SpecError(*problem)
        return self.manifest(manifests.first_segment(job, job_id))

    def stop(self, name: str, *, message: str = "") -> JobStatus:
        """Stop the workflow (SIGTERM → checkpoint → exit) and wait until it has ended.

        Raises:
            ClusterError: ``retryable=True`` when it has not ended within ``stop_timeout_s``.
        """
        current = self.status(name)
        if current.phase.finished:
            return current
        try:
            self.argo.stop_workflow(name, message or "qosflow: checkpoint-restart")
        except ClusterError as exc:
            if "completed workflow" not in str(exc):
                raise
        return self._wait(name, lambda s: s.phase.finished, self.stop_timeout_s, "to end")

    def _wait(
        self, name: str, done: Callable[[JobStatus], bool], timeout: float, what: str
    ) -> JobStatus:
        until = self._clock() + timeout
        while True:
            current = self.status(name)
            if done(current):
                return current
            if self._clock() >= until:
                raise ClusterError(
                    f"{name}: still {current.phase.value} after waiting {timeout:.0f}s {what}",
                    retryable=True,
                )
            self._sleep(self.poll_s)

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the Kubernetes API server, asked once; ``(0, 0)`` when unknown."""
        if self._server_version is None:
            try:
                self._server_version = self.kube.server_version()
            except NotFoundError:
                self._server_version = (0, 0)
        return self._server_version

    def supports_in_place_resize(self, unit: Unit) -> bool:
        """CPU only, on Kubernetes 1.33+ (the ``pods/resize`` subresource)."""
        return unit == "cpu" and self.server_version() >= (1, 33)

    def resize(self, name: str, units: int) -> ResizeResult:
        """Change the running pod's CPUs in place; report Done, InProgress, Deferred, Infeasible.

        Memory moves with the CPUs (``units × memory_per_unit``, see :mod:`qosflow_argo.resize`);
        it stays as it is when memory per unit cannot be derived, and when it would shrink on
        Kubernetes 1.33 (which forbids memory limit decreases without a restart).

        Raises:
            SpecError: ``units < 1``.
            ClusterError: No pod yet, or the API server refused the resize (e.g. 422, 403).
        """
        if units < 1:
            raise SpecError("units", f"must be >= 1 (got {units})")
        wf = self.argo.get_workflow(name)
        labels = wf.get("metadata", {}).get("labels") or {}
        if labels.get(manifests.LABEL_UNIT, "cpu") != "cpu":
            current = job_status(wf).units
            return ResizeResult(ResizeState.UNSUPPORTED, current, "only CPU resizes in place")
        if (wf.get("spec") or {}).get("entrypoint") in distributed.STEPS.values():
            current = job_status(wf).units
            why = "a torchrun segment's size is its pods: it rescales by checkpoint-restart"
            return ResizeResult(ResizeState.UNSUPPORTED, current, why)
        pod = pod_for(wf, self.kube.list_pods(f"{WORKFLOW_LABEL}={name}"))
        if pod is None or phase_of(wf).finished:
            raise ClusterError(f"{name}: no running pod to resize", retryable=True)
        pod_name = pod["metadata"]["name"]
        container = main_container(pod).get("name", "main")
        may_shrink = self.server_version() >= MEMORY_SHRINK_VERSION
        memory = resize_memory(wf, pod, units, may_shrink=may_shrink)
        try:
            self.kube.resize_pod(pod_name, resize_body(container, units, memory))
        except NotFoundError as exc:
            msg = f"the API server has no pods/resize (Kubernetes < 1.33?): {exc}"
            return ResizeResult(ResizeState.UNSUPPORTED, pod_units(pod, "cpu") or 0, msg)
        state, message, pod = self._follow_resize(pod_name, units)
        if state in (ResizeState.DONE, ResizeState.IN_PROGRESS):
            annotations = {manifests.ANNOTATION_UNITS: str(units)}
            self.kube.patch_workflow(name, {"metadata": {"annotations": annotations}})
        return ResizeResult(state, pod_units(pod, "cpu") or units, message)

    def _follow_resize(self, pod_name: str, units: int) -> tuple[ResizeState, str, dict[str, Any]]:
        until = self._clock() + self.resize_timeout_s
        while True:
            pod = self.kube.get_pod(pod_name)
            state, message = resize_state(pod, units)
            if state is not ResizeState.IN_PROGRESS or self._clock() >= until:
                return state, message, pod
            self._sleep(self.poll_s)

    def set_priority(
        self, name: str, *, priority: int, priority_class: str | None = None
    ) -> JobStatus:
        """Merge-patch ``spec.priority`` (and ``podPriorityClassName`` for pods created later)."""
        if not INT32[0] <= priority <= INT32[1]:
            raise SpecError("priority", f"must fit in int32 (got {priority})")
        spec: dict[str, Any] = {"priority": int(priority)}
        if priority_class:
            spec["podPriorityClassName"] = priority_class
        self.kube.patch_workflow(name, {"spec": spec})
        return self.status(name)

    # ------------------------------------------------------------------ install

    def ensure_installed(
        self,
        *,
        dry_run: bool = False,
        rbac: bool = False,
        checkpoint_claim: str | None = None,
        claim_size: str = "10Gi",
        claim_access_mode: str = "ReadWriteOnce",
        storage_class: str | None = None,
    ) -> dict[str, str]:
        """Create or update qosflow's install objects (idempotent; :class:`Installer`).

        Always the WorkflowTemplate and the PriorityClass ladder (with the ladder installed by an
        administrator, the runtime account needs no ``create``); with ``rbac`` the accounts, roles
        and bindings of :mod:`qosflow_argo.rbac` (an administrator's token); with
        ``checkpoint_claim`` a PersistentVolumeClaim of that name (``claim_size``,
        ``claim_access_mode``, ``storage_class``) when missing. ``dry_run`` only reads.

        Returns:
            ``Kind/name`` → ``created`` | ``updated`` | ``unchanged`` (``would be ...`` with
            ``dry_run``); a claim reports its state (``exists (Bound, 10Gi, ReadWriteOnce)``).

        Raises:
            LadderMissing: Ladder classes are missing and this account may not create them.
        """
        claim = None
        if checkpoint_claim:
            claim = manifests.checkpoint_claim(
                checkpoint_claim,
                self.namespace,
                size=claim_size,
                access_mode=claim_access_mode,
                storage_class=storage_class,
            )
        return Installer(self.argo, self.kube, dry_run=dry_run).ensure(
            self.namespace, self.template, rbac=rbac, claim=claim
        )


def manifests_units(wf: dict[str, Any]) -> int | None:
    """Units the workflow asked for at submit (its ``units`` argument)."""
    params = ((wf.get("spec") or {}).get("arguments") or {}).get("parameters") or []
    for p in params:
        if p.get("name") == "units" and str(p.get("value", "")).isdigit():
            return int(p["value"])
    return None
