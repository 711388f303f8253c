"""The embedded local cluster: an emulated Argo Server + Kubernetes API on loopback.

Pods run as real local processes (CPU requests become CPU affinity, in-place resize re-pins them,
stop sends SIGTERM then SIGKILL after the grace period), or as scripted pods on a virtual clock for
fast deterministic tests. See ``docs/local-cluster.md`` for what it emulates and what it does not.
"""

from __future__ import annotations

from qosflow.local.clock import VirtualClock, WallClock
from qosflow.local.cluster import LocalCluster
from qosflow.local.faults import FaultPlan, FaultRule
from qosflow.local.runner import ProcessRunner
from qosflow.local.scripted import Script, ScriptedRunner

__all__ = [
    "FaultPlan",
    "FaultRule",
    "LocalCluster",
    "ProcessRunner",
    "Script",
    "ScriptedRunner",
    "VirtualClock",
    "WallClock",
]
