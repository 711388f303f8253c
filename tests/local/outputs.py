"""A host folder a real-process pod works in, so a test can read what the pod wrote.

A pod's own file system is gone when it ends (as on Kubernetes), so tests of real processes give
the pod a hostPath volume as its ``workingDir`` and read the host folder behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qosflow.local import LocalCluster


def with_output(request: dict[str, Any], name: str) -> dict[str, Any]:
    """Run the pod of a one-template request in ``/out``, a hostPath volume (see :func:`out_dir`)."""
    spec = request["workflow"]["spec"]
    spec["volumes"] = [{"name": "out", "hostPath": {"path": f"/out/{name}"}}]
    container = spec["templates"][0]["container"]
    container["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    container["workingDir"] = "/out"
    return request


def out_dir(cluster: LocalCluster | Path, name: str) -> Path:
    """The host folder behind ``/out`` of the pods of :func:`with_output` ``(…, name)``.

    ``cluster`` is the cluster or its state directory.
    """
    state = cluster if isinstance(cluster, Path) else cluster.state_dir
    return state.resolve() / "volumes" / "hostpath" / "out" / name
