"""How Argo's controller merges specs: a Workflow over its WorkflowTemplate, defaults into templates.

Both are Kubernetes strategic merges over the JSON of Go structs (``strategicpatch.StrategicMergePatch``
with the ``patchMergeKey`` tags of Argo's types), so:

* :func:`join_workflow_spec` (``util.JoinWorkflowSpec``): the WorkflowTemplate's spec is the
  original and the Workflow's the patch, so the Workflow wins field by field; maps merge; the lists
  ``templates``, ``volumes``, ``imagePullSecrets`` and ``arguments.parameters`` merge by ``name``,
  ``tolerations`` by ``key``, ``hostAliases`` by ``ip``; other lists are replaced.
* :func:`merge_template_defaults` (``mergedTemplateDefaultsInto``): ``spec.templateDefaults`` is
  the original and the template the patch; the defaults' template-type fields (``container``,
  ``steps``...) other than the template's own type are dropped first. A container's ``env``
  merges by ``name``, ``volumeMounts`` by ``mountPath``; ``envFrom`` (no merge key) is replaced.

Go's encoder leaves out empty fields (``omitempty``), so a ``null`` or an empty list never
overrides here either (:func:`omit_empty`; an empty string does, as Argo's string pointers such
as parameter values do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qosflow.local.patch import strategic_merge
from qosflow.local.store import Obj

ARGO_MERGE_KEYS: Mapping[str, str] = {
    "templates": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "tolerations": "key",
    "hostAliases": "ip",
    "parameters": "name",
    "artifacts": "name",
    "tasks": "name",
    "initContainers": "name",
    "sidecars": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}
"""``patchMergeKey`` tags of Argo's ``WorkflowSpec`` and ``Template`` (and of the Container)."""
TEMPLATE_TYPES = (
    "container",
    "containerSet",
    "steps",
    "dag",
    "script",
    "resource",
    "data",
    "suspend",
    "http",
    "plugin",
)


def omit_empty(value: Any) -> Any:
    """``value`` without ``null`` and ``[]`` fields (Go's ``omitempty``).

    An empty object stays: Argo's structs are pointers there (``emptyDir: {}`` is a volume).
    """
    if isinstance(value, dict):
        kept = {k: omit_empty(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != []}
    if isinstance(value, list):
        return [omit_empty(v) for v in value]
    return value


def join_workflow_spec(workflow_spec: Obj, template_spec: Obj) -> Obj:
    """A Workflow's spec merged over its WorkflowTemplate's (the Workflow wins)."""
    own = omit_empty({k: v for k, v in workflow_spec.items() if k != "workflowTemplateRef"})
    merged: Obj = strategic_merge(omit_empty(template_spec), own, "", ARGO_MERGE_KEYS)
    return merged


def template_type(template: Obj) -> str:
    """The type of a template (its one template-type field), or ``""``."""
    return next((k for k in TEMPLATE_TYPES if template.get(k) is not None), "")


def merge_template_defaults(template: Obj, defaults: Obj | None) -> Obj:
    """``spec.templateDefaults`` merged into one template (the template wins)."""
    if not defaults:
        return template
    own = template_type(template)
    applicable = {k: v for k, v in defaults.items() if k not in TEMPLATE_TYPES or k == own}
    merged: Obj = strategic_merge(omit_empty(applicable), omit_empty(template), "", ARGO_MERGE_KEYS)
    return merged
