"""Argo ``retryStrategy`` semantics: which failures retry, how long to back off, attempt names.

A step with a retry strategy gets a ``Retry`` node whose children are the attempts
``<node>(0)``, ``<node>(1)``, ... each its own pod (``<wf>-<template>-<fnv32a(attempt name)>``).
A failed attempt is retried while ``limit`` allows, the ``retryPolicy`` covers the failure
(``Always``: Failed or Error; ``OnFailure``: Failed; ``OnError`` / ``OnTransientError``: Error), the
workflow is not shutting down, and ``backoff.maxDuration`` has not passed; the next attempt starts
``duration * factor**n`` seconds after attempt ``n`` finished.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from qosflow.local.workflow import PodStep, node_id, pod_name

_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(value: Any) -> float:
    """A Go duration (``10s``, ``1m30s``) or a number of seconds, in seconds."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration like 10s or 1m30s (got {value!r})")
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


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
