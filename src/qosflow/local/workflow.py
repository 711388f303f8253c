"""What a Workflow runs: template resolution, parameter substitution, lint, pod and node naming.

Pure functions over workflow documents. A Workflow that carries ``spec.workflowTemplateRef`` is
merged over the referenced WorkflowTemplate as Argo merges them, and ``spec.templateDefaults``
into each template (:mod:`qosflow.local.spec_merge`); then ``{{workflow.parameters.X}}``,
``{{inputs.parameters.X}}``, ``{{workflow.name}}``, ``{{workflow.namespace}}``,
``{{workflow.uid}}`` and ``{{pod.name}}`` are substituted, in the templates and in the
workflow-level fields that reach the pods (volumes, node selection, ``podSpecPatch``...). The
result is a :class:`Plan`: groups of container steps run one group after the other (a ``steps`` template's
step groups, a ``dag``'s dependency levels, or the single container of a container entrypoint).
A step or task with ``withItems`` / ``withSequence`` fans out into one pod step per item
(:mod:`qosflow.local.expansion`); a ``daemon: true`` template's step is a daemon
(:mod:`qosflow.local.daemons`). ``{{steps.NAME.ip}}`` and the other variables of earlier steps are
left in place: the controller fills them when it makes the pods.
Names follow Argo's v2 pod naming: node id ``<wf>-<fnv32a(node name)>``, pod ``<wf>-<template>-<same
hash>``, and the root node is named after the workflow. Planning checks every value the controller
will parse later (:mod:`qosflow.local.admission`), so a workflow that plans can run.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qosflow.local.admission import check_spec_literals, check_step, pod_spec_patch
from qosflow.local.expansion import check_references, expand, scope_names
from qosflow.local.names import field_name_problem
from qosflow.local.pod_steps import (
    Plan,
    PodStep,
    Skipped,
    fnv32a,
    node_id,
    pod_name,
    resolve_step,
)
from qosflow.local.spec_merge import TEMPLATE_TYPES, join_workflow_spec, merge_template_defaults
from qosflow.local.status import ApiError, not_found

__all__ = [
    "Plan",
    "PodStep",
    "Skipped",
    "effective_spec",
    "fnv32a",
    "lint",
    "node_id",
    "plan",
    "pod_name",
    "resolve_step",
]

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


def _container_step(
    template: Obj, inputs: Mapping[str, str], ctx: _Context, where: str
) -> tuple[Obj, tuple[tuple[str, str], ...]]:
    """A container template (``templateDefaults`` merged in) with its parameters resolved.

    Returns the template and its declared input parameters with their values.
    """
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
    names = [_named(p, f"{where}.inputs.parameters") for p in declared]
    return resolved, tuple((name, values[name]) for name in names)


def _step(
    wf: str,
    group: int,
    node: str,
    display: str,
    tmpl: Obj,
    level: Obj,
    *,
    step: str = "",
    inputs: tuple[tuple[str, str], ...] = (),
) -> PodStep:
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
        daemon=tmpl.get("daemon") is True,
        step=step or display,
        inputs=inputs,
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
        tmpl, inputs = _container_step(root, params, ctx, f"templates.{entry}")
        step = _step(wf, 0, wf, wf, tmpl, level, inputs=inputs)
        return Plan("Pod", entry, ((step,),), spec)
    if root.get("steps") is not None:
        rows = [g if isinstance(g, list) else [g] for g in root["steps"]]
        return _grouped(wf, ("Steps", entry), rows, ctx, spec)
    if root.get("dag") is not None:
        levels = _dag_levels(list(root["dag"].get("tasks") or []))
        return _grouped(wf, ("DAG", entry), levels, ctx, spec)
    raise ApiError(
        400, f"templates.{entry}: the local cluster runs container, steps and dag entrypoints only"
    )


def _grouped(
    wf: str, root: tuple[str, str], rows: list[list[Obj]], ctx: _Context, spec: Obj
) -> Plan:
    """The plan of a steps or dag entrypoint: its groups (levels), fanned out.

    A step may use the variables of the steps of earlier groups only (``{{steps.x.ip}}`` of a
    daemon), as Argo's validation checks it.
    """
    kind, entry = root
    scope = "steps" if kind == "Steps" else "tasks"
    groups: list[tuple[PodStep, ...]] = []
    skipped: list[Skipped] = []
    known: list[str] = []
    for index, items in enumerate(rows):
        prefix = f"{wf}[{index}]." if kind == "Steps" else f"{wf}."
        group: list[PodStep] = []
        for item in items:
            where = f"templates.{entry}.{scope}[{index}].{_named(item, f'templates.{scope}')}"
            check_references(item, known, f"templates.{entry}.{scope}")
            steps, empty = _children(wf, (index, prefix), item, ctx, where)
            for step in steps:
                check_references(_pod_fields(step), known, f"templates.{step.template}:")
            group.extend(steps)
            skipped.extend(empty)
        for item in items:
            target = ctx.templates.get(str(item.get("template", ""))) or {}
            daemon = target.get("daemon") is True
            known += scope_names(scope, str(item["name"]), daemon=daemon)
        groups.append(tuple(group))
    return Plan(kind, entry, tuple(groups), spec, tuple(skipped))


def _pod_fields(step: PodStep) -> Obj:
    """What of a step reaches its pod (where run-time variables may still be)."""
    return {
        "container": step.container,
        "metadata": step.metadata,
        "patches": step.pod_spec_patches,
    }


def _children(
    wf: str, at: tuple[int, str], item: Obj, ctx: _Context, where: str
) -> tuple[list[PodStep], list[Skipped]]:
    """The pod steps of one ``steps`` item or ``dag`` task (one per item when it fans out)."""
    group, prefix = at
    name = _named(item, "templates.steps")
    problem = field_name_problem(name)
    if problem is not None:
        raise ApiError(400, f"templates.{name}.name {problem}")
    target = str(item.get("template", ""))
    if target not in ctx.templates:
        raise ApiError(400, f"templates.{name}.template '{target}' undefined")
    item = dict(_substitute(item, ctx.base, ("workflow.parameters.",)))
    expanded = expand(item, where)
    if expanded is None:
        return [_child(wf, (group, prefix), (name, name), item, ctx)], []
    if not expanded:
        return [], [Skipped(group, f"{prefix}{name}", name)]
    return [_child(wf, (group, prefix), (child, name), one, ctx) for child, one in expanded], []


def _child(
    wf: str, at: tuple[int, str], names: tuple[str, str], item: Obj, ctx: _Context
) -> PodStep:
    """The pod step of one (expanded) step or task: ``names`` is (its name, the step's name)."""
    group, prefix = at
    name, step = names
    target = str(item.get("template", ""))
    where = f"templates.{target}"
    tmpl, inputs = _container_step(ctx.templates[target], _args_of(item, ctx.base), ctx, where)
    return _step(wf, group, f"{prefix}{name}", name, tmpl, ctx.level, step=step, inputs=inputs)
