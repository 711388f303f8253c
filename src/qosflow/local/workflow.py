"""What a Workflow runs: template resolution, parameter substitution, lint, pod and node naming.

Pure functions over workflow documents. A Workflow that carries ``spec.workflowTemplateRef`` is
merged over the referenced WorkflowTemplate as Argo merges them, and ``spec.templateDefaults``
into each template (:mod:`qosflow.local.spec_merge`); then ``{{workflow.parameters.X}}``,
``{{inputs.parameters.X}}``, ``{{workflow.name}}``, ``{{workflow.namespace}}``,
``{{workflow.uid}}`` and ``{{pod.name}}`` are substituted, in the templates and in the
workflow-level fields that reach the pods (volumes, node selection, ``podSpecPatch``...). The
result is a :class:`Plan`: groups of container steps run one group after the other (a ``steps`` template's
step groups, a ``dag``'s dependency levels, or the single container of a container entrypoint).
Names follow Argo's v2 pod naming: node id ``<wf>-<fnv32a(node name)>``, pod ``<wf>-<template>-<same
hash>``, and the root node is named after the workflow. Planning checks every value the controller
will parse later (:mod:`qosflow.local.admission`), so a workflow that plans can run.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qosflow.local.admission import check_spec_literals, check_step, pod_spec_patch
from qosflow.local.names import field_name_problem
from qosflow.local.spec_merge import TEMPLATE_TYPES, join_workflow_spec, merge_template_defaults
from qosflow.local.status import ApiError, not_found

Obj = dict[str, Any]
TemplateLookup = Callable[[str], Obj | None]

WORKFLOW_POD_FIELDS = (
    "volumes",
    "nodeSelector",
    "affinity",
    "tolerations",
    "imagePullSecrets",
    "serviceAccountName",
    "automountServiceAccountToken",
    "schedulerName",
    "securityContext",
    "hostAliases",
    "podMetadata",
    "podSpecPatch",
    "podPriorityClassName",
    "volumeClaimTemplates",
)
"""Workflow-level fields Argo's controller copies into (or checks against) every pod."""
TEMPLATE_POD_FIELDS = (
    "volumes",
    "nodeSelector",
    "affinity",
    "tolerations",
    "serviceAccountName",
    "automountServiceAccountToken",
    "schedulerName",
    "securityContext",
    "hostAliases",
)
"""Template-level fields that override the workflow's on the template's pods."""
_VAR = re.compile(r"\{\{\s*([A-Za-z0-9_.\-]+)\s*\}\}")


def fnv32a(text: str) -> int:
    """The 32-bit FNV-1a hash Argo uses in node ids and pod names."""
    value = 0x811C9DC5
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def node_id(workflow: str, node_name: str) -> str:
    """Argo node id: the workflow name for the root, else ``<wf>-<fnv32a(node name)>``."""
    return workflow if node_name == workflow else f"{workflow}-{fnv32a(node_name)}"


def pod_name(workflow: str, node_name: str, template: str) -> str:
    """Argo v2 pod name: the workflow name for the root node, else ``<wf>-<template>-<hash>``."""
    if node_name == workflow:
        return workflow
    prefix = f"{workflow}-{template}"[: 253 - 1 - 10]
    return f"{prefix}-{fnv32a(node_name)}"


@dataclass(frozen=True, slots=True)
class PodStep:
    """One container step = one pod.

    Attributes:
        group: Index of the group it runs in.
        node_name: Argo node name (``wf``, ``wf[0].train`` or ``wf.train``).
        node_id: Argo node id.
        display_name: Node display name.
        template: Template name.
        pod: Pod name.
        container: The resolved container (command, args, env, resources...).
        metadata: The template's ``metadata`` (labels, annotations) after substitution.
        retry: The template's ``retryStrategy``, or ``None``.
        pod_spec_patches: The workflow's then the template's ``podSpecPatch`` (substituted), in
            the order Argo applies them.
        priority_class: The template's ``priorityClassName``, else the workflow's (substituted).
        template_fields: The template's pod-level fields (:data:`TEMPLATE_POD_FIELDS`).
        workflow_fields: The workflow's pod-level fields (:data:`WORKFLOW_POD_FIELDS`).
    """

    group: int
    node_name: str
    node_id: str
    display_name: str
    template: str
    pod: str
    container: Obj
    metadata: Obj
    retry: Obj | None = None
    pod_spec_patches: tuple[str, ...] = ()
    priority_class: str = ""
    template_fields: Obj = dataclasses.field(default_factory=dict)
    workflow_fields: Obj = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    """The pods of a workflow, in run order.

    Attributes:
        root_type: ``Pod`` (container entrypoint), ``Steps`` or ``DAG``.
        entrypoint: The entrypoint template name.
        groups: Groups of steps; a group starts when the previous one succeeded.
        spec: The effective (merged, substituted) workflow spec.
    """

    root_type: str
    entrypoint: str
    groups: tuple[tuple[PodStep, ...], ...]
    spec: Obj

    @property
    def steps(self) -> tuple[PodStep, ...]:
        """Every pod step, group by group."""
        return tuple(step for group in self.groups for step in group)


def _named(item: Any, where: str) -> str:
    """The ``name`` of a parameter, step or task (400 when it has none)."""
    name = item.get("name") if isinstance(item, dict) else None
    if name is None or name == "":
        raise ApiError(400, f"{where}.name is required")
    return str(name)


def _merge_arguments(base: list[Obj], override: list[Obj]) -> list[Obj]:
    """Parameters of ``override`` replace those of ``base`` with the same name."""
    merged = {_named(p, "arguments.parameters"): dict(p) for p in base}
    for param in override:
        name = _named(param, "arguments.parameters")
        merged[name] = {**merged.get(name, {}), **param}
    return list(merged.values())


def effective_spec(workflow: Obj, lookup: TemplateLookup) -> Obj:
    """The workflow spec merged over its ``workflowTemplateRef`` (404 when the template is missing)."""
    spec = copy.deepcopy(workflow.get("spec") or {})
    ref = spec.get("workflowTemplateRef")
    if not ref:
        return spec
    if spec.get("templates"):
        raise ApiError(
            400,
            "Templates is invalid field in spec if workflow referred WorkflowTemplate reference",
        )
    template = lookup(str(ref.get("name", "")))
    if template is None:
        raise not_found("workflowtemplates", str(ref.get("name", "")), group="argoproj.io")
    for param in (spec.get("arguments") or {}).get("parameters") or []:
        _named(param, "arguments.parameters")
    return join_workflow_spec(spec, copy.deepcopy(template.get("spec") or {}))


def _substitute(value: Any, variables: Mapping[str, str], strict_prefixes: tuple[str, ...]) -> Any:
    """Replace ``{{var}}`` in every string of ``value``; unknown strict variables are a 400."""
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return variables[name]
            if name.startswith(strict_prefixes):
                raise ApiError(400, f"failed to resolve {{{{{name}}}}}")
            return match.group(0)

        return _VAR.sub(repl, value)
    if isinstance(value, list):
        return [_substitute(v, variables, strict_prefixes) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, variables, strict_prefixes) for k, v in value.items()}
    return value


def _param_values(params: list[Obj], where: str) -> dict[str, str]:
    """Parameter name -> value (``value``, else ``default``); a missing value is a 400."""
    values: dict[str, str] = {}
    for param in params:
        name = _named(param, f"{where}.parameters")
        value = param.get("value", param.get("default"))
        if value is None:
            raise ApiError(400, f"{where}.{name}.value is required")
        values[name] = str(value)
    return values


def lint(spec: Obj, *, entrypoint_required: bool = True) -> dict[str, Obj]:
    """Argo's semantic checks of an effective spec; returns the templates by name.

    Args:
        spec: A workflow (or workflow template) spec.
        entrypoint_required: False for WorkflowTemplates, whose entrypoint may come later.

    Raises:
        ApiError: 400 with Argo's message when the spec is invalid.
    """
    templates: dict[str, Obj] = {}
    for template in spec.get("templates") or []:
        name = _named(template, "templates")
        problem = field_name_problem(name)
        if problem is not None:
            raise ApiError(400, f"templates.{name}.name {problem}")
        if name in templates:
            raise ApiError(400, f"templates.{name} name is not unique")
        kinds = [k for k in TEMPLATE_TYPES if template.get(k) is not None]
        if not kinds:
            raise ApiError(
                400,
                f"templates.{name} template type unspecified. choose one of: "
                + ", ".join(TEMPLATE_TYPES),
            )
        if len(kinds) > 1:
            raise ApiError(400, f"templates.{name} multiple template types specified")
        templates[name] = template
    check_spec_literals(spec)
    entry = spec.get("entrypoint")
    if not entry and entrypoint_required:
        raise ApiError(400, "spec.entrypoint is required")
    if entry and entry not in templates:
        raise ApiError(400, f"spec.entrypoint template name '{entry}' undefined")
    return templates


@dataclass(frozen=True, slots=True)
class _Context:
    """What planning one step needs: templates by name, variables, workflow-level pod fields."""

    templates: Mapping[str, Obj]
    base: Mapping[str, str]
    level: Obj
    defaults: Obj | None


def _container_step(template: Obj, inputs: Mapping[str, str], ctx: _Context, where: str) -> Obj:
    """A container template (``templateDefaults`` merged in) with its parameters resolved."""
    template = merge_template_defaults(template, ctx.defaults)
    if template.get("container") is None:
        raise ApiError(
            400,
            f"{where}: the local cluster runs container templates only "
            f"(template {template.get('name')!r} is not one)",
        )
    declared = (template.get("inputs") or {}).get("parameters") or []
    values = _param_values(
        _merge_arguments(declared, [{"name": k, "value": v} for k, v in inputs.items()]),
        f"{where}.inputs.parameters",
    )
    variables = {**ctx.base, **{f"inputs.parameters.{k}": v for k, v in values.items()}}
    resolved = dict(
        _substitute(template, variables, ("inputs.parameters.", "workflow.parameters."))
    )
    check_step(resolved, where)
    return resolved


def _step(wf: str, group: int, node: str, display: str, tmpl: Obj, level: Obj) -> PodStep:
    """Build a :class:`PodStep` (``{{pod.name}}`` resolved last).

    ``level`` holds the substituted workflow-level pod fields (:data:`WORKFLOW_POD_FIELDS`),
    the defaults of the template's own.
    """
    name = str(tmpl["name"])
    pod = pod_name(wf, node, name)
    tmpl = _substitute(tmpl, {"pod.name": pod}, ())
    level = _substitute(level, {"pod.name": pod}, ())
    patches = (str(level.get("podSpecPatch") or ""), str(tmpl.get("podSpecPatch") or ""))
    return PodStep(
        group=group,
        node_name=node,
        node_id=node_id(wf, node),
        display_name=display,
        template=name,
        pod=pod,
        container=dict(tmpl["container"]),
        metadata=dict(tmpl.get("metadata") or {}),
        retry=tmpl.get("retryStrategy"),
        pod_spec_patches=tuple(p for p in patches if p),
        priority_class=str(
            tmpl.get("priorityClassName") or level.get("podPriorityClassName") or ""
        ),
        template_fields={k: tmpl[k] for k in TEMPLATE_POD_FIELDS if tmpl.get(k) is not None},
        workflow_fields=level,
    )


def _args_of(item: Obj, base: Mapping[str, str]) -> dict[str, str]:
    """A step's or task's ``arguments.parameters`` with workflow variables substituted."""
    params = (item.get("arguments") or {}).get("parameters") or []
    resolved = _substitute(params, base, ("workflow.parameters.",))
    return {_named(p, "arguments.parameters"): str(p.get("value", "")) for p in resolved}


def _dag_levels(tasks: list[Obj]) -> list[list[Obj]]:
    """Tasks of a DAG grouped by dependency depth (400 on unknown names or cycles)."""
    by_name = {_named(t, "templates.dag.tasks"): t for t in tasks}
    depth: dict[str, int] = {}

    def level(name: str, seen: tuple[str, ...]) -> int:
        if name in seen:
            raise ApiError(400, f"templates: dependency cycle detected: {' -> '.join(seen)}")
        if name not in by_name:
            raise ApiError(400, f"templates: task dependency '{name}' not defined")
        if name not in depth:
            deps = by_name[name].get("dependencies") or []
            depth[name] = 1 + max((level(str(d), (*seen, name)) for d in deps), default=-1)
        return depth[name]

    levels: list[list[Obj]] = []
    for task in tasks:
        index = level(_named(task, "templates.dag.tasks"), ())
        levels.extend([] for _ in range(index + 1 - len(levels)))
        levels[index].append(task)
    return levels


def plan(workflow: Obj, spec: Obj) -> Plan:
    """The pods a workflow runs, from its effective spec (see :func:`effective_spec`)."""
    templates = lint(spec)
    meta = workflow["metadata"]
    wf = str(meta["name"])
    args = (spec.get("arguments") or {}).get("parameters") or []
    params = _param_values(args, "spec.arguments")
    base = {
        "workflow.name": wf,
        "workflow.namespace": str(meta.get("namespace", "")),
        "workflow.uid": str(meta.get("uid", "")),
        **{f"workflow.parameters.{k}": v for k, v in params.items()},
    }
    level = {k: spec[k] for k in WORKFLOW_POD_FIELDS if spec.get(k) is not None}
    level = dict(_substitute(level, base, ("workflow.parameters.",)))
    pod_spec_patch(level.get("podSpecPatch"), "spec.podSpecPatch")
    ctx = _Context(templates, base, level, spec.get("templateDefaults"))
    entry = str(spec["entrypoint"])
    root = templates[entry]
    if root.get("container") is not None:
        tmpl = _container_step(root, params, ctx, f"templates.{entry}")
        return Plan("Pod", entry, ((_step(wf, 0, wf, wf, tmpl, level),),), spec)
    groups: list[tuple[PodStep, ...]] = []
    if root.get("steps") is not None:
        for index, group in enumerate(root["steps"]):
            items = group if isinstance(group, list) else [group]
            groups.append(tuple(_child(wf, index, f"{wf}[{index}].", i, ctx) for i in items))
        return Plan("Steps", entry, tuple(groups), spec)
    if root.get("dag") is not None:
        levels = _dag_levels(list(root["dag"].get("tasks") or []))
        for index, tasks in enumerate(levels):
            groups.append(tuple(_child(wf, index, f"{wf}.", t, ctx) for t in tasks))
        return Plan("DAG", entry, tuple(groups), spec)
    raise ApiError(
        400, f"templates.{entry}: the local cluster runs container, steps and dag entrypoints only"
    )


def _child(wf: str, group: int, prefix: str, item: Obj, ctx: _Context) -> PodStep:
    """The pod step of one ``steps`` item or ``dag`` task."""
    name = _named(item, "templates.steps")
    problem = field_name_problem(name)
    if problem is not None:
        raise ApiError(400, f"templates.{name}.name {problem}")
    target = str(item.get("template", ""))
    if target not in ctx.templates:
        raise ApiError(400, f"templates.{name}.template '{target}' undefined")
    where = f"templates.{target}"
    tmpl = _container_step(ctx.templates[target], _args_of(item, ctx.base), ctx, where)
    return _step(wf, group, f"{prefix}{name}", name, tmpl, ctx.level)
