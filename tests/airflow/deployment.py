"""A real Airflow 3 deployment for one test: four processes, LocalExecutor, PostgreSQL.

:func:`deployment` starts what a production install runs, each as its own process (its own
process group): ``airflow scheduler`` (LocalExecutor), ``airflow triggerer``, ``airflow
dag-processor`` and ``airflow api-server`` on a free loopback port (the workers find the
Execution API there through ``AIRFLOW__CORE__EXECUTION_API_SERVER_URL``). The metadata database
is a fresh database on the PostgreSQL server of ``QOSFLOW_TEST_POSTGRES_URL`` (default: the
server these machines run at 127.0.0.1:5432, trust auth), created for the deployment and
dropped afterwards; so is the qosflow history store (:func:`fresh_database`). The
``qosflow_default`` connection points at an embedded local cluster the harness starts, and the
DAG folder holds only the DAG files under test.

:meth:`Deployment.run` triggers a run through the api-server's REST API, prints its progress
while it polls, and returns the run's state, its task instances and their XComs (read from the
metadata database). When something fails it prints the tail of every process log and of the
failed tasks' logs. Every process is stopped by PID in a ``finally`` (SIGTERM to its process
group and every descendant, SIGKILL to what is left), so nothing outlives the test.

Without a PostgreSQL server the test skips (:func:`postgres_admin_url`), except when ``CI`` is
set: then it fails.

Two things keep a deployment usable on a busy 2-core machine whose CPUs the training pods fill:

* warm workers: the scheduler imports the provider and the core (:data:`PRELOAD`) before it
  forks its LocalExecutor workers, and the workers fork every task, so a task starts in well
  under a second instead of re-importing scipy and the provider each time (on a starved host
  that import outlived Airflow's 30 s DAG-import timeout);
* a control plane: :func:`control_plane` puts the test process, and so everything it starts,
  in a CPU cgroup weighted against the local cluster's node (:class:`CpuGroup`), so busy pods
  cannot starve the scheduler, the triggerer and the local cluster's own servers.

The job board's allocations can be recorded (``record_board=True``): every deployment process
then imports a small ``sitecustomize`` that wraps ``qosflow_airflow.board``'s calls of the
cluster allocator and appends each snapshot (the board rows it read, the time, the capacity)
and the allocator's answer to ``<home>/board-log/<pid>.jsonl``; :meth:`Deployment.board_log`
reads them back. It changes nothing the steps do.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEFAULT_POSTGRES = "postgresql://root@127.0.0.1:5432/test"
"""The server these machines run (trust auth); ``QOSFLOW_TEST_POSTGRES_URL`` overrides it."""
PROCESSES = ("scheduler", "triggerer", "dag-processor", "api-server")
FINISHED = ("success", "failed")
CONTROL_SHARE = 0.5
"""The control plane's CPU weight as a share of the local cluster's node (see :class:`CpuGroup`)."""
PRELOAD = (
    "numpy",
    "scipy.optimize",
    "qosflow_airflow.task_group",
    "qosflow_airflow.board",
    "qosflow_airflow.report",
    "qosflow.core.allocator",
    "qosflow_argo",
)
"""What the scheduler imports before it forks its LocalExecutor workers (they fork every task)."""
_HERE = Path(__file__).resolve().parent
DAGS = {
    "qosflow_multi_tenant": _HERE.parents[1] / "dags" / "qosflow_multi_tenant.py",
    "qosflow_deadline_alert": _HERE / "deployment_dags" / "qosflow_deadline_alert.py",
}
"""DAG id → file: the DAGs the shared deployment (``conftest.py``, ``shared_deployment``) serves."""


def log(message: str) -> None:
    """Progress output (shown with ``pytest -s``, and with the report of a failing test)."""
    print(f"[deployment {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- PostgreSQL ------------------------------------------------------------------------------------
def _plain(url: str) -> str:
    """A libpq URL (``postgresql://``) from a SQLAlchemy one (``postgresql+psycopg://``)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}" if sep else url


def _with_database(url: str, name: str, driver: str | None = None) -> str:
    """``url`` naming database ``name`` (and SQLAlchemy driver ``driver``)."""
    from sqlalchemy.engine import make_url

    u = make_url(_plain(url)).set(database=name)
    if driver:
        u = u.set(drivername=f"postgresql+{driver}")
    return u.render_as_string(hide_password=False)


def postgres_admin_url() -> str:
    """The server's URL, after checking that it answers; skip (fail under ``CI``) when not."""
    import psycopg

    url = _plain(os.environ.get("QOSFLOW_TEST_POSTGRES_URL", DEFAULT_POSTGRES))
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the PostgreSQL server at {url}: {exc}")
        pytest.skip(f"no PostgreSQL server at {url}: {exc}")
    return url


@contextlib.contextmanager
def fresh_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database ``<prefix>_<random>`` on the server; dropped afterwards."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- processes -------------------------------------------------------------------------------------
def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CpuGroup:
    """A cgroup the deployment's processes run in: the host's control plane, weighted.

    The local cluster weights its pods' cgroups by their CPU requests, ahead of the host's other
    processes (``qosflow.local.cgroups``), as a node does. A deployment's scheduler, triggerer,
    workers, api-server and the local cluster's own servers are the control plane that runs
    beside them: starved by busy pods, a task start takes half a minute. Here they share one
    cgroup that weighs :data:`CONTROL_SHARE` of the pods' node, so they get what they need
    without taking the pods' CPUs, and unrelated programs of the host weigh little against
    both. Where the host has no writable CPU controller (:meth:`create` returns ``None``)
    everything competes on equal terms, and the sizing at the start of the DAG sees that.
    """

    def __init__(self, path: Path, v2: bool, acct: Path | None = None) -> None:
        self.path, self.v2, self.acct = path, v2, acct

    @classmethod
    def create(cls, name: str, shares: int) -> CpuGroup | None:
        """A new top-level CPU cgroup weighing ``shares`` (cgroup v1 ``cpu.shares`` scale)."""
        from qosflow.local.cgroups import ROOT, weight_for

        v2 = (ROOT / "cgroup.controllers").is_file()
        base = ROOT if v2 else ROOT / "cpu"
        if not os.access(base, os.W_OK):
            return None
        path = base / name
        try:
            path.mkdir()
            if v2:
                (base / "cgroup.subtree_control").write_text("+cpu")
                (path / "cpu.weight").write_text(str(weight_for(shares)))
            else:
                (path / "cpu.shares").write_text(str(shares))
        except OSError as exc:
            log(f"no cgroup for the control plane ({exc}): it competes with the pods")
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        acct = None
        if not v2:  # v1 accounts CPU time in a hierarchy of its own
            with contextlib.suppress(OSError):
                (ROOT / "cpuacct" / name).mkdir()
                acct = ROOT / "cpuacct" / name
        return cls(path, v2, acct)

    def _groups(self) -> list[tuple[Path, str]]:
        """``(group, hierarchy name)`` of every hierarchy the group has a directory in."""
        out = [(self.path, "" if self.v2 else "cpu")]
        return out + ([(self.acct, "cpuacct")] if self.acct is not None else [])

    def usage_s(self) -> float | None:
        """CPU seconds the group's processes used so far (``None``: not accounted here)."""
        try:
            if self.v2:
                stat = (self.path / "cpu.stat").read_text(encoding="ascii").split()
                return int(stat[stat.index("usage_usec") + 1]) / 1e6
            if self.acct is not None:
                return int((self.acct / "cpuacct.usage").read_text(encoding="ascii")) / 1e9
        except (OSError, ValueError):
            pass
        return None

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This process in the group while the block runs, then back where it was."""
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
        back = []
        for group, key in self._groups():
            before = next(
                (ln.split(":", 2)[2] for ln in lines if key in ln.split(":", 2)[1].split(",")),
                "/",
            )
            back.append(group.parent / before.lstrip("/") / "cgroup.procs")
            (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            for procs in back:
                with contextlib.suppress(OSError):
                    procs.write_text(str(os.getpid()))

    def remove(self) -> None:
        """Remove the group (once its processes are gone)."""
        for group, _ in self._groups():
            with contextlib.suppress(OSError):
                group.rmdir()


@contextlib.contextmanager
def control_plane(cluster_cpus: int = 2) -> Iterator[CpuGroup | None]:
    """This process (and so every process it starts) in a control-plane :class:`CpuGroup`.

    The group weighs :data:`CONTROL_SHARE` of a local cluster node of ``cluster_cpus`` CPUs;
    ``None`` (nothing changes) where the host has no writable CPU controller.
    """
    from qosflow.local.cgroups import NODE_WEIGHT

    shares = round(1024 * NODE_WEIGHT * cluster_cpus * CONTROL_SHARE)
    group = CpuGroup.create(f"qosflow-control-{uuid.uuid4().hex[:8]}", shares)
    if group is None:
        yield None
        return
    node = round(shares / CONTROL_SHARE)
    started, load = time.monotonic(), os.getloadavg()[0]
    try:
        with group.joined():
            log(f"control plane in {group.path} (weight {shares}, a node {node})")
            yield group
            used = group.usage_s()
            wall = time.monotonic() - started
            if used is not None:
                log(
                    f"this process and all it started used {used:.0f} CPU-s in {wall:.0f} s "
                    f"({used / wall:.2f} CPUs); host load average {load:.1f} at the start, "
                    f"{os.getloadavg()[0]:.1f} at the end"
                )
    finally:
        group.remove()


def kill_tree(proc: subprocess.Popen[bytes], *, grace_s: float = 15.0) -> None:
    """Stop a process, its process group and every descendant, by PID; SIGKILL what stays."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)  # the group (start_new_session: pgid == pid)
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _gone, alive = psutil.wait_procs(family, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a file (empty when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# -- the deployment's sitecustomize -----------------------------------------------------------------
SITECUSTOMIZE = '''\
"""Test harness only (tests/airflow/deployment.py): record board allocations, warm workers."""
import os

if os.environ.get("QOSFLOW_TEST_BOARD_LOG"):
    import dataclasses, importlib.abc, importlib.util, json, sys, threading

    _LOCK, _LOCAL = threading.Lock(), threading.local()
    _DIR = os.environ["QOSFLOW_TEST_BOARD_LOG"]

    def _install(board):
        job_input, allocate, on_board = board.job_input, board.allocate, board.allocate_on_board

        def recording_job_input(entry, now=None):
            _LOCAL.entries.append(dataclasses.asdict(entry))
            return job_input(entry, now)

        def recording_allocate(cluster):
            out = allocate(cluster)
            record = {
                "pid": os.getpid(), "mine": getattr(_LOCAL, "mine", None), "now": cluster.now,
                "capacity": cluster.capacity, "slot_s": cluster.slot_s, "freed": cluster.freed,
                "plan_factor": cluster.plan_factor, "max_utilisation": cluster.max_utilisation,
                "entries": list(_LOCAL.entries),
                "out": {k: {"units": a.units, "klass": a.klass, "guaranteed": a.guaranteed,
                            "reason": a.reason} for k, a in out.jobs.items()},
                "admitted": list(out.admitted), "rejected": list(out.rejected),
                "verdicts": {k: v.to_dict() for k, v in out.verdicts.items()},
            }
            with _LOCK, open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\\n")
            return out

        def recording_allocate_on_board(board_, mine, **kwargs):
            _LOCAL.mine, _LOCAL.entries = mine.job_id, []
            try:
                return on_board(board_, mine, **kwargs)
            finally:
                _LOCAL.mine, _LOCAL.entries = None, []

        board.job_input, board.allocate = recording_job_input, recording_allocate
        board.allocate_on_board = recording_allocate_on_board

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "qosflow_airflow.board":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _install(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())

if os.environ.get("QOSFLOW_TEST_PRELOAD"):
    import importlib

    for _name in os.environ["QOSFLOW_TEST_PRELOAD"].split(","):
        importlib.import_module(_name)
'''


# -- the deployment --------------------------------------------------------------------------------
@dataclass
class TaskInstance:
    """One task instance of a run (the REST API's view)."""

    task_id: str
    state: str | None
    try_number: int
    start: str | None
    end: str | None


@dataclass
class RunResult:
    """How a triggered run ended.

    Attributes:
        dag_id: The DAG.
        run_id: The run.
        state: ``success``, ``failed``, or the last state seen when the wait timed out.
        tasks: Task instances by task id.
        xcoms: XCom values by ``(task_id, key)``.
        wall_s: Seconds from trigger to end.
    """

    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, TaskInstance]
    xcoms: dict[tuple[str, str], Any]
    wall_s: float

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        """One XCom value (``None`` when the task pushed none under ``key``)."""
        return self.xcoms.get((task_id, key))

    def states(self) -> dict[str, str | None]:
        """Task id → state."""
        return {t: ti.state for t, ti in sorted(self.tasks.items())}


@dataclass
class Deployment:
    """A started deployment (see :func:`deployment`)."""

    home: Path
    env: dict[str, str]
    api_url: str
    metadata_url: str
    history_url: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    board_dir: Path | None = None
    auth: bool = False
    """Users log in (simple auth manager, user ``admin``) instead of everyone being an admin."""
    _token: str | None = None

    def logfile(self, name: str) -> Path:
        """Where process ``name`` writes its stdout and stderr."""
        return self.home / "proc-logs" / f"{name}.log"

    def airflow(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command in the deployment's environment."""
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> None:
        """Start ``airflow <name> <args>`` as its own process group, logging to :meth:`logfile`."""
        path = self.logfile(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", name, *args],
                env={**self.env, **(env or {})},
                cwd=self.home,  # relative paths (a DAG's report_dir) stay in the deployment's home
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        log(f"started airflow {name} (pid {self.procs[name].pid})")

    def stop(self) -> None:
        """Stop every process (by PID, process group and descendants)."""
        for name, proc in self.procs.items():
            kill_tree(proc)
            log(f"stopped airflow {name} (pid {proc.pid}, exit {proc.returncode})")

    def check_alive(self) -> None:
        """Fail when a deployment process has exited."""
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            self.dump_logs()
            raise AssertionError(f"deployment processes exited: {dead}")

    # -- REST ------------------------------------------------------------------------------------
    def password(self, username: str = "admin", timeout_s: float = 60.0) -> str:
        """The password the api-server generated for ``username`` (``auth=True``)."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        give_up = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return str(json.loads(path.read_text(encoding="utf-8"))[username])
            if time.monotonic() > give_up:
                raise AssertionError(f"no generated password for {username!r} in {path}")
            time.sleep(0.5)

    def login(self, username: str = "admin") -> str:
        """A JWT for ``username`` from ``POST /auth/token`` (the UI's login does the same)."""
        import requests

        resp = requests.post(
            f"{self.api_url}/auth/token",
            json={"username": username, "password": self.password(username)},
            timeout=30,
        )
        if resp.status_code >= 400:
            raise AssertionError(f"login of {username}: {resp.status_code} {resp.text[:300]}")
        return str(resp.json()["access_token"])

    def headers(self) -> dict[str, str]:
        """The REST calls' headers: a bearer token when users log in (``auth=True``)."""
        if not self.auth:
            return {}
        if self._token is None:
            self._token = self.login()
        return {"Authorization": f"Bearer {self._token}"}

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        """One call of the public REST API (``/api/v2``), as an admin."""
        import requests

        resp = requests.request(
            method, f"{self.api_url}/api/v2{path}", json=body, headers=self.headers(), timeout=30
        )
        if resp.status_code >= 400:
            raise AssertionError(f"{method} {path}: {resp.status_code} {resp.text[:500]}")
        return resp.json() if resp.content else None

    def wait_ready(self, dag_ids: Sequence[str], timeout_s: float = 240.0) -> None:
        """Wait for the api-server and for the dag-processor to have parsed every DAG."""
        import requests

        give_up = time.monotonic() + timeout_s
        missing = set(dag_ids)
        while True:
            self.check_alive()
            with contextlib.suppress(requests.RequestException):
                health = requests.get(f"{self.api_url}/api/v2/monitor/health", timeout=5)
                if health.ok:
                    dags = self.rest("GET", "/dags?limit=100")["dags"]
                    missing = set(dag_ids) - {d["dag_id"] for d in dags}
                    errors = self.rest("GET", "/importErrors")["import_errors"]
                    if errors:
                        raise AssertionError(f"DAG import errors: {errors}")
                    if not missing:
                        log(f"ready: api-server answers, dag-processor parsed {sorted(dag_ids)}")
                        return
            if time.monotonic() > give_up:
                self.dump_logs()
                raise AssertionError(f"deployment not ready after {timeout_s:.0f} s: {missing}")
            time.sleep(1.0)

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        """Trigger a run (REST), unpausing the DAG first; its run id."""
        self.rest("PATCH", f"/dags/{dag_id}", {"is_paused": False})
        run = self.rest(
            "POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": dict(conf or {})}
        )
        log(f"triggered {dag_id}: {run['dag_run_id']}")
        return str(run["dag_run_id"])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, TaskInstance]:
        """The run's task instances (REST)."""
        out: dict[str, TaskInstance] = {}
        offset = 0
        while True:
            page = self.rest(
                "GET",
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100&offset={offset}",
            )
            for ti in page["task_instances"]:
                out[ti["task_id"]] = TaskInstance(
                    ti["task_id"], ti["state"], ti["try_number"], ti["start_date"], ti["end_date"]
                )
            offset += len(page["task_instances"])
            if not page["task_instances"] or offset >= page["total_entries"]:
                return out

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query on the metadata database."""
        import psycopg

        with psycopg.connect(_plain(self.metadata_url)) as conn:
            return list(conn.execute(query, tuple(params)).fetchall())

    def xcoms(self, dag_id: str, run_id: str) -> dict[tuple[str, str], Any]:
        """Every XCom of the run, from the metadata database."""
        import psycopg

        with psycopg.connect(_plain(self.metadata_url)) as conn:
            rows = conn.execute(
                "SELECT x.task_id, x.key, x.value FROM xcom x JOIN dag_run r ON r.id = x.dag_run_id"
                " WHERE r.dag_id = %s AND r.run_id = %s AND x.map_index = -1",
                (dag_id, run_id),
            ).fetchall()
        return {(task, key): _json(value) for task, key, value in rows}

    def run(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 600.0,
        every_s: float = 2.0,
        on_poll: Callable[[], None] | None = None,
    ) -> RunResult:
        """Trigger ``dag_id``, wait (printing progress) until the run ends or times out.

        ``on_poll`` runs on every poll (a test's own observation of the run).
        """
        started = time.monotonic()
        run_id = self.trigger(dag_id, conf)
        state, seen = "queued", ""
        while time.monotonic() - started < timeout_s:
            self.check_alive()
            state = str(self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])
            tis = self.task_instances(dag_id, run_id)
            if on_poll is not None:
                on_poll()
            summary = _summary(tis)
            if summary != seen:
                log(f"{dag_id} {state} after {time.monotonic() - started:.0f} s: {summary}")
                seen = summary
            if state in FINISHED:
                break
            time.sleep(every_s)
        wall = time.monotonic() - started
        tis = self.task_instances(dag_id, run_id)
        result = RunResult(dag_id, run_id, state, tis, self.xcoms(dag_id, run_id), wall)
        log(f"{dag_id} ended {state} after {wall:.0f} s")
        if state != "success":
            self.dump_logs(result)
        return result

    # -- diagnostics -----------------------------------------------------------------------------
    def dump_logs(self, result: RunResult | None = None, lines: int = 60) -> None:
        """Print the tail of every process log, and of the logs of the run's failed tasks."""
        for name in self.procs:
            print(
                f"===== airflow {name}: last {lines} lines =====\n{tail(self.logfile(name), lines)}"
            )
        if result is None:
            return
        bad = [t for t, ti in result.tasks.items() if ti.state not in ("success", "skipped")]
        for task_id in bad:
            folder = self.home / "logs" / f"dag_id={result.dag_id}" / f"run_id={result.run_id}"
            for path in sorted(folder.glob(f"task_id={task_id}/**/*.log")):
                print(f"===== task {task_id} ({result.tasks[task_id].state}): {path.name} =====")
                print(tail(path, lines))

    def board_log(self) -> list[dict[str, Any]]:
        """Every recorded board allocation, in time order (``record_board=True``)."""
        if self.board_dir is None:
            raise RuntimeError("the deployment was started without record_board=True")
        records = [
            json.loads(line)
            for path in sorted(self.board_dir.glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        return sorted(records, key=lambda r: float(r["now"]))


def _json(value: Any) -> Any:
    """An XCom value as stored (JSON text in a JSONB column) → the Python value."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def _summary(tis: Mapping[str, TaskInstance]) -> str:
    """``state: count`` over the task instances, plus the running/deferred ones by name."""
    counts: dict[str, int] = {}
    for ti in tis.values():
        counts[str(ti.state)] = counts.get(str(ti.state), 0) + 1
    active = sorted(t for t, ti in tis.items() if ti.state in ("running", "deferred", "queued"))
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" | active: {active}"


def _environment(
    home: Path,
    dags: Path,
    metadata_url: str,
    api_port: int,
    connections: Mapping[str, Any],
    auth: bool = False,
) -> dict[str, str]:
    """The deployment's environment: the caller's, with every Airflow setting its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")) and k != "AIRFLOW_HOME"
    }
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "12",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "12",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(not auth),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
                [{"name": "dags-folder", "classpath": local, "kwargs": {}}]
            ),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",  # parse once, not every 30 s
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__TRIGGERER__DEFAULT_CAPACITY": "50",
        }
    )
    for conn_id, conn in connections.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    return env


@contextlib.contextmanager
def deployment(
    home: Path,
    dag_files: Sequence[Path],
    *,
    connections: Callable[[str], Mapping[str, Any]],
    record_board: bool = False,
    auth: bool = False,
) -> Iterator[Deployment]:
    """Start a real deployment (see the module docstring); stop and clean it up afterwards.

    Args:
        home: A fresh directory: ``AIRFLOW_HOME``, the DAG folder, the process logs.
        dag_files: The DAG files under test (copied into the DAG folder).
        connections: Connection id → connection (JSON form), given the history store's URL.
        record_board: Record every job-board allocation (:meth:`Deployment.board_log`).
        auth: Users log in (the simple auth manager's user ``admin``, its generated password;
            :meth:`Deployment.login`) instead of every request being an admin's.
    """
    admin = postgres_admin_url()
    with (
        fresh_database(admin, "qosflow_af") as meta_db,
        fresh_database(admin, "qosflow_hist") as hist_db,
    ):
        dags = home / "dags"
        dags.mkdir(parents=True, exist_ok=True)
        for path in dag_files:
            shutil.copy(path, dags / path.name)
        metadata_url = _with_database(admin, meta_db, "psycopg2")
        history_url = _with_database(admin, hist_db, "psycopg")
        port = free_port()
        env = _environment(home, dags, metadata_url, port, connections(history_url), auth)
        hooks = home / "pyhooks"
        hooks.mkdir(exist_ok=True)
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hooks), env.get("PYTHONPATH")]))
        board_dir = None
        if record_board:
            board_dir = home / "board-log"
            board_dir.mkdir(exist_ok=True)
            env["QOSFLOW_TEST_BOARD_LOG"] = str(board_dir)
        dep = Deployment(
            home,
            env,
            f"http://127.0.0.1:{port}",
            metadata_url,
            history_url,
            board_dir=board_dir,
            auth=auth,
        )
        try:
            t0 = time.monotonic()
            migrate = dep.airflow("db", "migrate")
            if migrate.returncode != 0:
                output = (migrate.stdout + migrate.stderr)[-3000:]
                raise AssertionError(f"airflow db migrate failed:\n{output}")
            log(f"airflow db migrate on {meta_db}: {time.monotonic() - t0:.0f} s")
            for name in PROCESSES:
                extra = ("--host", "127.0.0.1", "--port", str(port)) if name == "api-server" else ()
                warm = {"QOSFLOW_TEST_PRELOAD": ",".join(PRELOAD)} if name == "scheduler" else {}
                dep.start(name, *extra, env=warm)
            yield dep
        finally:
            dep.stop()
