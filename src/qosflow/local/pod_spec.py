"""The pod-level fields Argo's controller puts into a step's pod (``workflowpod.go``).

* Volumes (``addVolumeReferences``): all of the template's own ``volumes``, and of the workflow's
  ``spec.volumes`` only those a container mounts; a mount naming neither is the controller's
  error ``volume '<name>' not found in workflow spec`` (the node goes Error). Argo's own
  ``var-run-argo`` emptyDir is mounted at ``/var/run/argo`` in ``main``.
* Node selection (``addSchedulingConstraints``): ``nodeSelector``, ``affinity`` and
  ``tolerations`` of the template, else the workflow's; ``hostAliases`` of both;
  ``schedulerName`` and ``securityContext`` of the template, else the workflow's.
* ``serviceAccountName`` and ``automountServiceAccountToken`` of the template, else the
  workflow's; ``imagePullSecrets`` of the workflow.
* ``podMetadata`` (``addMetadata``): the workflow's pod labels and annotations, then the
  template's ``metadata`` over them.
* ``podSpecPatch`` (``ApplyPodSpecPatch``): the workflow's, then the template's, each a strategic
  merge patch of the pod spec (JSON or YAML; containers merge by name). A patch that does not
  decode as a PodSpec (a quantity that does not parse, say) fails the pod creation with
  ``Error applying PodSpecPatch: invalid podSpecPatch "...": ...``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from qosflow.local.admission import pod_spec_patch
from qosflow.local.patch import strategic_merge
from qosflow.local.pod_volumes import ARGO_VOLUME
from qosflow.local.quantity import parse as parse_quantity
from qosflow.local.sandbox import ARGO_PATH
from qosflow.local.status import ApiError
from qosflow.local.store import Obj
from qosflow.local.workflow import PodStep

ARGO_MOUNT = {"name": ARGO_VOLUME, "mountPath": ARGO_PATH}
_FIRST_OF = ("nodeSelector", "affinity", "tolerations", "schedulerName", "securityContext")
_OWN_OR_WORKFLOW = ("serviceAccountName", "automountServiceAccountToken")


def referenced_volumes(step: PodStep, mounts: list[Obj]) -> list[Obj]:
    """The pod's volumes: ``var-run-argo``, the template's, the workflow's that ``mounts`` name.

    Raises:
        ApiError: 400 with Argo's message for a mount of a volume nobody declares.
    """
    own = [copy.deepcopy(v) for v in step.template_fields.get("volumes") or []]
    shared = {str(v.get("name")): v for v in step.workflow_fields.get("volumes") or []}
    claims = {
        str(c.get("metadata", {}).get("name"))
        for c in step.workflow_fields.get("volumeClaimTemplates") or []
    }
    volumes = list(own)
    names = {str(v.get("name")) for v in own}
    for mount in mounts:
        name = str(mount.get("name"))
        if name in names:
            continue
        if name in shared:
            volumes.append(copy.deepcopy(shared[name]))
            names.add(name)
        elif name in claims:
            raise ApiError(
                400,
                f"volume '{name}' comes from spec.volumeClaimTemplates: the local cluster does not "
                "create claims for workflows (create a PersistentVolumeClaim and mount it with "
                "spec.volumes[].persistentVolumeClaim)",
            )
        else:
            raise ApiError(400, f"volume '{name}' not found in workflow spec")
    return [{"name": ARGO_VOLUME, "emptyDir": {}}, *volumes]


def pod_fields(step: PodStep) -> Obj:
    """Node selection, service account and pull secrets of the step's pod."""
    own, workflow = step.template_fields, step.workflow_fields
    fields: Obj = {}
    for key in (*_FIRST_OF, *_OWN_OR_WORKFLOW):
        value = own.get(key) if own.get(key) not in (None, "", [], {}) else workflow.get(key)
        if value not in (None, "", [], {}):
            fields[key] = copy.deepcopy(value)
    aliases = [*(workflow.get("hostAliases") or []), *(own.get("hostAliases") or [])]
    if aliases:
        fields["hostAliases"] = copy.deepcopy(aliases)
    if workflow.get("imagePullSecrets"):
        fields["imagePullSecrets"] = copy.deepcopy(workflow["imagePullSecrets"])
    return fields


def pod_metadata(step: PodStep) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations from ``podMetadata``, then the template's ``metadata``."""
    shared = step.workflow_fields.get("podMetadata") or {}
    labels = {**(shared.get("labels") or {}), **(step.metadata.get("labels") or {})}
    annotations = {**(shared.get("annotations") or {}), **(step.metadata.get("annotations") or {})}
    return (
        {str(k): str(v) for k, v in labels.items()},
        {str(k): str(v) for k, v in annotations.items()},
    )


def _decode_problem(doc: Obj) -> str | None:
    """Why Go could not decode a patch as a PodSpec (an unparsable quantity), or ``None``."""
    for kind in ("containers", "initContainers"):
        for container in doc.get(kind) or []:
            resources: Any = (container or {}).get("resources") or {}
            for section in ("requests", "limits"):
                for value in (resources.get(section) or {}).values():
                    try:
                        parse_quantity(value)
                    except ValueError as exc:
                        return str(exc).split(" (got", 1)[0]
    return None


def apply_pod_spec_patches(pod_spec: Obj, step: PodStep) -> Obj:
    """The step's podSpecPatches applied in Argo's order (workflow, then template).

    Raises:
        ApiError: 400 ``Error applying PodSpecPatch: ...`` (the pod is not created).
    """
    for text in step.pod_spec_patches:
        doc = pod_spec_patch(text, f"templates.{step.template}.podSpecPatch")
        problem = _decode_problem(doc)
        if problem is not None:
            raise ApiError(
                400,
                f"Error applying PodSpecPatch: invalid podSpecPatch {json.dumps(text)}: {problem}",
            )
        try:
            pod_spec = strategic_merge(pod_spec, doc)
        except ApiError as exc:
            raise ApiError(400, f"Error applying PodSpecPatch: {exc.message}") from None
    return pod_spec
