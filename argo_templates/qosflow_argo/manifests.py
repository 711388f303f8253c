"""Manifest builders: the ``qosflow-train`` WorkflowTemplate (hera), its Workflows, the ladder.

The Workflow that runs one job segment references the template; the PriorityClass ladder comes
from ``qosflow.core.priority.LADDER`` (RBAC is in :mod:`qosflow_argo.rbac`).

The WorkflowTemplate has two container templates that differ only in resources:

* ``train-cpu`` (the entrypoint): ``requests == limits``, ``cpu = units`` (Guaranteed QoS, so an
  in-place resize keeps the class) and ``resizePolicy: NotRequired`` for cpu and memory (Argo pods
  have ``restartPolicy: Never``, which forbids ``RestartContainer``);
* ``train-gpu``: ``<gpu_resource> = units`` (``nvidia.com/gpu`` by default, a workflow
  parameter for other vendors; GPUs cannot be resized in place).

**Resources come from each template's ``podSpecPatch``.** The Argo Server decodes a template into
Kubernetes' Go types, where a quantity must be a literal (``{{workflow.parameters.units}}`` as a
``cpu`` value fails the decode: "quantities must match the regular expression ..."); a
``podSpecPatch`` is a string, substituted first and applied when the pod is created, which is
Argo's documented way to parameterise resources (``docs/fields.md``: "allows parameterization of
container fields which are not strings (e.g. resource limits)").

The container runs ``exec <command>`` under ``/bin/sh -c`` so the command is one workflow parameter
and the trainer itself receives SIGTERM; trainer options arrive as ``QOSFLOW_*`` environment
variables. ``resume`` is ``true`` for a checkpoint-restart segment and ``auto`` otherwise, so a pod
retried by the ``retryStrategy`` resumes from its newest checkpoint (each job run keeps its own
folder on the checkpoint volume).

A job's own pod settings (its image, environment, volumes, placement, the checkpoint volume) are
fields of the *Workflow* (:mod:`qosflow_argo.podspec`): ``spec.volumes``, ``nodeSelector``,
``tolerations``, ``affinity``, ``imagePullSecrets``, ``serviceAccountName``, ``podMetadata``, and
``templateDefaults.container`` for the container's ``env``, ``envFrom``, ``volumeMounts`` and
``imagePullPolicy``, which Argo merges into the template's container (its ``env`` by name).

The ``retryStrategy`` (:data:`RETRY_LIMIT` retries, backoff :data:`RETRY_BACKOFF`) has no
``backoff.maxDuration``: Argo counts that from the *first* attempt's start, so a bound of minutes
would never retry a segment that trained longer than that. The bound is the job's deadline
instead: every segment's Workflow carries ``activeDeadlineSeconds`` (deadline − submit time +
grace), and Argo v4 starts no retry past the workflow's deadline ("retry exceeded workflow
deadline", ``processNodeRetries`` in ``workflow/controller/operator.go``). A best-effort segment
(no deadline) is bounded by the retry limit alone.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from qosflow import __version__
from qosflow.core.cluster import (
    ANNOTATION_DEADLINE,
    ANNOTATION_PLAN,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_SEGMENT,
    SubmitRequest,
)
from qosflow.core.errors import SpecError
from qosflow.core.spec import JobSpec
from qosflow_argo import distributed, podspec

TEMPLATE_NAME = "qosflow-train"
NAMESPACE = "qosflow"
CLIENT_ACCOUNT = "qosflow"
EXECUTOR_ACCOUNT = "qosflow-executor"
LABEL_UNIT = "qosflow.dev/unit"
ANNOTATION_UNITS = "qosflow.dev/units"
ENTRYPOINT = {"cpu": "train-cpu", "gpu": "train-gpu"}
GPU_RESOURCE = "nvidia.com/gpu"
"""The default GPU resource name (``ArgoCluster(gpu_resource=...)`` names another vendor's)."""
REFERENCE_IMAGE = f"qosflow-trainer:{__version__}"
"""What ``trainer/Dockerfile`` builds (push it to a registry the cluster can pull from)."""
DEFAULT_GRACE_S = 1800.0
TERMINATION_GRACE_S = 60
RETRY_LIMIT = 3
RETRY_BACKOFF: dict[str, Any] = {"duration": "10s", "factor": 2}
"""Waits of 10 s, 20 s, 40 s between the attempts; no ``maxDuration`` (see the module docstring)."""

PARAMETERS: dict[str, str] = {
    "job": "qosflow-job",
    "segment": "0",
    "steps": "1000",
    "resume": "auto",
    "units": "1",
    "memory": "2Gi",
    "pods": "1",
    "nproc": "1",
    "start_timeout": "600",
    "gpu_resource": GPU_RESOURCE,
    "image": REFERENCE_IMAGE,
    "command": "python -m qosflow_trainer",
    "checkpoint_dir": "/var/lib/qosflow/checkpoints",
    "checkpoint_every": "500",
    "seed": "0",
}
ENV: dict[str, str] = {
    "QOSFLOW_TOTAL_STEPS": "steps",
    "QOSFLOW_RESUME": "resume",
    "QOSFLOW_CHECKPOINT_DIR": "checkpoint_dir",
    "QOSFLOW_CHECKPOINT_EVERY": "checkpoint_every",
    "QOSFLOW_SEED": "seed",
    "QOSFLOW_JOB": "job",
    "QOSFLOW_SEGMENT": "segment",
}
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QTY = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<suffix>[A-Za-z]*)$")


def _param(name: str) -> str:
    return "{{workflow.parameters.%s}}" % name  # noqa: UP031 - braces would need escaping


def resources_patch(resources: dict[str, str]) -> str:
    """The template's ``podSpecPatch``: the main container's requests and limits (equal)."""
    both = {"requests": dict(resources), "limits": dict(resources)}
    patch = {"containers": [{"name": "main", "resources": both}]}
    return json.dumps(patch, separators=(",", ":"))


def _container_template(name: str, resources: dict[str, str], *, resizable: bool) -> Any:
    from hera.workflows import Container, Env, RetryStrategy
    from hera.workflows.models import Backoff, ContainerResizePolicy

    policy = (
        [
            ContainerResizePolicy(resource_name="cpu", restart_policy="NotRequired"),
            ContainerResizePolicy(resource_name="memory", restart_policy="NotRequired"),
        ]
        if resizable
        else None
    )
    return Container(
        name=name,
        image=_param("image"),
        command=["/bin/sh", "-c", "exec " + _param("command")],
        env=[Env(name=var, value=_param(p)) for var, p in ENV.items()],
        pod_spec_patch=resources_patch(resources),
        resize_policy=policy,
        labels={LABEL_JOB: _param("job"), LABEL_SEGMENT: _param("segment"), LABEL_MANAGED: "true"},
        annotations={"workflows.argoproj.io/progress": "0/" + _param("steps")},
        retry_strategy=RetryStrategy(
            limit=RETRY_LIMIT, retry_policy="Always", backoff=Backoff(**RETRY_BACKOFF)
        ),
    )


def workflow_template(namespace: str = NAMESPACE) -> dict[str, Any]:
    """The ``qosflow-train`` WorkflowTemplate as a dict (built with hera)."""
    from hera.workflows import Parameter, WorkflowTemplate

    memory = _param("memory")
    with WorkflowTemplate(
        name=TEMPLATE_NAME,
        namespace=namespace,
        entrypoint=ENTRYPOINT["cpu"],
        labels={LABEL_MANAGED: "true"},
        annotations={"qosflow.dev/description": "one qosflow training segment"},
        arguments=[Parameter(name=k, value=v) for k, v in PARAMETERS.items()],
        pod_priority_class_name="qosflow-normal",
        service_account_name=EXECUTOR_ACCOUNT,
        pod_spec_patch='{"terminationGracePeriodSeconds": %d}' % TERMINATION_GRACE_S,  # noqa: UP031
    ) as template:
        units = _param("units")
        _container_template(ENTRYPOINT["cpu"], {"cpu": units, "memory": memory}, resizable=True)
        gpu = _param("gpu_resource")
        _container_template(ENTRYPOINT["gpu"], {gpu: units, "memory": memory}, resizable=False)
    doc: dict[str, Any] = template.to_dict()
    doc["spec"]["templates"] += _multi_pod_templates(units, memory, gpu)
    return doc


def _multi_pod_templates(units: str, memory: str, gpu: str) -> list[dict[str, Any]]:
    """The templates of a multi-pod segment (:mod:`qosflow_argo.distributed`)."""
    env = [{"name": var, "value": _param(p)} for var, p in ENV.items()]
    labels = {LABEL_JOB: _param("job"), LABEL_SEGMENT: _param("segment"), LABEL_MANAGED: "true"}
    retry = {"limit": RETRY_LIMIT, "retryPolicy": "Always", "backoff": dict(RETRY_BACKOFF)}
    return [
        distributed.steps_template("cpu"),
        distributed.steps_template("gpu"),
        distributed.rendezvous_template(),
        distributed.worker_template("cpu", {"cpu": units, "memory": memory}, env, labels, retry),
        distributed.worker_template("gpu", {gpu: units, "memory": memory}, env, labels, retry),
    ]


def memory_for(memory_per_unit: str, units: int) -> str:
    """``units`` × a Kubernetes quantity, keeping its suffix (``2Gi`` × 3 → ``6Gi``)."""
    match = _QTY.match(memory_per_unit.strip())
    if match is None:
        raise SpecError("memory_per_unit", f"not a Kubernetes quantity (got {memory_per_unit!r})")
    total = (Decimal(match["num"]) * units).normalize()
    return f"{total:f}{match['suffix']}"


def deadline_text(deadline: float) -> str:
    """The ``qosflow.dev/deadline`` annotation: RFC 3339 UTC, or ``none`` for best effort."""
    if not math.isfinite(deadline):
        return "none"
    return datetime.fromtimestamp(deadline, tz=UTC).isoformat().replace("+00:00", "Z")


def _check_request(request: SubmitRequest) -> None:
    """The request's own fields, then what the segment needs to run (an image, a checkpoint)."""
    if request.launcher != "torchrun" and (request.unit == "worker" or request.layout.pods > 1):
        raise SpecError(
            "launcher",
            f"{request.units} {request.unit} units are {request.layout.pods} pods: a data-parallel "
            "job (launcher: torchrun); one process runs in one pod",
        )
    if not _LABEL.match(request.job) or len(request.name) > 63:
        raise SpecError(
            "job",
            f"must be an RFC 1123 label whose workflow name {request.name!r} fits the 63 "
            f"characters of a label value (got {request.job!r})",
        )
    if request.units < 1 or request.total_steps < 1 or request.checkpoint_every_steps < 1:
        raise SpecError("units", "units, total_steps and checkpoint_every_steps must be >= 1")
    podspec.check_request(request)


def workflow(
    request: SubmitRequest,
    *,
    namespace: str,
    now: float,
    grace_s: float = DEFAULT_GRACE_S,
    template: str = TEMPLATE_NAME,
    gpu_resource: str = GPU_RESOURCE,
) -> dict[str, Any]:
    """The Workflow that runs one segment: a ``workflowTemplateRef``, arguments, pod settings.

    The result is checked against Argo's schema (strict: a typo in a volume or a toleration is
    an error), and an error names the job spec's field (``pod.tolerations[0].operator``).

    Args:
        request: The segment to launch.
        namespace: Namespace of the workflow.
        now: Current epoch seconds (``activeDeadlineSeconds`` counts from here).
        grace_s: Seconds past the deadline before Argo kills the workflow.
        template: Name of the WorkflowTemplate.
        gpu_resource: Extended resource a GPU is (``nvidia.com/gpu``, ``amd.com/gpu``...).

    Raises:
        SpecError: For a unit kind the template cannot run, bad sizes, no image, a checkpoint
            that would be lost, or pod settings Kubernetes would refuse.
    """
    from hera.workflows import Parameter, Workflow
    from hera.workflows.models import WorkflowTemplateRef

    _check_request(request)
    lay = request.layout
    values = {
        "job": request.job,
        "segment": str(request.segment),
        "steps": str(request.total_steps),
        "resume": "true" if request.resume else "auto",
        "units": str(lay.per_pod),
        "memory": memory_for(request.memory_per_unit, lay.units_per_pod),
        "pods": str(lay.pods),
        "nproc": str(lay.per_pod if lay.resource == "gpu" else 1),
        "gpu_resource": podspec.gpu_resource_name(gpu_resource),
        "image": str(request.image),
        "command": shlex.join(request.command),
        "checkpoint_dir": request.checkpoint_dir,
        "checkpoint_every": str(request.checkpoint_every_steps),
    }
    if request.launcher == "torchrun":
        entrypoint: str | None = distributed.STEPS[lay.resource]
    else:
        entrypoint = ENTRYPOINT[lay.resource] if lay.resource != "cpu" else None
    deadline = request.deadline
    active = max(1, math.ceil(deadline - now + grace_s)) if math.isfinite(deadline) else None
    wf = Workflow(
        name=request.name,
        namespace=namespace,
        labels={
            LABEL_JOB: request.job,
            LABEL_SEGMENT: str(request.segment),
            LABEL_MANAGED: "true",
            LABEL_UNIT: request.unit,
        },
        annotations={
            ANNOTATION_DEADLINE: deadline_text(deadline),
            ANNOTATION_PLAN: request.plan,
            ANNOTATION_UNITS: str(request.units),
        },
        workflow_template_ref=WorkflowTemplateRef(name=template),
        entrypoint=entrypoint,
        arguments=[Parameter(name=k, value=v) for k, v in values.items()],
        priority=int(request.priority),
        pod_priority_class_name=request.priority_class,
        active_deadline_seconds=active,
    )
    doc: dict[str, Any] = wf.to_dict()
    doc["spec"].update(podspec.workflow_fields(request))
    podspec.check_workflow(doc)
    return doc


def first_segment(job: JobSpec, job_id: str) -> SubmitRequest:
    """Segment 0 of ``job`` at its smallest size (what the plan step checks before it promises).

    The checkpoint folder is ``<checkpoint.path>/<job_id>`` (``""`` without a checkpoint, which
    :func:`workflow` refuses).
    """
    res = job.resources
    return SubmitRequest(
        job=job_id,
        segment=0,
        units=res.min,
        unit=res.unit,
        total_steps=job.total_steps,
        resume=False,
        priority_class="qosflow-normal",
        priority=0,
        image=job.image,
        command=job.command,
        memory_per_unit=res.memory_per_unit,
        deadline=job.deadline,
        checkpoint_dir=job.checkpoint.folder(job_id) if job.checkpoint else "",
        checkpoint_every_steps=job.checkpoint_every_steps,
        pod=job.pod,
        checkpoint=job.checkpoint,
        launcher=job.launcher,
        per_node=res.per_node,
        worker_unit=res.worker_unit,
        per_worker=res.per_worker,
    )


def checkpoint_claim(
    name: str,
    namespace: str = NAMESPACE,
    *,
    size: str = "10Gi",
    access_mode: str = "ReadWriteOnce",
    storage_class: str | None = None,
) -> dict[str, Any]:
    """The PersistentVolumeClaim jobs keep their checkpoints on (each run has its own folder).

    ``qosflow argo install --checkpoint-claim NAME`` creates it when missing.

    ``ReadWriteOnce`` serves one pod at a time, which a qosflow job is (a checkpoint-restart
    stops the old pod before the new one starts); ``ReadWriteMany`` lets jobs on several nodes
    share one claim. Without ``storage_class`` the cluster's default class provisions it.
    """
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {LABEL_MANAGED: "true"}},
        "spec": spec,
    }


def priority_classes() -> list[dict[str, Any]]:
    """The PriorityClass ladder of ``qosflow.core.priority.LADDER``; only preempting classes preempt."""
    from qosflow.core.priority import LADDER

    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": k.name, "labels": {LABEL_MANAGED: "true"}},
            "value": int(k.value),
            "preemptionPolicy": "PreemptLowerPriority" if k.preempts else "Never",
            "globalDefault": False,
            "description": k.description,
        }
        for k in LADDER
    ]
