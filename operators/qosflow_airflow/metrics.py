"""qosflow's metrics, sent through Airflow's own stats client.

A deployment already tells Airflow where its metrics go (``[metrics] statsd_on`` or ``otel_on``,
the host, the name prefix, the allow and block lists), so qosflow opens no connection of its own:
every value goes through ``airflow.sdk.observability.stats``, the client Airflow configures in
each of its processes (the task runner at a task's start, every other process when it first
imports ``airflow.sdk.serde``, which the triggerer and ``dag.test()`` do at start-up). Metrics off
means Airflow's no-op logger; nothing here ever raises into a task or a trigger.

Every name is under ``qosflow.`` and carries the job's history key: as the tag ``job_key`` where
the backend has tags (OpenTelemetry, Datadog, StatsD with ``statsd_influxdb_enabled``), as the last
segment of the name otherwise (plain StatsD: ``qosflow.units.nightly-retrain``), the way Airflow's
own per-DAG names carry the DAG id. The other dimensions (``how``, ``outcome``) follow the same
rule, before the key. A key is cut to the characters every backend accepts.

The metrics (each emitted where the thing happens; see docs/airflow.md, "Metrics"):

* gauges, every poll of a watch: ``units``, ``predicted_finish_seconds``, ``slack_seconds``;
* counters: ``decisions.<kind>`` (a watch's event), ``rescales`` (an action that changed the
  job's size or segment), ``jobs_finished`` and ``guarantee_violations`` (the finish step), with
  the gauge ``lateness_seconds``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Literal, ParamSpec

if TYPE_CHECKING:
    from types import ModuleType

    from qosflow.core.cluster import JobStatus
    from qosflow.core.decide import Decision
    from qosflow_airflow.watch import EndWatch, WatchEvent

PREFIX = "qosflow"
"""The first segment of every qosflow metric (Airflow's ``statsd_prefix``/``otel_prefix`` comes
before it)."""
KEY_TAG = "job_key"
"""The tag that carries the job's history key where the backend has tags."""
MAX_SEGMENT = 100
"""The longest key segment: Airflow refuses StatsD names over 250 characters."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_LOG = logging.getLogger(__name__)
P = ParamSpec("P")


@dataclass(slots=True)
class _Process:
    """What this process learnt of Airflow's ``[metrics]`` config (read once per process).

    ``warned``: a metric could not be sent and it said so (once per configuration).
    """

    pid: int = -1
    tags: bool = False
    warned: bool = False


_PROCESS = _Process()


def configure() -> None:
    """Re-initialise Airflow's stats client from Airflow's ``[metrics]`` config, now.

    Airflow reads the config when a process starts; a process whose config changed since (a test
    that points StatsD at its own listener) calls this, as Airflow's task runner does at start.
    """
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

    legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
    stats.initialize(factory=get_stats_factory(), export_legacy_names=legacy)
    _PROCESS.pid, _PROCESS.warned = -1, False  # re-read the tag rule; warn again once


def _backend_has_tags() -> bool:
    """Whether the backend Airflow picks (its own order of precedence) keeps tags."""
    from airflow.sdk.configuration import conf

    def on(key: str) -> bool:
        return bool(conf.getboolean("metrics", key, fallback=False))

    if on("statsd_datadog_enabled"):
        return True
    return on("statsd_influxdb_enabled") if on("statsd_on") else on("otel_on")


def _client() -> ModuleType:
    """Airflow's stats client; the tag rule of this process is read on first use."""
    from airflow.sdk.observability import stats

    if _PROCESS.pid != os.getpid():
        _PROCESS.tags, _PROCESS.pid = _backend_has_tags(), os.getpid()
    return stats


def segment(value: str) -> str:
    """``value`` as one name segment or tag value every backend accepts.

    Anything but letters, digits, ``_`` and ``-`` becomes ``_`` (a ``.`` would split the StatsD
    hierarchy; ``,`` and ``=`` break InfluxDB tags); a long value is cut, with a hash of the
    whole so two long keys stay apart.
    """
    safe = _UNSAFE.sub("_", value) or "_"
    if len(safe) <= MAX_SEGMENT:
        return safe
    digest = hashlib.sha1(value.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{safe[: MAX_SEGMENT - 9]}-{digest}"


def stat_name(
    name: str, job_key: str, dims: dict[str, str], *, tags: bool
) -> tuple[str, dict[str, str] | None]:
    """The stat name and tags of ``qosflow.<name>`` for one job, by the backend's tag rule."""
    values = {k: segment(v) for k, v in dims.items()}
    key = segment(job_key)
    if tags:
        return f"{PREFIX}.{name}", {**values, KEY_TAG: key}
    return ".".join([PREFIX, name, *values.values(), key]), None


def _failed(what: str, exc: Exception) -> None:
    """Log a metric that could not be sent: a warning the first time, then at debug level."""
    level = logging.DEBUG if _PROCESS.warned else logging.WARNING
    _PROCESS.warned = True
    _LOG.log(level, "qosflow metric %s not sent: %s", what, exc)


def _quiet(fn: Callable[P, None]) -> Callable[P, None]:
    """Make an emission function swallow (and log) any error: metrics never fail a task."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            _failed(fn.__name__, exc)

    return run


def _send(
    kind: Literal["gauge", "incr"], name: str, value: float, job_key: str, **dims: str
) -> None:
    """Send one value; a failure is logged and swallowed (the next value is still sent)."""
    try:
        stats = _client()
        stat, tags = stat_name(name, job_key, dims, tags=_PROCESS.tags)
        if kind == "gauge":
            stats.gauge(stat, value, tags=tags)
        else:
            stats.incr(stat, count=int(value), tags=tags)
    except Exception as exc:  # metrics never fail a task or a trigger
        _failed(name, exc)


@_quiet
def predicted(job_key: str, decision: Decision, *, now: float) -> None:
    """A watch's prediction: ``predicted_finish_seconds`` and ``slack_seconds`` (gauges).

    The decision's median finish (at its target size: the current one unless it resizes); a
    watch with no steady speed yet predicts nothing and sends nothing.
    """
    finish = decision.median_finish
    if not math.isfinite(finish):
        return
    _send("gauge", "predicted_finish_seconds", finish - now, job_key)
    if math.isfinite(decision.deadline):
        _send("gauge", "slack_seconds", decision.deadline - finish, job_key)


def kind_of(decision: Decision, *, paused: bool = False) -> str:
    """The decision's kind for ``decisions.<kind>``: its action, or ``pause``/``resume``."""
    action = str(decision.action)
    if action in ("scale_down", "scale_up", "at_risk") and decision.units == 0:
        return "pause"
    if paused and decision.units > 0 and action in ("scale_up", "at_risk"):
        return "resume"
    return action


@_quiet
def polled(watcher: EndWatch, status: JobStatus, event: WatchEvent | None) -> None:
    """One poll of a watch: the ``units`` gauge, and ``decisions.<kind>`` when it fired."""
    paused = bool(getattr(watcher, "paused", False))
    units = 0 if paused or status.phase.finished else status.units
    key = watcher.spec.key
    _send("gauge", "units", units, key)
    if event is not None and event.decision is not None:
        _send("incr", f"decisions.{segment(kind_of(event.decision, paused=paused))}", 1, key)


@_quiet
def rescaled(job_key: str, how: str) -> None:
    """An action changed the job's size or segment: ``rescales``, by ``how``.

    ``how`` is ``in_place``, ``restart`` (a checkpoint-restart, also a bump's), ``resume`` or
    ``pause``; a queued workflow's priority patch changes neither and is not counted.
    """
    _send("incr", "rescales", 1, job_key, how=how)


@_quiet
def job_finished(job_key: str, *, met: bool, lateness_s: float, guaranteed: bool) -> None:
    """The job ended: ``jobs_finished`` by ``outcome``, ``lateness_seconds``, violations.

    ``outcome`` is ``met`` or ``missed``; a guaranteed job that missed also counts one
    ``guarantee_violations``. The finish step calls this once the job has ended.

    Args:
        job_key: The job's history key.
        met: Whether it finished by its deadline.
        lateness_s: Finish minus deadline (negative: early).
        guaranteed: Whether its plan promised the deadline.
    """
    _send("incr", "jobs_finished", 1, job_key, outcome="met" if met else "missed")
    if math.isfinite(lateness_s):
        _send("gauge", "lateness_seconds", lateness_s, job_key)
    if guaranteed and not met:
        _send("incr", "guarantee_violations", 1, job_key)
