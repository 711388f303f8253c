"""The multi-pod segment: a rendezvous daemon and N worker pods, with nothing but Argo.

A data-parallel job (``launcher: torchrun``) runs each segment as the steps template
``train-workers-<cpu|gpu>``:

1. ``rendezvous``, a **daemon step**: ``python -m qosflow_trainer.rendezvous`` hosts the c10d
   store on its pod IP, port :data:`RDZV_PORT`; the step counts as done once a TCP readiness probe
   on that port passes, and Argo ends the daemon when the steps template ends;
2. ``worker``, fanned out with ``withSequence`` over ``pods``: each pod runs
   ``python -m qosflow_trainer.launch <command>``, which execs torchrun with the rendezvous at
   ``{{steps.rendezvous.ip}}:29400`` (every worker a client of the store, so all are equal), its
   rank hint, the world size and its own pod IP as its address. Workers whose peers cannot all
   start give up after ``start_timeout`` seconds (torchrun's rendezvous join timeout): the segment
   fails and releases every pod rather than hold a partial allocation.

So nothing beyond Argo is installed on the cluster: no operator, no Service (the daemon's IP is
known to later steps). A checkpoint-restart segment is the same template with another ``pods``.
Each worker's resources come from its template's ``podSpecPatch`` (Argo decodes resources as
literal quantities), ``units`` being *per pod* here; the rendezvous requests memory only (a CPU
request would take a share of a node the workers are sized to fill).

How the same job maps onto a JobSet for teams that run one: docs/real-cluster.md.
"""

from __future__ import annotations

import json
from typing import Any

RDZV_PORT = 29400
STEPS = {"cpu": "train-workers-cpu", "gpu": "train-workers-gpu"}
WORKER = {"cpu": "worker-cpu", "gpu": "worker-gpu"}
RENDEZVOUS = "rendezvous"


def _param(name: str) -> str:
    return "{{workflow.parameters.%s}}" % name  # noqa: UP031 - braces would need escaping


def _pod_ip() -> dict[str, Any]:
    """The pod's own address: the rendezvous binds it, torchrun's agent announces it."""
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def steps_template(kind: str) -> dict[str, Any]:
    """``train-workers-<kind>``: the rendezvous daemon, then ``pods`` workers side by side."""
    arguments = [
        {"name": "rank", "value": "{{item}}"},
        {"name": "rdzv", "value": "{{steps.%s.ip}}" % RENDEZVOUS},  # noqa: UP031
    ]
    return {
        "name": STEPS[kind],
        "steps": [
            [{"name": RENDEZVOUS, "template": RENDEZVOUS}],
            [
                {
                    "name": "worker",
                    "template": WORKER[kind],
                    "withSequence": {"count": _param("pods")},
                    "arguments": {"parameters": arguments},
                }
            ],
        ],
    }


def rendezvous_template() -> dict[str, Any]:
    """The daemon that hosts the c10d store for the segment's workers."""
    return {
        "name": RENDEZVOUS,
        "daemon": True,
        "container": {
            "name": "main",
            "image": _param("image"),
            "command": ["python", "-m", "qosflow_trainer.rendezvous"],
            "env": [_pod_ip(), {"name": "QOSFLOW_RDZV_PORT", "value": str(RDZV_PORT)}],
            "ports": [{"containerPort": RDZV_PORT, "name": "rendezvous"}],
            "readinessProbe": {"tcpSocket": {"port": RDZV_PORT}, "periodSeconds": 1},
            "resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        },
        "metadata": {
            "labels": {"qosflow.dev/job": _param("job"), "qosflow.dev/role": "rendezvous"}
        },
    }


def worker_template(
    kind: str,
    resources: dict[str, str],
    env: list[dict[str, Any]],
    labels: dict[str, str],
    retry: dict[str, Any],
) -> dict[str, Any]:
    """One worker pod of ``kind`` (its resources per pod from ``resources``, by podSpecPatch)."""
    both = {"requests": dict(resources), "limits": dict(resources)}
    patch = {"containers": [{"name": "main", "resources": both}]}
    worker_env = [
        *env,
        {"name": "QOSFLOW_RANK", "value": "{{inputs.parameters.rank}}"},
        {"name": "QOSFLOW_RDZV_ENDPOINT", "value": "{{inputs.parameters.rdzv}}:%d" % RDZV_PORT},  # noqa: UP031
        {"name": "QOSFLOW_RDZV_ID", "value": f"{_param('job')}-s{_param('segment')}"},
        {"name": "QOSFLOW_NNODES", "value": _param("pods")},
        {"name": "QOSFLOW_NPROC_PER_NODE", "value": _param("nproc")},
        {"name": "QOSFLOW_RDZV_JOIN_TIMEOUT", "value": _param("start_timeout")},
        _pod_ip(),
    ]
    return {
        "name": WORKER[kind],
        "inputs": {"parameters": [{"name": "rank"}, {"name": "rdzv"}]},
        "podSpecPatch": json.dumps(patch, separators=(",", ":")),
        "container": {
            "name": "main",
            "image": _param("image"),
            "command": [
                "/bin/sh",
                "-c",
                "exec python -m qosflow_trainer.launch " + _param("command"),
            ],
            "env": worker_env,
        },
        "metadata": {
            "labels": {**labels, "qosflow.dev/rank": "{{inputs.parameters.rank}}"},
            "annotations": {"workflows.argoproj.io/progress": f"0/{_param('steps')}"},
        },
        "retryStrategy": dict(retry),
    }
