"""Fixtures of the Airflow tests (AIRFLOW_HOME and the DAG bundles are set in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from qosflow.core.cluster import (
    ANNOTATION_PLAN,
    LABEL_JOB,
    LABEL_MANAGED,
    Capacity,
    JobStatus,
    Phase,
    ResizeResult,
    ResizeState,
    SubmitRequest,
)
from qosflow.core.errors import NotFoundError


@dataclass
class FakeArgo:
    """The Argo Server side of the fake: workflows with their labels and plan annotations."""

    cluster: FakeCluster

    def list_workflows(self, label_selector: str) -> list[dict]:
        assert label_selector.startswith(f"{LABEL_MANAGED}=true")
        return [
            {
                "metadata": {
                    "name": r.name,
                    "labels": {LABEL_JOB: r.job, LABEL_MANAGED: "true"},
                    "annotations": {ANNOTATION_PLAN: r.plan},
                }
            }
            for r in self.cluster.requests
        ]


@dataclass
class FakeCluster:
    """In-memory ClusterView + Actuator for unit tests of the Airflow layer.

    Each poll of ``status`` advances the fake clock by ``tick`` seconds and the running segment
    by ``rate * units * tick`` steps; scripted failures end a segment with a message.
    """

    capacity_units: int = 2
    tick: float = 5.0
    rate: float = 1.0
    in_place: bool = False
    fail_at_step: int | None = None
    fail_message: str = "OOMKilled: container exceeded its memory limit"
    clock: float = 1_800_000_000.0
    jobs: dict[str, JobStatus] = field(default_factory=dict)
    requests: list[SubmitRequest] = field(default_factory=list)
    progress: dict[str, float] = field(default_factory=dict)

    @property
    def argo(self) -> FakeArgo:
        return FakeArgo(self)

    def now(self) -> float:
        return self.clock

    nodes: dict[str, int] = field(default_factory=dict)
    """Free units per node, when a test sets them (else one pool)."""

    def capacity(self, unit):
        used = sum(s.units for s in self.jobs.values() if not s.phase.finished)
        free = self.capacity_units - used
        return Capacity(unit, self.capacity_units, free, dict(self.nodes))

    def _advance(self, name: str) -> JobStatus:
        st = self.jobs[name]
        if st.phase is Phase.PENDING:
            st = replace(st, phase=Phase.RUNNING, started_at=self.clock)
        if st.phase is Phase.RUNNING:
            self.progress[name] += self.rate * st.units * self.tick
            done = min(int(self.progress[name]), st.total_steps)
            st = replace(st, steps_done=done)
            if self.fail_at_step is not None and done >= self.fail_at_step:
                st = replace(
                    st, phase=Phase.FAILED, message=self.fail_message, finished_at=self.clock
                )
            elif done >= st.total_steps:
                st = replace(st, phase=Phase.SUCCEEDED, finished_at=self.clock)
        self.jobs[name] = st
        return st

    def status(self, name: str) -> JobStatus:
        if name not in self.jobs:
            raise NotFoundError(f"workflow {name} not found", status=404)
        self.clock += self.tick
        return self._advance(name)

    def list_jobs(self, job=None):
        return [s for s in self.jobs.values() if job is None or s.job == job]

    gpu_resource: str = "nvidia.com/gpu"

    def check_job(self, job, job_id):
        """What the real client checks at plan: segment 0's Workflow renders and validates."""
        from qosflow_argo import manifests

        return manifests.workflow(
            manifests.first_segment(job, job_id), namespace="qosflow", now=self.clock
        )

    def submit(self, request: SubmitRequest) -> JobStatus:
        from qosflow_argo import manifests

        manifests.workflow(request, namespace="qosflow", now=self.clock)  # as the client does
        if request.name in self.jobs:
            return self.jobs[request.name]
        self.requests.append(request)
        start = 0.0
        if request.resume:
            start = float(max((s.steps_done or 0) for s in self.list_jobs(request.job)))
        self.progress[request.name] = start
        st = JobStatus(
            request.name,
            request.job,
            request.segment,
            Phase.PENDING,
            None,
            request.total_steps,
            request.units,
            request.priority_class,
            request.priority,
        )
        self.jobs[request.name] = st
        return st

    def stop(self, name: str, *, message: str = "") -> JobStatus:
        st = self.jobs[name]
        if not st.phase.finished:
            st = replace(st, phase=Phase.STOPPED, finished_at=self.clock, message=message)
            self.jobs[name] = st
        return st

    def resize(self, name: str, units: int) -> ResizeResult:
        self.jobs[name] = replace(self.jobs[name], units=units)
        return ResizeResult(ResizeState.DONE, units)

    def supports_in_place_resize(self, unit) -> bool:
        return self.in_place

    def set_priority(self, name, *, priority, priority_class=None):
        st = replace(
            self.jobs[name],
            priority=priority,
            priority_class=priority_class or self.jobs[name].priority_class,
        )
        self.jobs[name] = st
        return st


@pytest.fixture
def fake_cluster(monkeypatch, tmp_path):
    """A FakeCluster behind the ``qosflow_default`` connection."""
    from qosflow_airflow.hooks import argo

    cluster = FakeCluster()
    conn = {
        "conn_type": "qosflow_argo",
        "host": "http://127.0.0.1:1",
        "password": "t0ken",
        "extra": {
            "history_url": f"sqlite:///{tmp_path}/history.db",
            "image": "registry.example/trainer:1",
            "checkpoint_claim": "qosflow-checkpoints",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_DEFAULT", json.dumps(conn))
    monkeypatch.setattr(argo, "cluster_from_config", lambda config: cluster)
    return cluster


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """The session's metadata database (``AIRFLOW_HOME`` of tests/conftest.py), migrated once."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL
    )


@pytest.fixture(autouse=True)
def _triggers_fire_at_once(monkeypatch):
    """In-process triggers (``dag.test()``, fake clusters) race no scheduler: no settle wait.

    The real deployment test (separate processes) keeps the production wait.
    """
    from qosflow_airflow.triggers import progress

    monkeypatch.setattr(progress, "SETTLE_S", 0.0)


# -- one real deployment for the modules that need one ---------------------------------------------
SHARED = "shared_deployment"
"""The fixture of the one real deployment (test_deployment.py and test_plugin.py use it)."""
_SHARED_KEY = pytest.StashKey["SharedDeployment"]()


class SharedDeployment:
    """One real deployment (``deployment.py``) for every module that asks for one, started lazily.

    Scheduler, triggerer, dag-processor and api-server as separate processes, PostgreSQL, users who
    log in, every job-board allocation recorded, the DAG folder holding every DAG file under test,
    the ``qosflow_default`` connection on a 2-CPU local cluster with a report store. Its users run
    their DAG runs one after another (the tests that use it are kept together in the session), and
    it stops after the last of them (:func:`pytest_runtest_teardown`), so no idle deployment eats
    the CPUs of the tests that come later.
    """

    def __init__(self, root_factory: pytest.TempPathFactory) -> None:
        self._factory = root_factory
        self._stack: contextlib.ExitStack | None = None
        self.value: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        """``{"dep", "local", "root", "store"}``, the deployment started at the first call."""
        if self.value is not None:
            return self.value
        from deployment import DAGS, control_plane, deployment, log, postgres_admin_url

        postgres_admin_url()  # skip (fail under CI) before anything starts
        from qosflow.local.cluster import LocalCluster
        from qosflow_airflow.hooks.argo import LOCAL_CHECKPOINT_CLAIM, local_connection
        from qosflow_argo import ArgoCluster

        root = self._factory.mktemp("deployment")
        store = root / "report-store"
        with contextlib.ExitStack() as stack:
            stack.enter_context(control_plane(cluster_cpus=2))
            local = stack.enter_context(
                LocalCluster(cpus=2, state_dir=root / "local", token="deployment-test")
            )
            ArgoCluster.from_local(local).ensure_installed(checkpoint_claim=LOCAL_CHECKPOINT_CLAIM)
            log(f"{local!r}, pod CPU weights {'on' if local.weighted else 'off'}")

            def connections(history_url: str) -> dict[str, Any]:
                conn = local_connection(local, history_url=history_url)
                conn["extra"]["report_url"] = f"file://{store}"
                return {"qosflow_default": conn}

            dep = stack.enter_context(
                deployment(
                    root / "airflow",
                    list(DAGS.values()),
                    connections=connections,
                    record_board=True,
                    auth=True,
                )
            )
            dep.wait_ready(list(DAGS))
            self.value = {"dep": dep, "local": local, "root": root, "store": store}
            self._stack = stack.pop_all()
        return self.value

    def close(self) -> None:
        """Stop everything (by PID); idempotent."""
        stack, self._stack, self.value = self._stack, None, None
        if stack is not None:
            stack.close()


@pytest.fixture(scope="session")
def shared_deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The one real deployment (:class:`SharedDeployment`)."""
    shared = request.config.stash.setdefault(_SHARED_KEY, SharedDeployment(tmp_path_factory))
    try:
        yield shared.get()
    finally:
        shared.close()


def _uses_shared(item: pytest.Item | None) -> bool:
    return item is not None and SHARED in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that use the shared deployment run together, where the first of them was."""
    users = [item for item in items if _uses_shared(item)]
    if users:
        first = items.index(users[0])
        others = [item for item in items if not _uses_shared(item)]
        items[:] = others[:first] + users + others[first:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """After the last test that uses it (and its modules' fixtures), stop the shared deployment."""
    try:
        return (yield)
    finally:
        shared = item.config.stash.get(_SHARED_KEY, None)
        if shared is not None and _uses_shared(item) and not _uses_shared(nextitem):
            shared.close()
