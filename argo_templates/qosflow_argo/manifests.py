"""Manifest builders: the ``qosflow-train`` WorkflowTemplate (hera), its Workflows, the ladder.

The Workflow that runs one job segment references the template; the PriorityClass ladder comes
from ``qosflow.core.priority.LADDER`` (RBAC is in :mod:`qosflow_argo.rbac`).

The WorkflowTemplate has two container templates that differ only in resources:

* ``train-cpu`` (the entrypoint): ``requests == limits``, ``cpu = units`` (Guaranteed QoS, so an
  in-place resize keeps the class) and ``resizePolicy: NotRequired`` for cpu and memory (Argo pods
  have ``restartPolicy: Never``, which forbids ``RestartContainer``);
* ``train-gpu``: ``nvidia.com/gpu = units`` (GPUs cannot be resized in place).

The container runs ``exec <command>`` under ``/bin/sh -c`` so the command is one workflow parameter
and the trainer itself receives SIGTERM; trainer options arrive as ``QOSFLOW_*`` environment
variables. ``resume`` is ``true`` for a checkpoint-restart segment and ``auto`` otherwise, so a pod
retried by the ``retryStrategy`` resumes from its newest checkpoint (use a fresh ``checkpoint_dir``
per job run).

The ``retryStrategy`` (:data:`RETRY_LIMIT` retries, backoff :data:`RETRY_BACKOFF`) has no
``backoff.maxDuration``: Argo counts that from the *first* attempt's start, so a bound of minutes
would never retry a segment that trained longer than that. The bound is the job's deadline
instead: every segment's Workflow carries ``activeDeadlineSeconds`` (deadline − submit time +
grace), and Argo v4 starts no retry past the workflow's deadline ("retry exceeded workflow
deadline", ``processNodeRetries`` in ``workflow/controller/operator.go``). A best-effort segment
(no deadline) is bounded by the retry limit alone.
"""

from __future__ import annotations

import math
import re
import shlex
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from qosflow.core.cluster import (
    ANNOTATION_DEADLINE,
    ANNOTATION_PLAN,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_SEGMENT,
    SubmitRequest,
)
from qosflow.core.errors import SpecError

TEMPLATE_NAME = "qosflow-train"
NAMESPACE = "qosflow"
CLIENT_ACCOUNT = "qosflow"
EXECUTOR_ACCOUNT = "qosflow-executor"
LABEL_UNIT = "qosflow.dev/unit"
ANNOTATION_UNITS = "qosflow.dev/units"
ENTRYPOINT = {"cpu": "train-cpu", "gpu": "train-gpu"}
GPU_RESOURCE = "nvidia.com/gpu"
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
    "image": "python:3.11-slim",
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


def _container_template(name: str, resources: dict[str, str], *, resizable: bool) -> Any:
    from hera.workflows import Container, Env, RetryStrategy
    from hera.workflows.models import (
        Backoff,
        ContainerResizePolicy,
        Quantity,
        ResourceRequirements,
    )

    quantities = {k: Quantity(v) for k, v in resources.items()}
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
        resources=ResourceRequirements(requests=quantities, limits=dict(quantities)),
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
        _container_template(
            ENTRYPOINT["gpu"], {GPU_RESOURCE: units, "memory": memory}, resizable=False
        )
    doc: dict[str, Any] = template.to_dict()
    return doc


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


def workflow(
    request: SubmitRequest,
    *,
    namespace: str,
    now: float,
    grace_s: float = DEFAULT_GRACE_S,
    template: str = TEMPLATE_NAME,
) -> dict[str, Any]:
    """The Workflow that runs one segment: a ``workflowTemplateRef`` plus arguments.

    Args:
        request: The segment to launch.
        namespace: Namespace of the workflow.
        now: Current epoch seconds (``activeDeadlineSeconds`` counts from here).
        grace_s: Seconds past the deadline before Argo kills the workflow.
        template: Name of the WorkflowTemplate.

    Raises:
        SpecError: For a unit kind the template cannot run, or bad sizes.
    """
    from hera.workflows import Parameter, Workflow
    from hera.workflows.models import WorkflowTemplateRef

    if request.unit not in ENTRYPOINT:
        raise SpecError(
            "resources.unit",
            f"{TEMPLATE_NAME} runs one pod of cpu or gpu units (got {request.unit!r})",
        )
    if not _LABEL.match(request.job) or len(request.name) > 63:
        raise SpecError(
            "job", f"must be an RFC 1123 label of at most 60 characters (got {request.job!r})"
        )
    if request.units < 1 or request.total_steps < 1 or request.checkpoint_every_steps < 1:
        raise SpecError("units", "units, total_steps and checkpoint_every_steps must be >= 1")
    values = {
        "job": request.job,
        "segment": str(request.segment),
        "steps": str(request.total_steps),
        "resume": "true" if request.resume else "auto",
        "units": str(request.units),
        "memory": memory_for(request.memory_per_unit, request.units),
        "image": request.image,
        "command": shlex.join(request.command),
        "checkpoint_dir": request.checkpoint_dir,
        "checkpoint_every": str(request.checkpoint_every_steps),
    }
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
        entrypoint=ENTRYPOINT[request.unit] if request.unit != "cpu" else None,
        arguments=[Parameter(name=k, value=v) for k, v in values.items()],
        priority=int(request.priority),
        pod_priority_class_name=request.priority_class,
        active_deadline_seconds=active,
    )
    doc: dict[str, Any] = wf.to_dict()
    return doc


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
