"""What the controller runs: pod steps, skipped steps and the plan of a workflow; Argo's names.

A :class:`Plan` is made from a workflow's spec by :func:`qosflow.local.workflow.plan`: groups of
:class:`PodStep` (one pod each; a group starts when the one before is fulfilled) and the
:class:`Skipped` steps of empty fan-outs. Names follow Argo's: node id ``<wf>-<fnv32a(node
name)>``, v2 pod name ``<wf>-<template>-<same hash>``, the root node named after the workflow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qosflow.local.expansion import EMPTY, fill

Obj = dict[str, Any]


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
        daemon: The template is a daemon (``daemon: true``).
        step: The step's (or task's) name as written, before any fan-out.
        inputs: The template's input parameters with their values (the node's ``inputs``).
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
    daemon: bool = False
    step: str = ""
    inputs: tuple[tuple[str, str], ...] = ()


def resolve_step(step: PodStep, variables: Mapping[str, str]) -> PodStep:
    """``step`` with the run-time variables of earlier steps (``{{steps.x.ip}}``) filled in."""
    return dataclasses.replace(
        step,
        container=fill(step.container, variables),
        metadata=fill(step.metadata, variables),
        pod_spec_patches=tuple(fill(list(step.pod_spec_patches), variables)),
        template_fields=fill(step.template_fields, variables),
        inputs=tuple((k, str(fill(v, variables))) for k, v in step.inputs),
    )


@dataclass(frozen=True, slots=True)
class Skipped:
    """A step whose fan-out is empty: a ``Skipped`` node, no pod.

    Attributes:
        group: Index of its group.
        node_name: Argo node name.
        display_name: Node display name.
        message: The node's message (``Skipped, empty params``).
    """

    group: int
    node_name: str
    display_name: str
    message: str = EMPTY


@dataclass(frozen=True, slots=True)
class Plan:
    """The pods of a workflow, in run order.

    Attributes:
        root_type: ``Pod`` (container entrypoint), ``Steps`` or ``DAG``.
        entrypoint: The entrypoint template name.
        groups: Groups of steps; a group starts when the previous one succeeded.
        spec: The effective (merged, substituted) workflow spec.
        skipped: Steps whose fan-out is empty, by group.
    """

    root_type: str
    entrypoint: str
    groups: tuple[tuple[PodStep, ...], ...]
    spec: Obj
    skipped: tuple[Skipped, ...] = ()

    @property
    def steps(self) -> tuple[PodStep, ...]:
        """Every pod step, group by group."""
        return tuple(step for group in self.groups for step in group)
