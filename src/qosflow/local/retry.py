"""Argo ``retryStrategy`` semantics: which failures retry, how long to back off, attempt names.

A step with a retry strategy gets a ``Retry`` node whose children are the attempts
``<node>(0)``, ``<node>(1)``, ... each its own pod (``<wf>-<template>-<fnv32a(attempt name)>``).
A failed attempt is retried while ``limit`` allows, the ``retryPolicy`` covers the failure
(``Always``: Failed or Error; ``OnFailure``: Failed; ``OnError`` / ``OnTransientError``: Error), the
workflow is not shutting down, and ``backoff.maxDuration`` has not passed; the next attempt starts
``duration * factor**n`` seconds after attempt ``n`` finished. The values were checked when the
workflow was planned (:func:`qosflow.local.admission.check_retry`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from qosflow.local.admission import duration_s
from qosflow.local.workflow import PodStep, node_id, pod_name

__all__ = ["attempt", "backoff_s", "duration_s", "may_retry", "retries_on"]


def retries_on(strategy: dict[str, Any], phase: str) -> bool:
    """Whether the policy retries an attempt that ended in ``phase``."""
    policy = strategy.get("retryPolicy") or "OnFailure"
    if policy == "Always":
        return phase in ("Failed", "Error")
    if policy == "OnFailure":
        return phase == "Failed"
    return phase == "Error"


def may_retry(strategy: dict[str, Any], phase: str, attempts: int, elapsed_s: float) -> bool:
    """Whether another attempt is allowed after ``attempts`` attempts over ``elapsed_s`` seconds."""
    limit = strategy.get("limit")
    if limit is not None and attempts > int(limit):
        return False
    backoff = strategy.get("backoff") or {}
    max_s = duration_s(backoff.get("maxDuration"))
    if max_s and elapsed_s > max_s:
        return False
    return retries_on(strategy, phase)


def backoff_s(strategy: dict[str, Any], failed_attempt: int) -> float:
    """Seconds to wait after attempt ``failed_attempt`` (0-based) before the next one."""
    backoff = strategy.get("backoff") or {}
    base = duration_s(backoff.get("duration"))
    factor = float(backoff.get("factor") or 1)
    return base * factor**failed_attempt


def attempt(step: PodStep, index: int, workflow: str) -> PodStep:
    """The pod step of attempt ``index`` of a retried step."""
    name = f"{step.node_name}({index})"
    return dataclasses.replace(
        step,
        node_name=name,
        node_id=node_id(workflow, name),
        display_name=f"{step.display_name}({index})",
        pod=pod_name(workflow, name, step.template),
    )
