"""The Kubernetes version the local cluster emulates (``LocalCluster(kubernetes_version=...)``).

What depends on it: ``GET /version``; the ``pods/{name}/resize`` subresource, which exists from
1.33 on (before, a resize is a 404 and clients rescale by checkpoint-restart); the emulation fields
of ``/version`` (1.33+); and the null ``creationTimestamp`` of review answers (omitted from 1.34).
"""

from __future__ import annotations

from typing import Any

from qosflow.local.errors import LocalClusterError

DEFAULT_KUBERNETES_VERSION = "1.35"
RESIZE_MINOR = 33
"""The first minor with the ``pods/{name}/resize`` subresource (beta, on by default)."""


def kubernetes_minor(version: str) -> int:
    """The minor of a ``1.N`` version string (``"1.35"`` -> 35; ``v1.32.4`` is accepted).

    Raises:
        LocalClusterError: For anything but ``1.N`` with 20 <= N <= 99.
    """
    text = str(version).strip().removeprefix("v")
    parts = text.split(".")
    if len(parts) not in (2, 3) or parts[0] != "1" or not all(p.isdigit() for p in parts[1:]):
        raise LocalClusterError(f"kubernetes_version: must look like 1.35 (got {version!r})")
    minor = int(parts[1])
    if not 20 <= minor <= 99:
        raise LocalClusterError(f"kubernetes_version: must be 1.20 or later (got {version!r})")
    return minor


def version_info(minor: int) -> dict[str, Any]:
    """The body of ``GET /version`` for Kubernetes ``1.<minor>``."""
    info: dict[str, Any] = {"major": "1", "minor": str(minor)}
    if minor >= RESIZE_MINOR:  # 1.33 added the compatibility-version fields
        info.update(
            emulationMajor="1",
            emulationMinor=str(minor),
            minCompatibilityMajor="1",
            minCompatibilityMinor=str(minor - 1),
        )
    info.update(
        gitVersion=f"v1.{minor}.0-qosflow-local",
        gitCommit="",
        gitTreeState="clean",
        buildDate="2026-08-21T00:00:00Z",
        goVersion="go1.24",
        compiler="gc",
        platform="linux/amd64",
    )
    return info
