"""Targets of the ArgoCluster contract suite.

By default the suite runs against the embedded local cluster (virtual clock, scripted pods). With
``QOSFLOW_ARGO_URL``, ``QOSFLOW_ARGO_TOKEN`` and ``KUBECONFIG`` set it runs the same tests against a
real Argo Server + Kubernetes (fault-injection tests are skipped there). Every request ArgoCluster
sends to the Argo Server and every response it gets is checked against ``swagger.json`` through a
``requests`` response hook; a violation fails the test.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import requests

from qosflow.core.cluster import JobStatus, SubmitRequest
from qosflow.core.pod import Checkpoint, PodDefaults, PodSettings, with_defaults
from qosflow_argo.argo_cluster import ArgoCluster
from qosflow_argo.contract import SwaggerContract
from qosflow_argo.manifests import REFERENCE_IMAGE
from qosflow_argo.retry import RetryPolicy

REAL_ENV = ("QOSFLOW_ARGO_URL", "QOSFLOW_ARGO_TOKEN", "KUBECONFIG")
REAL = all(os.environ.get(k) for k in REAL_ENV)
TOKEN = "tok-9f3c-very-secret-value"
CLAIM = os.environ.get("QOSFLOW_CHECKPOINT_CLAIM", "qosflow-checkpoints")
CHECKPOINT_POD, _checkpoint = with_defaults(
    PodSettings(), None, PodDefaults(checkpoint_claim=CLAIM)
)
assert _checkpoint is not None
CHECKPOINT: Checkpoint = _checkpoint
"""Every test segment keeps its checkpoints on the claim ``CLAIM`` (installed by ``target``)."""
_CONTRACT: SwaggerContract | None = None


def swagger() -> SwaggerContract:
    global _CONTRACT
    if _CONTRACT is None:
        _CONTRACT = SwaggerContract()
    return _CONTRACT


def checked_session(base_url: str, seen: list[str]) -> requests.Session:
    """A Session whose every Argo Server exchange is validated against swagger.json."""
    prefix = urlparse(base_url).path.rstrip("/")

    def check(resp: requests.Response, *args: Any, **kwargs: Any) -> None:
        req = resp.request
        path = urlparse(req.url or "").path.removeprefix(prefix)
        method = str(req.method)
        body = json.loads(req.body) if req.body else None
        contract = swagger()
        contract.check_request(method, path, body)
        data = resp.json() if resp.content else {}
        contract.check_response(method, path, resp.status_code, data)
        seen.append(f"{method} {path} {resp.status_code}")

    session = requests.Session()
    session.hooks["response"].append(check)
    return session


@dataclass
class Target:
    """One cluster under test and how to move its time."""

    kind: str
    make: Callable[..., ArgoCluster]
    local: Any = None
    clock: Any = None
    runner: Any = None
    exchanges: list[str] = field(default_factory=list)
    prefix: str = "qf"

    @property
    def cluster(self) -> ArgoCluster:
        return self.make()

    def advance(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)

    def wait(
        self,
        cluster: ArgoCluster,
        name: str,
        pred: Callable[[JobStatus], bool],
        timeout_s: float = 600.0,
        step_s: float = 1.0,
    ) -> JobStatus:
        waited = 0.0
        while True:
            status = cluster.status(name)
            if pred(status):
                return status
            if waited > timeout_s:
                raise AssertionError(f"{name}: {status} after {timeout_s}s")
            self.advance(step_s)
            waited += step_s

    def job(self, label: str) -> str:
        return f"{self.prefix}-{label}"

    def request(self, label: str, **over: Any) -> SubmitRequest:
        now = self.make().now()
        base = SubmitRequest(
            job=self.job(label),
            segment=0,
            units=1,
            unit="cpu",
            total_steps=20,
            resume=False,
            priority_class="qosflow-normal",
            priority=10,
            image=os.environ.get("QOSFLOW_TEST_IMAGE", REFERENCE_IMAGE),
            command=tuple(
                os.environ.get("QOSFLOW_TEST_COMMAND", "python -m qosflow_trainer").split()
            ),
            memory_per_unit="256Mi",
            deadline=now + 3600,
            checkpoint_dir=CHECKPOINT.folder(self.job(label)),
            checkpoint_every_steps=5,
            pod=CHECKPOINT_POD,
            checkpoint=CHECKPOINT,
        )
        return replace(base, **over)


def _local_target(tmp_path: Path) -> Iterator[Target]:
    from qosflow.local import FaultPlan, LocalCluster, ScriptedRunner, VirtualClock

    clock = VirtualClock()
    runner = ScriptedRunner()
    local = LocalCluster(
        cpus=2,
        state_dir=tmp_path / "local",
        token=TOKEN,
        clock=clock,
        runner=runner,
        faults=FaultPlan(),
    )
    local.start()
    exchanges: list[str] = []
    made: list[ArgoCluster] = []

    def make(**kw: Any) -> ArgoCluster:
        if not kw and made:
            return made[0]
        options: dict[str, Any] = dict(
            clock=clock.now,
            sleep=clock.advance,
            rng=random.Random(3),
            session=checked_session(local.argo_url, exchanges),
        )
        options.update(kw)
        cluster = ArgoCluster.from_local(local, **options)
        if not kw:
            made.append(cluster)
        return cluster

    try:
        yield Target("local", make, local=local, clock=clock, runner=runner, exchanges=exchanges)
    finally:
        for c in made:
            c.close()
        local.stop()


def _real_target() -> Iterator[Target]:
    exchanges: list[str] = []
    made: list[ArgoCluster] = []
    url = os.environ["QOSFLOW_ARGO_URL"]

    def make(**kw: Any) -> ArgoCluster:
        if not kw and made:
            return made[0]
        options: dict[str, Any] = dict(
            session=checked_session(url, exchanges), retry=RetryPolicy(budget_s=120.0)
        )
        options.update(kw)
        cluster = ArgoCluster.from_env(**options)
        if not kw:
            made.append(cluster)
        return cluster

    yield Target("real", make, exchanges=exchanges, prefix=f"qf{uuid.uuid4().hex[:6]}")
    for c in made:
        c.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    """The cluster the contract suite runs against, with the template installed."""
    gen = _real_target() if REAL else _local_target(tmp_path)
    tgt = next(gen)
    tgt.cluster.ensure_installed(checkpoint_claim=CLAIM)
    try:
        yield tgt
    finally:
        next(gen, None)


@pytest.fixture
def local_target(target: Target) -> Target:
    """The local cluster only: fault injection and virtual time need its control API."""
    if target.local is None:
        pytest.skip("fault injection needs the local cluster (real cluster configured)")
    return target
