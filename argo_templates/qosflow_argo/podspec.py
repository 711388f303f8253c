"""A job's pod settings as fields of its segment Workflows, and errors that name the spec's field.

The settings go on the Workflow, not into the WorkflowTemplate, so one installed template serves
every job (``qosflow argo check`` can tell whether it is current):

* pod-level fields as Workflow fields Argo copies onto every pod: ``volumes``, ``nodeSelector``,
  ``tolerations``, ``affinity``, ``imagePullSecrets``, ``serviceAccountName`` and
  ``podMetadata`` (labels and annotations);
* container-level fields in ``templateDefaults.container``, which Argo merges into the
  template's container by strategic merge (``mergedTemplateDefaultsInto``: the template's own
  ``env`` stays, the job's variables are added by name; ``volumeMounts`` merge by mount path):
  ``env``, ``envFrom``, ``volumeMounts`` (the job's and the checkpoint volume's) and
  ``imagePullPolicy``. Argo's schema requires an ``image`` in a container, so the job's image is
  repeated there (the template's ``{{workflow.parameters.image}}`` is the same value and wins).

The user's Kubernetes objects are passed through as written, never through hera's models (which
drop unknown keys silently): the strict Argo schema (:mod:`qosflow_argo.contract`) then catches a
misspelt key, and :func:`check_workflow` reports it as the job spec's field
(``pod.volumes[0].persistentVolumeClaim: Additional properties are not allowed ...``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from qosflow.core.cluster import SubmitRequest
from qosflow.core.errors import SpecError
from qosflow.core.pod import checkpoint_problem
from qosflow_argo.contract import manifest_error

_CONTAINER = ("spec", "templateDefaults", "container")
JOB_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((*_CONTAINER, "env"), "pod.env"),
    ((*_CONTAINER, "envFrom"), "pod.env_from"),
    ((*_CONTAINER, "volumeMounts"), "pod.volume_mounts"),
    ((*_CONTAINER, "imagePullPolicy"), "pod.image_pull_policy"),
    ((*_CONTAINER, "image"), "image"),
    (("spec", "volumes"), "pod.volumes"),
    (("spec", "nodeSelector"), "pod.node_selector"),
    (("spec", "tolerations"), "pod.tolerations"),
    (("spec", "affinity"), "pod.affinity"),
    (("spec", "imagePullSecrets"), "pod.image_pull_secrets"),
    (("spec", "serviceAccountName"), "pod.service_account_name"),
    (("spec", "podMetadata", "labels"), "pod.labels"),
    (("spec", "podMetadata", "annotations"), "pod.annotations"),
)
"""Workflow field → the job spec's field it comes from (the longest prefix wins)."""
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def gpu_resource_name(name: str) -> str:
    """``name`` when it is an extended resource name like ``nvidia.com/gpu``.

    Raises:
        SpecError: Field ``gpu_resource``, when it is not ``<domain>/<name>`` outside
            Kubernetes' own ``kubernetes.io`` domain.
    """
    domain = name.partition("/")[0]
    if not _RESOURCE_NAME.match(name) or len(name) > 253 or domain.endswith("kubernetes.io"):
        raise SpecError(
            "gpu_resource",
            "must be an extended resource name like nvidia.com/gpu or amd.com/gpu, as the "
            f"device plugin advertises it in the nodes' allocatable (got {name!r})",
        )
    return name


def check_request(request: SubmitRequest) -> None:
    """What a segment needs before it can run: an image and a checkpoint that survives the pod.

    Raises:
        SpecError: Naming ``image``, ``checkpoint`` or ``checkpoint.volume`` and why.
    """
    if not request.image:
        raise SpecError(
            "image",
            "is required: the job names no image and the connection sets no default image. "
            "Build the reference trainer image (trainer/Dockerfile, see docs/trainer.md) or name "
            "your own training image, with `image:` in the job or `image` on the connection",
        )
    checkpoint = request.checkpoint
    problem = checkpoint_problem(request.pod, checkpoint)
    if problem is not None or checkpoint is None:
        raise problem or SpecError("checkpoint", "is required")
    root = checkpoint.path.rstrip("/")
    if not request.checkpoint_dir.startswith(root + "/"):
        raise SpecError(
            "checkpoint_dir",
            f"must lie on the checkpoint volume, under {root}/ (got {request.checkpoint_dir!r})",
        )


def _container(request: SubmitRequest) -> dict[str, Any]:
    """``templateDefaults.container``: image, mounts (the checkpoint's last), env, pull policy."""
    pod, checkpoint = request.pod, request.checkpoint
    mounts = [dict(m) for m in pod.volume_mounts]
    if checkpoint is not None:
        mounts.append({"name": checkpoint.volume, "mountPath": checkpoint.path})
    container: dict[str, Any] = {"image": str(request.image), "volumeMounts": mounts}
    if pod.env:
        container["env"] = [dict(e) for e in pod.env]
    if pod.env_from:
        container["envFrom"] = [dict(e) for e in pod.env_from]
    if pod.image_pull_policy:
        container["imagePullPolicy"] = pod.image_pull_policy
    return container


def workflow_fields(request: SubmitRequest) -> dict[str, Any]:
    """The Workflow spec fields that carry the job's pod settings (see the module docstring)."""
    pod = request.pod
    meta = {k: dict(v) for k, v in (("labels", pod.labels), ("annotations", pod.annotations)) if v}
    optional: dict[str, Any] = {
        "nodeSelector": dict(pod.node_selector or {}),
        "tolerations": [dict(t) for t in pod.tolerations or ()],
        "affinity": dict(pod.affinity or {}),
        "imagePullSecrets": [{"name": n} for n in pod.image_pull_secrets or ()],
        "serviceAccountName": pod.service_account_name,
        "podMetadata": meta,
    }
    fields: dict[str, Any] = {
        "templateDefaults": {"container": _container(request)},
        "volumes": [dict(v) for v in pod.volumes],
    }
    fields.update({k: v for k, v in optional.items() if v})
    return fields


def _dotted(parts: Sequence[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def job_field(path: Sequence[Any], doc: dict[str, Any]) -> str:
    """The job spec's field behind a Workflow field path (``spec.volumes.0`` → ``pod.volumes[0]``).

    The checkpoint volume's mount (the last mount) is ``checkpoint.path``. A path that no job
    field produces is named as the Workflow's own (qosflow rendered it: a bug to report).
    """
    parts = list(path)
    for prefix, name in sorted(JOB_FIELDS, key=lambda f: -len(f[0])):
        if tuple(parts[: len(prefix)]) == prefix:
            rest = parts[len(prefix) :]
            if name == "pod.volume_mounts" and rest and isinstance(rest[0], int):
                mounts = doc["spec"]["templateDefaults"]["container"]["volumeMounts"]
                if rest[0] == len(mounts) - 1:
                    return "checkpoint.path"
            return name + _dotted(rest)
    meta = doc.get("metadata") or {}
    return f"Workflow/{meta.get('name', '?')}: " + _dotted(parts).lstrip(".")


def check_workflow(doc: dict[str, Any]) -> None:
    """Validate a segment's Workflow; an error names the job spec's field and the rule.

    Raises:
        SpecError: ``pod.tolerations[0]: Additional properties are not allowed ...``.
    """
    error = manifest_error(doc)
    if error is not None:
        raise SpecError(job_field(list(error.absolute_path), doc), error.message)
