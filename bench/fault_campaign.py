"""Fault campaign of issue 15: re-run its scenarios on loopback and count what went wrong.

Every figure is counted from what happened in this run (nothing is assumed); each scenario has its
own time bound and the whole campaign takes about two minutes on two cores (``--quick``: less).
Only loopback is used: the embedded local cluster (in-process and as the ``qosflow local`` daemon),
the reference trainer and the ``qosflow`` CLI, all under one temporary folder that is removed at
the end. Progress goes to stderr, ``key: value`` lines to stdout. The exit code is 0 when every
acceptance key has its target value, 1 otherwise.

Acceptance keys:

* ``duplicates`` — workflows beyond one per job segment, plus job-board rows (promises) beyond
  one per DAG run, after (a) threads submitting the same segments at once through
  ``ArgoCluster.submit`` while the server drops connections before and after handling creates,
  answers 503/500/429 and answers too slowly; client processes SIGKILLed while a create is in
  flight, their segments then submitted again; submits through a 5 s outage of 503s; and (b) the
  Airflow plan + submit steps re-run three times for one DAG run whose relative deadline
  (``PT10M``) is resolved from the plan time on each re-run (so the deadline differs each time);
* ``steps_lost_beyond_checkpoint`` — training steps that had to be redone beyond one checkpoint
  interval, from the trainers' own step logs, after (a) SIGKILLs of the local-cluster daemon in
  the middle of training and a restart on the same state folder (a trainer that finished while the
  server was down included; a container SIGKILLed under the restarted server, resumed by the
  template's retry), and (b) SIGKILLs of the trainer while a checkpoint file is being written,
  each followed by a resume (plus two corrupted checkpoints, which must be detected);
* ``poisoned_controller`` — bad workflows the local cluster accepted (HTTP 2xx) that did not end
  (or get quarantined), or after which other workflows stopped moving, ``qosflow local down`` /
  ``up`` on the same state folder broke, or files appeared outside the state folder. The bad
  workflows are the issue's (CPU ``abc``, bad retry settings and ``podSpecPatch``, namespace
  ``..`` with name ``state.json``...), poisoned objects added to a saved ``state.json``, a
  WorkflowTemplate update that poisons a queued workflow, and generated mutations of a valid one;
* ``token_leaks`` — places holding the cluster token or the history database password after a job
  ran end to end through the Airflow steps and the local cluster with real trainer pods: every
  file under the campaign folder (state folders, pod and daemon logs, checkpoints, reports, the
  history database, the steps' captured logs and output, XComs and trigger kwargs written out,
  the reprs of the config objects), the environment of every pod process seen (both secrets are
  in the environment of the process that starts the local cluster), and the output of ``qosflow
  plan`` given a history URL with the password. The token's own files (``token`` and
  ``cluster.json`` of a state folder, mode 0600) are not leaks. A planted file and a planted
  process environment must be found, else the key is an error;
* ``tracebacks`` — outputs containing ``Traceback`` of ``qosflow simulate`` / ``bound`` fed bad
  traces (non-UTF-8, UTF-16 with and without BOM, UTF-8 BOM, ``seed:jobs=abc``, ``--out`` that is
  a file...), of ``qosflow plan`` given broken history stores (byte-flipped, not a database,
  under a file, unreachable), and of ``qosflow local up/down``; plus HTTP 5xx answers to
  malformed, oversized, stalled and generated requests against the local cluster, and tracebacks
  its server logged meanwhile;
* ``retry_covers_long_segments`` — ``true`` when the rendered ``qosflow-train`` template and the
  committed ``workflow-template.yaml`` retry every container template without a
  ``backoff.maxDuration`` shorter than a segment's ``activeDeadlineSeconds``, the segment workflow
  carries that deadline, and on the local cluster (virtual time) a segment that fails after 400 s of
  training is retried — while a control template with ``maxDuration: 5m`` is not (so the check can
  fail).

The other keys are what the scenarios did (counts of submits, faults, kills, requests, files
scanned...) and findings outside the acceptance keys (e.g. ``stalled_heads_held_open``).

Run: ``.venv/bin/python bench/fault_campaign.py`` (``--quick`` for the test suite's smaller run,
``--only NAME`` for one scenario, ``--keep`` to keep the temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import functools
import itertools
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "argo_templates"
NS = "qosflow"
CLAIM = "qosflow-checkpoints"
"""The checkpoint claim every campaign cluster gets (``ensure_installed(checkpoint_claim=...)``)."""
CHECKPOINT_VOLUME, CHECKPOINT_PATH = "ckpt", "/ckpt"
IMAGE = "qosflow-trainer:local"
WORKFLOWS = f"/api/v1/workflows/{NS}"
PODS = f"/api/v1/namespaces/{NS}/pods"
WF_LABEL = "workflows.argoproj.io/workflow"
SMALL_TRAINER = ("--width", "128", "--depth", "2", "--input-dim", "32", "--batch-size", "128")
CAMPAIGN_KEYS = (
    "duplicates",
    "steps_lost_beyond_checkpoint",
    "poisoned_controller",
    "token_leaks",
    "tracebacks",
    "retry_covers_long_segments",
)
TARGETS: dict[str, Any] = {k: 0 for k in CAMPAIGN_KEYS} | {"retry_covers_long_segments": True}
STARTED: list[subprocess.Popen[Any]] = []
"""Every long-lived process the campaign starts (stopped at the end if a scenario failed)."""


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen``, remembered in :data:`STARTED`."""
    child: subprocess.Popen[Any] = subprocess.Popen(argv, **kwargs)
    STARTED.append(child)
    return child


# ============================================================================ the campaign


@dataclass
class Campaign:
    """Shared state of one campaign run: folders, secrets, metrics and what was found."""

    root: Path
    quick: bool
    token: str = field(default_factory=lambda: "qf-tok-" + secrets.token_hex(12))
    password: str = field(default_factory=lambda: "qf-pw-" + secrets.token_hex(12))
    started: float = field(default_factory=time.monotonic)
    metrics: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    leaks: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    pod_envs: set[str] = field(default_factory=set)

    @property
    def history_url(self) -> str:
        """A history store URL whose password is a secret."""
        return f"postgresql+psycopg://qosflow:{self.password}@db.invalid:5432/qosflow"

    @property
    def secrets(self) -> tuple[str, str]:
        """Every secret of the campaign."""
        return (self.token, self.password)

    def log(self, message: str) -> None:
        """One progress line on stderr."""
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def add(self, **values: Any) -> None:
        """Record figures; numbers of the same key add up."""
        for key, value in values.items():
            old = self.metrics.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or old is None:
                self.metrics[key] = value
            else:
                self.metrics[key] = old + value

    def folder(self, name: str) -> Path:
        """A fresh folder under the campaign root."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def check_text(self, where: str, text: str) -> None:
        """Count a leak when ``text`` holds a secret."""
        for secret in self.secrets:
            if secret in text:
                self.leaks.append(f"{where}: {'token' if secret == self.token else 'password'}")

    def check_traceback(self, where: str, text: str) -> None:
        """Count an output holding a Python traceback."""
        if "Traceback (most recent call last)" in text:
            self.tracebacks.append(where)
            self.log(f"TRACEBACK in {where}:\n{text[-1500:]}")

    def connection(self, host: str, kube_url: str, extra: dict[str, Any] | None = None) -> str:
        """An Airflow ``qosflow_argo`` connection (JSON) carrying both secrets."""
        extras = {"namespace": NS, "kube_url": kube_url, "history_url": self.history_url}
        return json.dumps(
            {
                "conn_type": "qosflow_argo",
                "host": host,
                "password": self.token,
                "extra": extras | (extra or {}),
            }
        )


def deadline(seconds: float) -> Callable[[], bool]:
    """A predicate that turns true ``seconds`` from now."""
    end = time.monotonic() + seconds
    return lambda: time.monotonic() > end


def wait_for(what: str, predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy; raises ``TimeoutError`` naming ``what``."""
    over = deadline(timeout_s)
    while True:
        value = predicate()
        if value:
            return value
        if over():
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(poll_s)


class Api:
    """An authenticated HTTP client of one listener."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def __call__(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send one request (10 s timeout)."""
        kwargs.setdefault("timeout", 10)
        return self.session.request(method, self.base + path, **kwargs)

    def phase(self, name: str, namespace: str = NS) -> str:
        """The phase of a workflow ('' while it has none, '404' when absent)."""
        response = self("GET", f"/api/v1/workflows/{namespace}/{name}")
        if response.status_code == 404:
            return "404"
        return str((response.json().get("status") or {}).get("phase") or "")


def container_wf(
    name: str, command: list[str] | None = None, cpu: str = "1", steps: int = 20
) -> dict[str, Any]:
    """A WorkflowCreateRequest with one container template (like the local-cluster tests')."""
    container: dict[str, Any] = {
        "image": "ignored:latest",
        "command": command or ["python", "-c", "pass"],
        "env": [{"name": "QOSFLOW_TOTAL_STEPS", "value": str(steps)}],
        "resources": {
            "requests": {"cpu": cpu, "memory": "64Mi"},
            "limits": {"cpu": cpu, "memory": "64Mi"},
        },
    }
    return {
        "workflow": {
            "metadata": {"name": name, "labels": {"qosflow.dev/job": name}},
            "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": container}]},
        }
    }


def _status_of(answer: bytes) -> int | None:
    """The status of an answer: its status line, or an HTTP/0.9-style error page's code."""
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer) or re.search(rb"Error code: (\d{3})", answer)
    return int(match.group(1)) if match else None


def _complete(answer: bytes) -> bool:
    """Whether an answer with a ``Content-Length`` has all its body."""
    end = answer.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = re.search(rb"(?im)^content-length: *(\d+)", answer[:end])
    return length is not None and len(answer) >= end + 4 + int(length.group(1))


def raw_request(base: str, data: bytes, timeout_s: float = 5.0) -> tuple[int | None, bytes, str]:
    """Send raw bytes to a listener; (status or None, answer, what went wrong)."""
    host, port = base.removeprefix("http://").split(":")
    answer, problem = b"", ""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        with contextlib.suppress(OSError):  # the server may answer before reading it all
            sock.sendall(data)
        while not _complete(answer):
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                problem = "no answer (timeout)"
                break
            except OSError as exc:
                problem = f"dropped ({type(exc).__name__})"
                break
            if not chunk:
                break
            answer += chunk
    status = _status_of(answer)
    if status is None and not problem:
        problem = "dropped (no answer)"
    return status, answer, problem


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 request head."""
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def start_daemon(state: Path, *extra: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """``python -m qosflow.local`` on free ports (this process's environment, secrets included)."""
    from qosflow.local.cli import read_info

    command = [sys.executable, "-m", "qosflow.local", "--port", "0", "--state-dir", str(state)]
    log = open(state.parent / f"{state.name}-daemon.log", "ab")  # noqa: SIM115 - child's output
    daemon = spawn([*command, *extra], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        info = wait_for(
            "the local cluster daemon started",
            lambda: (i := read_info(state)) is not None and i["pid"] == daemon.pid and i,
            60,
            0.05,
        )
    except TimeoutError:
        daemon.kill()
        daemon.wait()
        raise
    return daemon, info


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon (it stops its pods) and reap it; SIGKILL after 60 s."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def argo_client(info: dict[str, Any], **kwargs: Any) -> Any:
    """An ``ArgoCluster`` of a daemon's ``cluster.json``."""
    from qosflow_argo import ArgoCluster

    return ArgoCluster(
        info["argo_url"], token=info["token"], namespace=NS, kube_url=info["kube_url"], **kwargs
    )


def submit_request(job: str, **over: Any) -> Any:
    """A SubmitRequest of the reference trainer (small sizes), deadline in one hour."""
    from qosflow.core.cluster import SubmitRequest
    from qosflow.core.pod import Checkpoint

    base = SubmitRequest(
        job=job,
        segment=0,
        units=1,
        unit="cpu",
        total_steps=20,
        resume=False,
        priority_class="qosflow-normal",
        priority=10,
        image=IMAGE,
        command=("python", "-m", "qosflow_trainer", *SMALL_TRAINER),
        memory_per_unit="256Mi",
        deadline=time.time() + 3600,
        checkpoint_dir=f"{CHECKPOINT_PATH}/{job}",
        checkpoint_every_steps=5,
        pod=checkpoint_pod(),
        checkpoint=Checkpoint(CHECKPOINT_VOLUME, CHECKPOINT_PATH),
    )
    return replace(base, **over)


def checkpoint_pod() -> Any:
    """Pod settings that mount the campaign's checkpoint claim (a pod's own disk is lost)."""
    from qosflow.core.pod import PodSettings

    claim = {"claimName": CLAIM}
    return PodSettings(volumes=({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": claim},))


def pod_processes(state: Path) -> list[int]:
    """Pids of the live pod supervisors of a state folder and of their children (containers)."""
    from qosflow.local.supervisor import process_start_ticks

    pids: list[int] = []
    for pid_file in (state / "pods").glob("*/*/.pid"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = json.loads(pid_file.read_text())
            pid = int(record["pid"])
            if process_start_ticks(pid) != record["start_ticks"]:  # ended (or the pid reused)
                continue
            pids.append(pid)
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            pids.extend(int(c) for c in children)
    return pids


@contextlib.contextmanager
def sampling_pod_envs(c: Campaign, state: Path, label: str, every_s: float = 0.2) -> Iterator[None]:
    """Scan the pods' environments every ``every_s`` while the block runs."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            scan_pod_envs(c, state, label)

    sampler = threading.Thread(target=sample, name="campaign-env-sampler", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()


def environ_of(pid: int, wait_s: float = 1.0) -> str | None:
    """The environment of a live process (``None`` when gone).

    Right after an exec the kernel shows an empty environment for a moment: read again then.
    """
    over = deadline(wait_s)
    while True:
        try:
            data = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return None
        if data or over():
            return data.decode("utf-8", "replace")
        time.sleep(0.005)


def scan_pod_envs(c: Campaign, state: Path, label: str) -> int:
    """Check the environment of every live pod process of ``state`` for secrets."""
    seen = 0
    for pid in pod_processes(state):
        environ = environ_of(pid)
        if not environ:
            continue
        seen += 1
        c.check_text(f"{label}: environment of pod process {pid}", environ)
        c.pod_envs.add(f"{state}:{pid}")
    return seen


@dataclass
class Run:
    """One trainer run as its log tells it.

    Attributes:
        start: The step it started at (0, or the checkpoint it resumed from).
        last: The last step it logged.
        checkpoint: Its last committed checkpoint (-1: none).
        skipped: Corrupt checkpoints it skipped before starting.
    """

    start: int
    last: int
    checkpoint: int = -1
    skipped: int = 0


def trainer_runs(log_text: str) -> list[Run]:
    """The trainer runs of a log (a run begins at its ``start`` event)."""
    runs: list[Run] = []
    skipped = 0
    for line in log_text.splitlines():
        try:
            event = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("event")
        if kind == "skipped_checkpoint":
            skipped += 1
        elif kind == "start":
            runs.append(Run(int(event["step"]), int(event["step"]), skipped=skipped))
            skipped = 0
        elif kind in ("step", "checkpoint") and runs:
            runs[-1].last = max(runs[-1].last, int(event["step"]))
            if kind == "checkpoint":
                runs[-1].checkpoint = int(event["step"])
    return runs


def lost_between(runs: list[Run]) -> list[int]:
    """Steps redone at each boundary between consecutive runs."""
    return [max(0, prev.last - nxt.start) for prev, nxt in itertools.pairwise(runs)]


def resumed_badly(runs: list[Run]) -> int:
    """Runs that started before the last checkpoint their predecessor committed."""
    return sum(nxt.start < prev.checkpoint for prev, nxt in itertools.pairwise(runs))


# ============================================================================ retry coverage


def _retry_problems(doc: dict[str, Any], where: str, active_s: float) -> list[str]:
    """Container templates of ``doc`` whose retryStrategy cannot retry a long segment."""
    from qosflow.local.admission import duration_s

    problems = []
    defaults = doc["spec"].get("templateDefaults") or {}
    for template in [*doc["spec"].get("templates", []), defaults]:
        if "container" not in template and template is not defaults:
            continue
        if template.get("daemon"):  # the rendezvous: its workers hold its IP, a retry gets another
            continue
        if template is defaults and "retryStrategy" not in defaults:
            continue
        strategy = template.get("retryStrategy") or {}
        name = f"{where}:{template.get('name', 'templateDefaults')}"
        if int(strategy.get("limit") or 0) < 1:
            problems.append(f"{name}: no retries")
        bound = duration_s((strategy.get("backoff") or {}).get("maxDuration"))
        if bound and bound < active_s:
            problems.append(f"{name}: backoff.maxDuration {bound:.0f}s < {active_s:.0f}s")
    return problems


def _static_retry(c: Campaign) -> bool:
    from qosflow_argo import manifests

    now = time.time()
    request = submit_request("campaign-long", deadline=now + 6 * 3600, total_steps=100_000)
    segment = manifests.workflow(request, namespace=NS, now=now)
    active = float(segment["spec"].get("activeDeadlineSeconds") or 0)
    problems = [] if active >= 6 * 3600 else [f"segment activeDeadlineSeconds {active}"]
    problems += _retry_problems(segment, "segment", active)
    committed = yaml.safe_load((TEMPLATES / "workflow-template.yaml").read_text())
    problems += _retry_problems(manifests.workflow_template(), "rendered", active)
    problems += _retry_problems(committed, "workflow-template.yaml", active)
    for problem in problems:
        c.log(f"retry: {problem}")
    c.add(segment_active_deadline_s=int(active))
    return not problems


def _long_failure(template: str | None) -> tuple[int, str, float]:
    """Run a segment whose pod fails at step 400 (at 1 step/s) on virtual time.

    Returns (attempts, phase, seconds until the second attempt started or the segment ended).
    """
    from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock
    from qosflow_argo import ArgoCluster, manifests

    clock, runner = VirtualClock(), ScriptedRunner()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(cpus=2, state_dir=tmp, clock=clock, runner=runner) as local,
    ):
        options: dict[str, Any] = {"clock": clock.now, "sleep": clock.advance}
        cluster = ArgoCluster.from_local(local, **options)
        cluster.ensure_installed(checkpoint_claim=CLAIM)
        if template is not None:  # a control copy whose retries stop after 5 minutes
            doc = manifests.workflow_template()
            doc["metadata"]["name"] = template
            for t in doc["spec"]["templates"]:
                if "retryStrategy" in t:
                    t["retryStrategy"].setdefault("backoff", {})["maxDuration"] = "5m"
            Api(local.argo_url, local.token)(
                "POST", f"/api/v1/workflow-templates/{NS}", json={"template": doc}
            ).raise_for_status()
            cluster.close()
            cluster = ArgoCluster.from_local(local, template=template, **options)
        request = submit_request("campaign-long", total_steps=1000, deadline=clock.now() + 7200)
        runner.by_workflow = {request.name: Script(fail_at_step=400)}
        started = clock.now()
        cluster.submit(request)
        attempts: list[str] = []
        for _ in range(120):
            attempts = [p for p, s in runner.launched.items() if s.spec.workflow == request.name]
            phase = cluster.status(request.name).phase
            if len(attempts) >= 2 or phase.finished:
                break
            clock.advance(10)
        ran = clock.now() - started
        phase_text = cluster.status(request.name).phase.value
        cluster.close()
        return len(attempts), phase_text, ran


def scenario_retry(c: Campaign) -> None:
    static = _static_retry(c)
    attempts, phase, ran = _long_failure(None)
    c.log(f"retry: qosflow-train: {attempts} attempts, {phase} after {ran:.0f} s")
    control_attempts, control_phase, _ = _long_failure("qosflow-train-control")
    c.log(f"retry: control (maxDuration 5m): {control_attempts} attempts, {control_phase}")
    retried = attempts >= 2 and ran > 300 and phase.lower() not in ("failed", "error")
    control_stops = control_attempts == 1 and control_phase.lower() in ("failed", "error")
    c.add(
        long_segment_attempts=attempts,
        long_segment_retried_after_s=int(ran),
        control_maxduration_5m_retried=not control_stops,
        retry_template_static_ok=static,
    )
    c.metrics["retry_covers_long_segments"] = static and retried and control_stops


# ============================================================================ duplicates: storm


FAULTS = [
    ("drop_after", None, 3),
    ("drop", None, 3),
    ("status", 503, 3),
    ("status", 500, 2),
    ("status", 429, 2),
    ("delay", None, 2),
]


def _fault_plan() -> Any:
    from qosflow.local import FaultPlan, FaultRule

    plan = FaultPlan()
    create = rf"^{WORKFLOWS}$"
    for action, status, count in FAULTS:
        plan.add(
            FaultRule(
                action,  # type: ignore[arg-type]
                "POST",
                create,
                "argo",
                status=status or 500,
                retry_after=0.2 if status == 429 else None,
                delay_s=1.0,
                count=count,
            )
        )
    plan.add(FaultRule("drop", "GET", rf"^{WORKFLOWS}/", "argo", count=3))
    return plan


def count_duplicates(workflows: list[dict[str, Any]]) -> tuple[int, int]:
    """(segments, workflows beyond one per segment), by the job and segment labels."""
    seen: dict[tuple[str, str], int] = {}
    for wf in workflows:
        labels = wf["metadata"].get("labels") or {}
        key = (labels.get("qosflow.dev/job", ""), labels.get("qosflow.dev/segment", ""))
        seen[key] = seen.get(key, 0) + 1
    return len(seen), sum(n - 1 for n in seen.values())


CLIENT = """
import os, sys
from qosflow.core.cluster import SubmitRequest
from qosflow.core.pod import Checkpoint, PodSettings
from qosflow_argo import ArgoCluster
argo, kube, deadline, *jobs = sys.argv[1:]
cluster = ArgoCluster(argo, token=os.environ["CAMPAIGN_TOKEN"], namespace="qosflow", kube_url=kube)
pod = PodSettings(volumes=({"name": "ckpt", "persistentVolumeClaim": {"claimName": "{claim}"}},))
for job in jobs:
    cluster.submit(SubmitRequest(
        job=job, segment=0, units=1, unit="cpu", total_steps=10**6, resume=False,
        priority_class="qosflow-normal", priority=10, image="qosflow-trainer:local",
        command=("python", "-m", "qosflow_trainer", {small}), memory_per_unit="256Mi",
        deadline=float(deadline), checkpoint_dir="/ckpt/" + job,
        checkpoint_every_steps=5, pod=pod, checkpoint=Checkpoint("ckpt", "/ckpt")))
    print("submitted", job, flush=True)
""".replace("{small}", ", ".join(repr(a) for a in SMALL_TRAINER)).replace(
    "{claim}", "qosflow-checkpoints"
)
"""A client process submitting segments (the storm SIGKILLs it while a create is in flight)."""


def _thread_storm(local: Any, reqs: list[Any], threads: int) -> tuple[int, list[str]]:
    """``threads`` clients submitting every request at once; (submits that succeeded, errors)."""
    from qosflow_argo import ArgoCluster, RetryPolicy

    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def client(index: int) -> int:
        policy = RetryPolicy(budget_s=30.0, timeout_s=0.6)
        cluster = ArgoCluster.from_local(local, retry=policy, rng=random.Random(index))
        barrier.wait()
        done = 0
        for request in random.Random(index).sample(reqs, len(reqs)):
            try:
                cluster.submit(request)
                done += 1
            except Exception as exc:  # a failed submit is counted, not fatal
                errors.append(f"{type(exc).__name__}: {exc}")
        cluster.close()
        return done

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(client, range(threads))), errors


def _killed_clients(local: Any, reqs: list[Any], processes: int) -> int:
    """Client processes submitting ``reqs``, each SIGKILLed while a create is in flight.

    The server delays the creates and stores the workflow after the client died. Returns how many
    submits the clients reported; the caller submits everything again, as a restarted caller.
    """
    from qosflow.local import FaultRule

    local.faults.add(FaultRule("delay", "POST", rf"^{WORKFLOWS}$", "argo", delay_s=0.8, count=None))
    env = dict(os.environ, CAMPAIGN_TOKEN=local.token)
    argv = [local.argo_url, local.kube_url, repr(reqs[0].deadline)]
    children = [  # each its own segments, so a create stored after its client died shows
        spawn(
            [sys.executable, "-c", CLIENT, *argv, *(r.job for r in reqs[i::processes])],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    rng = random.Random(3)
    reported = 0
    for child in children:
        assert child.stdout is not None
        for _ in range(rng.randrange(1, 3)):  # let it submit once or twice, kill it mid-create
            if not child.stdout.readline():
                break
            reported += 1
        time.sleep(0.4)
        child.kill()
        child.wait()
        reported += (child.stdout.read() or "").count("submitted")
    time.sleep(1.0)  # the delayed creates complete
    local.faults.clear()
    return reported


def _outage(local: Any, reqs: list[Any], seconds: float) -> tuple[int, float]:
    """Submits with the default retry policy while every create answers 503 for ``seconds``.

    Returns (submits that failed, seconds the slowest one took).
    """
    from qosflow.local import FaultRule
    from qosflow_argo import ArgoCluster

    local.faults.add(FaultRule("status", "POST", rf"^{WORKFLOWS}$", "argo", status=503, count=None))
    threading.Timer(seconds, local.faults.clear).start()
    began = time.monotonic()

    def submit(request: Any) -> bool:
        cluster = ArgoCluster.from_local(local)
        try:
            cluster.submit(request)
            return True
        except Exception:
            return False
        finally:
            cluster.close()

    with ThreadPoolExecutor(len(reqs)) as pool:
        failed = sum(not ok for ok in pool.map(submit, reqs))
    return failed, time.monotonic() - began


def scenario_storm(c: Campaign) -> None:
    from qosflow.local import LocalCluster, ScriptedRunner
    from qosflow_argo import ArgoCluster

    threads, segments, processes = (8, 3, 1) if c.quick else (16, 6, 2)
    plan = _fault_plan()
    when = time.time() + 3600
    reqs = [submit_request(f"storm-{i}", total_steps=10**6, deadline=when) for i in range(segments)]
    late = [submit_request(f"storm-p{i}", deadline=when) for i in range(segments)]
    late = [replace(r, total_steps=10**6) for r in late]
    with LocalCluster(
        cpus=2, state_dir=c.folder("storm"), token=c.token, runner=ScriptedRunner(), faults=plan
    ) as local:
        ArgoCluster.from_local(local).ensure_installed(checkpoint_claim=CLAIM)
        submitted, errors = _thread_storm(local, reqs, threads)
        fired = sum(plan.fired)
        c.log(f"storm: {threads} threads done")
        before_kill = _killed_clients(local, late, processes)
        api = Api(local.argo_url, local.token)
        stored = len(
            [
                w
                for w in api("GET", WORKFLOWS).json()["items"] or []
                if "storm-p" in w["metadata"]["name"]
            ]
        )
        c.log(f"storm: {processes} client processes killed")
        submitted += _thread_storm(local, late, 2)[0]  # the restarted callers
        outage = 4.0 if c.quick else 5.0
        during = [submit_request(f"storm-o{i}", deadline=when) for i in range(5)]
        outage_failed, outage_took = _outage(local, during, outage)
        c.log(
            f"storm: {outage:.0f} s of 503s: {outage_failed} of 5 submits failed, slowest {outage_took:.1f} s"
        )
        items = Api(local.argo_url, local.token)("GET", WORKFLOWS).json()["items"] or []
        total_segments, extra = count_duplicates(items)
    for error in sorted(set(errors))[:5]:
        c.log(f"storm: submit failed: {error}")
    c.log(
        f"storm: {threads} threads x {segments} segments and {processes} killed client processes "
        f"(killed mid-create after {before_kill} submits): {submitted} submits ok, {fired} faults "
        f"fired, {len(items)} workflows for {total_segments} segments"
    )
    c.add(
        submits=threads * segments + before_kill + 2 * segments,
        submit_errors=len(errors),
        faults_injected=fired,
        killed_client_processes=processes,
        creates_stored_after_client_died=max(0, stored - before_kill),
        storm_workflows=len(items),
        submits_failed_in_outage=f"{outage_failed}/5 ({outage:.0f} s of 503s)",
        duplicates=extra + max(0, 2 * segments + 5 - total_segments),
    )


# ============================================================================ HTTP robustness


BAD_LENGTHS = ["abc", "-1", "1e3", " ", "12, 13"]


def _raw_cases(token: str) -> list[tuple[str, str, bytes]]:
    """(listener, label, bytes) of hand-made malformed requests."""
    auth = {"Authorization": f"Bearer {token}"}
    cases: list[tuple[str, str, bytes]] = []
    for listener, path in (("argo", WORKFLOWS), ("kube", PODS)):
        for length in BAD_LENGTHS:
            cases.append(
                (
                    listener,
                    f"Content-Length {length!r}",
                    head("POST", path, auth | {"Content-Length": length}),
                )
            )
        cases += [
            (listener, "short body", head("POST", path, auth | {"Content-Length": "100"}) + b"{"),
            (listener, "huge body", head("POST", path, auth | {"Content-Length": str(10**9)})),
            (listener, "body before token", head("POST", path, {"Content-Length": "100"})),
            (
                listener,
                "bad chunk",
                head("POST", path, auth | {"Transfer-Encoding": "chunked"}) + b"zz\r\n",
            ),
            (listener, "gzip TE", head("POST", path, auth | {"Transfer-Encoding": "gzip"})),
            (listener, "garbage line", b"GARBAGE\r\n\r\n"),
            (listener, "header without colon", b"GET / HTTP/1.1\r\nHost x\r\n\r\n"),
            (listener, "long header", head("GET", path, auth | {"X-Long": "x" * 70_000})),
            (listener, "non-UTF-8 path", b"GET /api/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"),
            (listener, "dot-dot path", head("GET", "/api/v1/namespaces/../pods/../log", auth)),
            (listener, "absolute URI", head("GET", f"http://evil.invalid{path}", auth)),
        ]
    return cases


def _requests_cases() -> list[tuple[str, str, str, Any, dict[str, str]]]:
    """(listener, method, path, body, headers) sent through ``requests``."""
    wf = WORKFLOWS
    json_h = {"Content-Type": "application/json"}
    merge = {"Content-Type": "application/merge-patch+json"}
    jpatch = {"Content-Type": "application/json-patch+json"}
    kube_wf = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows/m"
    cases: list[tuple[str, str, str, Any, dict[str, str]]] = [
        ("argo", "GET", f"{wf}?listOptions.limit=abc", None, {}),
        ("argo", "GET", f"{wf}?listOptions.limit=-1", None, {}),
        ("argo", "GET", f"{wf}?listOptions.limit=99999999999999999999", None, {}),
        ("argo", "GET", f"{wf}?listOptions.continue=abc", None, {}),
        ("argo", "GET", f"{wf}?listOptions.labelSelector=%3D%3D%3D", None, {}),
        ("kube", "GET", f"{PODS}?limit=abc", None, {}),
        ("kube", "GET", f"{PODS}?continue=x", None, {}),
        ("kube", "GET", f"{PODS}?timeoutSeconds=soon", None, {}),
        ("kube", "GET", f"{PODS}?labelSelector=a%20in%20(", None, {}),
        ("kube", "GET", f"{PODS}/m/log?tailLines=x", None, {}),
        ("kube", "GET", f"{PODS}/m/log?limitBytes=1e3", None, {}),
        ("argo", "POST", wf, b"[" * 100_000, json_h),
        ("argo", "POST", wf, b'{"a":' * 2_000 + b"1" + b"}" * 2_000, json_h),
        ("argo", "POST", wf, b'{"workflow": NaN}', json_h),
        ("argo", "POST", wf, b"\xff\xfe{not utf-8", json_h),
        ("argo", "POST", wf, b"", json_h),
        ("argo", "POST", f"{wf}/submit", {"resourceKind": 5}, {}),
        ("argo", "POST", f"{wf}/lint", {"workflow": {"spec": "x"}}, {}),
        ("argo", "PUT", f"{wf}/absent/stop", {"message": ["x"]}, {}),
        ("argo", "PUT", f"{wf}/m/terminate", b"{", json_h),
        ("argo", "POST", f"/api/v1/workflow-templates/{NS}", {"template": []}, {}),
        ("kube", "PATCH", f"{PODS}/m", [1, 2], jpatch),
        ("kube", "PATCH", f"{PODS}/m", {"metadata": "x"}, merge),
        ("kube", "PATCH", f"{PODS}/m/resize", [{"op": "replace", "path": "", "value": []}], jpatch),
        ("kube", "PATCH", kube_wf, {"spec": {"priority": "high"}}, merge),
        ("kube", "PATCH", kube_wf, {"status": {"nodes": []}}, merge),
        (
            "kube",
            "PATCH",
            f"{PODS}/m",
            b"metadata: " + b"[" * 5000,
            {"Content-Type": "application/apply-patch+yaml"},
        ),
        ("kube", "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": "x"}, {}),
        (
            "kube",
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": "g"}, "value": 2**40},
            {},
        ),
    ]
    return cases


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every leaf (and every container) of a JSON document."""
    yield path
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _leaves(value, (*path, index))


MUTATIONS: list[Any] = [None, [], {}, "", "abc", -1, 2**63, 1.5, True, "../..", "{{x}}"]


def mutated(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the value at ``path`` replaced."""
    out = copy.deepcopy(doc)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


class HttpTally:
    """Answers of a request storm: 5xx, dropped or hung, and how many were sent."""

    def __init__(self, c: Campaign) -> None:
        self.c = c
        self.sent = 0
        self.errors_5xx: list[str] = []
        self.dropped: list[str] = []

    def status(self, label: str, status: int | None, problem: str = "") -> None:
        """Record one answer."""
        self.sent += 1
        if status is None:
            self.dropped.append(f"{label}: {problem}")
        elif status >= 500 and status != 501:
            self.errors_5xx.append(f"{label}: HTTP {status}")


class ExceptionLog(logging.Handler):
    """Collects log records that carry a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep records with exception info."""
        if record.exc_info:
            self.records.append(f"{record.name}: {record.getMessage()}")


def _storm_raw(local: Any, tally: HttpTally) -> None:
    for listener, label, data in _raw_cases(local.token):
        base = local.argo_url if listener == "argo" else local.kube_url
        status, _, problem = raw_request(base, data, timeout_s=5.0)
        tally.status(f"{listener} {label}", status, problem)


def _storm_requests(local: Any, tally: HttpTally) -> None:
    apis = {"argo": Api(local.argo_url, local.token), "kube": Api(local.kube_url, local.token)}
    for listener, method, path, body, headers in _requests_cases():
        options: dict[str, Any] = {"headers": headers}
        options["data" if isinstance(body, bytes) else "json"] = body
        label = f"{listener} {method} {path[:60]} {headers.get('Content-Type', '')}"
        try:
            response = apis[listener](method, path, timeout=30, **options)
            tally.status(f"{label} {str(body)[:30]!r}", response.status_code)
        except requests.RequestException as exc:
            tally.status(f"{label} {str(body)[:30]!r}", None, type(exc).__name__)


def _storm_generated(local: Any, tally: HttpTally, clock: Any, limit: int) -> int:
    """POST mutations of a valid workflow; returns how many were accepted."""
    argo = Api(local.argo_url, local.token)
    base = container_wf("gen", steps=3)
    paths = [p for p in _leaves(base) if len(p) >= 2 and p[:2] != ("workflow", "metadata")]
    accepted = 0
    rng = random.Random(15)
    cases = [(p, v) for p in paths for v in MUTATIONS]
    for index, (path, value) in enumerate(rng.sample(cases, min(limit, len(cases)))):
        body = mutated(base, path, value)
        body["workflow"]["metadata"]["name"] = f"gen-{index}"
        try:
            response = argo("POST", WORKFLOWS, json=body)
        except requests.RequestException as exc:
            tally.status(f"generated {path}={value!r}", None, type(exc).__name__)
            continue
        tally.status(f"generated {path}={value!r}", response.status_code)
        accepted += response.status_code == 200
        if index % 20 == 0:
            clock.advance(1)
    return accepted


def _slow_connections(local: Any, count: int) -> tuple[int, int, bool]:
    """``count`` stalled clients, half in the body and half in the head.

    Returns (stalled bodies answered 408 in time, stalled heads still open without an answer,
    whether a normal request was served meanwhile).
    """
    host, port = local.argo_url.removeprefix("http://").split(":")
    auth = {"Authorization": f"Bearer {local.token}", "Content-Length": "50"}
    full = head("POST", WORKFLOWS, auth)
    bodies: list[socket.socket] = []
    heads: list[socket.socket] = []
    for index in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(full[: len(full) // 2] if index % 2 else full + b"{")
        (heads if index % 2 else bodies).append(sock)
    try:
        api = Api(local.argo_url, local.token)
        served = api("GET", "/api/v1/version", timeout=3).status_code == 200
    except requests.RequestException:
        served = False
    answered = 0
    for sock in bodies:
        sock.settimeout(local.http_limits["read_timeout_s"] + 2)
        with contextlib.suppress(OSError):
            answered += sock.recv(64).startswith(b"HTTP/1.1 408")
    open_heads = 0
    for sock in heads:
        sock.settimeout(0.05)
        try:
            open_heads += sock.recv(1) == b"" and 0
        except TimeoutError:
            open_heads += 1
        except OSError:
            pass
    for sock in bodies + heads:
        sock.close()
    return answered, open_heads, served


def scenario_http(c: Campaign) -> None:
    from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock

    clock = VirtualClock()
    handler = ExceptionLog()
    logging.getLogger("qosflow").addHandler(handler)
    tally = HttpTally(c)
    try:
        with LocalCluster(
            cpus=3,  # one for "m", one for the generated ones, one free for "after-storm"
            state_dir=c.folder("http"),
            token=c.token,
            clock=clock,
            runner=ScriptedRunner(default=Script()),
            read_timeout_s=0.5,
            max_body_bytes=256 * 1024,
        ) as local:
            argo = Api(local.argo_url, local.token)
            argo("POST", WORKFLOWS, json=container_wf("m", steps=10**6)).raise_for_status()
            clock.advance(1)
            _storm_raw(local, tally)
            _storm_requests(local, tally)
            accepted = _storm_generated(local, tally, clock, 120 if c.quick else 400)
            victims = _template_poison(argo)  # no tick since: it is still queued
            after = container_wf("after-storm", steps=3)
            after["workflow"]["spec"]["priority"] = 1000  # ahead of the generated ones queued
            argo("POST", WORKFLOWS, json=after).raise_for_status()
            for _ in range(40):
                clock.advance(1)
            phases = (argo.phase("after-storm"), argo.phase("m"))
            moving = phases == ("Succeeded", "Running")
            victim_phases = [argo.phase(v) for v in victims]
            moving = moving and all(p in ("Failed", "Error") for p in victim_phases)
            items = argo("GET", WORKFLOWS).json()["items"] or []
            stuck = [
                w["metadata"]["name"]
                for w in items
                if w["metadata"]["name"].startswith("gen-")
                and (w.get("status") or {}).get("phase") in (None, "", "Pending", "Running")
            ]
            slow = 10 if c.quick else 40
            answered, open_heads, served = _slow_connections(local, slow)
    finally:
        logging.getLogger("qosflow").removeHandler(handler)
    for problem in tally.errors_5xx + tally.dropped + handler.records:
        c.log(f"http: {problem}")
    c.log(
        f"http: {tally.sent} requests, {len(tally.errors_5xx)} 5xx, {len(tally.dropped)} "
        f"dropped/hung, {accepted} generated accepted; after-storm, m: {phases}; workflow "
        f"whose template was poisoned while queued: {victim_phases}"
    )
    c.tracebacks += [f"HTTP {e}" for e in tally.errors_5xx]
    c.tracebacks += [f"server log: {r}" for r in handler.records]
    c.add(
        http_requests=tally.sent,
        http_500=len(tally.errors_5xx),
        http_dropped_or_hung=len(tally.dropped),
        http_server_tracebacks=len(handler.records),
        generated_accepted=accepted,
        generated_not_finished_after_40s=len(stuck),
        stalled_bodies_answered_408=f"{answered}/{slow // 2}",
        stalled_heads_held_open=f"{open_heads}/{slow // 2}",
        served_during_slow_connections=served,
    )
    # the generated workflows that were accepted (and the poisoned template) broke the controller
    c.add(poisoned_controller=0 if moving else accepted + len(victims) or 1)


# ============================================================================ CLI tracebacks


def _trace_text() -> str:
    from qosflow.sim.trace import packaged_dir

    text = (packaged_dir() / "generated" / "100jobs_1500lam.csv").read_text(encoding="utf-8")
    return "".join(text.splitlines(keepends=True)[:6])


JOB_YAML = """name: campaign-plan
total_steps: 2000
deadline: PT4H
resources: {unit: cpu, min: 1, max: 8, levels: [1, 2, 4, 8], per_node: 8}
step_seconds_estimate: 1.0
"""


def _history_cases(c: Campaign, folder: Path) -> list[tuple[str, list[str], bool]]:
    """``qosflow plan`` with history stores that are broken (the issue's store findings)."""
    job = folder / "job.yaml"
    job.write_text(JOB_YAML)
    good = folder / "history.db"
    base = ["plan", str(job), "--cluster", "2x8", "--history"]
    _cli_in_process([*base, f"sqlite:///{good}"])  # creates it
    data = bytearray(good.read_bytes())
    for index in range(100, len(data), 50):
        data[index] ^= 0xFF
    (folder / "flipped.db").write_bytes(bytes(data))
    unreachable = f"postgresql+psycopg://qosflow:{c.password}@127.0.0.1:1/qosflow"
    return [
        ("plan, good history", [*base, f"sqlite:///{good}"], True),
        ("plan, byte-flipped history", [*base, f"sqlite:///{folder / 'flipped.db'}"], False),
        ("plan, history is a YAML file", [*base, f"sqlite:///{job}"], False),
        ("plan, history under a file", [*base, f"sqlite:///{job}/h.db"], False),
        ("plan, unreachable PostgreSQL", [*base, unreachable], False),
        ("plan, unknown dialect", [*base, "nonsense://x"], False),
    ]


def _cli_cases(folder: Path) -> list[tuple[str, list[str], bool]]:
    """(label, argv, whether it must succeed) of ``qosflow simulate``/``bound`` runs."""
    import codecs

    trace = _trace_text()
    files = {
        "latin-1": (trace + "9,1,2,r\xe9snet,5,256,1,3,0\n").encode("latin-1"),
        "utf-16-no-bom": trace.encode("utf-16-le"),
        "utf-16-bom": trace.encode("utf-16"),
        "utf-16-torn": trace.encode("utf-16")[:-1],
        "utf-8-bom": codecs.BOM_UTF8 + trace.encode("utf-8"),
        "utf-32": trace.encode("utf-32"),
        "binary": bytes(range(256)) * 4,
        "empty": b"",
    }
    fast = ["--policies", "k8s-default", "--no-bound", "--cluster", "2x8", "--no-timing"]
    cases = []
    for name, data in files.items():
        path = folder / f"{name}.csv"
        path.write_bytes(data)
        must = name in ("utf-16-bom", "utf-8-bom")
        cases.append(
            (
                name,
                ["simulate", "--trace", str(path), *fast, "--out", str(folder / f"out-{name}")],
                must,
            )
        )
    (folder / "a-file").write_text("x")
    cases += [
        (
            "seed:jobs=abc",
            ["simulate", "--trace", "seed:jobs=abc", *fast, "--out", str(folder / "o")],
            False,
        ),
        ("bound seed:jobs=abc", ["bound", "--trace", "seed:jobs=abc"], False),
        ("seed:sigma=nan", ["simulate", "--trace", "seed:sigma=nan", *fast], False),
        (
            "--out is a file",
            ["simulate", "--trace", "seed:jobs=3", *fast, "--out", str(folder / "a-file")],
            False,
        ),
        ("missing trace", ["simulate", "--trace", str(folder / "absent.csv"), *fast], False),
        ("trace is a folder", ["simulate", "--trace", str(folder), *fast], False),
        (
            "bad cluster",
            ["simulate", "--trace", "seed:jobs=3", "--cluster", "2xlots", "--no-bound"],
            False,
        ),
    ]
    return cases


def _cli_in_process(argv: list[str]) -> tuple[int, str]:
    """Run ``qosflow`` in this process; an exception escaping it is printed as a traceback."""
    import io

    from qosflow.cli import main as qosflow_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = qosflow_main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # what the console script would print
            traceback.print_exc(file=out)
            code = 1
    return code, out.getvalue()


SUBPROCESS_CASES = ("utf-16-no-bom", "seed:jobs=abc", "--out is a file")
"""Cases also run as real ``python -m qosflow.cli`` processes (the rest in this process)."""


def scenario_cli(c: Campaign) -> None:
    folder = c.folder("cli")
    cases = _cli_cases(folder) + _history_cases(c, folder)
    if c.quick:
        cases = [case for case in cases if case[0] not in ("binary", "utf-32", "trace is a folder")]
    env = dict(os.environ, MPLBACKEND="Agg")
    children = {
        label: subprocess.Popen(
            [sys.executable, "-m", "qosflow.cli", *argv],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for label, argv, _ in cases
        if label in SUBPROCESS_CASES
    }
    results = [(label, *_cli_in_process(argv), must) for label, argv, must in cases]
    for label, child in children.items():
        output = child.communicate(timeout=120)[0]
        must = next(m for lab, _, m in cases if lab == label)
        results.append((f"{label} (process)", child.returncode, output, must))
    wrong = 0
    for label, code, output, must in results:
        c.check_traceback(f"qosflow {label}", output)
        c.check_text(f"output of qosflow {label}", output)
        last = (output.strip().splitlines() or [""])[-1]
        lines = output.strip().splitlines()  # bad input: exit 2 and one line "error: ..."
        ok = code == 0 if must else code == 2 and len(lines) == 1 and lines[0].startswith("error:")
        wrong += not ok
        shown = last if must else output.strip().splitlines()[0] if output.strip() else ""
        c.log(f"cli: {label}: exit {code}{'' if ok else ' (WRONG)'}: {shown[:150]}")
    c.add(cli_runs=len(results), cli_wrong_exit=wrong)


# ============================================================================ trainer kills


def _trainer(ckpt: Path, every: int, steps: int, resume: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QOSFLOW_")}
    env |= {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    args = ["--width", "256", "--depth", "3", "--input-dim", "64", "--batch-size", "64"]
    command = [sys.executable, "-m", "qosflow_trainer", *args, "--log-every", "1"]
    command += ["--steps", str(steps), "--checkpoint-dir", str(ckpt)]
    command += ["--checkpoint-every", str(every), "--resume", resume, "--keep-checkpoints", "2"]
    err = open(ckpt.parent / "trainer.log", "a")  # noqa: SIM115 - the child's stderr
    proc = spawn(command, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    err.close()
    return proc


def _kill_mid_write(proc: subprocess.Popen[str], ckpt: Path, min_s: float) -> bool:
    """SIGKILL ``proc`` once a temporary checkpoint file exists (after ``min_s``); True if so."""
    began = time.monotonic()
    while proc.poll() is None:
        elapsed = time.monotonic() - began
        mine = f".{proc.pid}.tmp"  # not a stale one of a killed predecessor
        writing = elapsed > min_s and any(p.name.endswith(mine) for p in os.scandir(ckpt))
        if writing or elapsed > min_s + 3:
            proc.kill()
            proc.wait()
            return writing
        time.sleep(0.0005)
    return False


def _steps_logged(log: Path) -> int:
    """How many trainer runs of ``log`` have logged a step."""
    with contextlib.suppress(OSError):
        return sum(1 for run in trainer_runs(log.read_text()) if run.last > run.start)
    return 0


def _stepped(log: Path, runs_before: int) -> bool:
    """Whether a run after the first ``runs_before`` ones has logged a step."""
    return _steps_logged(log) > runs_before


def _run_and_stop(ckpt: Path, log: Path, every: int, runs_before: int) -> int:
    """Start a resuming trainer, let it step, SIGTERM it; its exit code."""
    proc = _trainer(ckpt, every, 10**6, "auto")
    wait_for("the trainer's first step", lambda: _steps_logged(log) > runs_before, 60, 0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def _corrupt_newest(ckpt: Path, how: str) -> None:
    newest = max(p for p in ckpt.iterdir() if p.suffix == ".qfck")
    data = bytearray(newest.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        del data[len(data) * 2 // 3 :]
    newest.write_bytes(bytes(data))


def _corruptions(ckpt: Path, log: Path, every: int) -> tuple[int, int]:
    """Corrupt the newest checkpoint twice (bit flip, truncation) and resume each time.

    Returns (corruptions detected, resumes that failed or used the corrupt file).
    """
    detected = bad = 0
    for how in ("flip", "truncate"):
        before = trainer_runs(log.read_text())
        _corrupt_newest(ckpt, how)
        code = _run_and_stop(ckpt, log, every, len(before))
        run = trainer_runs(log.read_text())[len(before)]
        detected += run.skipped >= 1
        bad += code != 75 or run.start > before[-1].last - 1 or run.start == 0
    return detected, bad


def scenario_trainer(c: Campaign) -> None:
    kills = 4 if c.quick else 8
    every = 10
    folder = c.folder("trainer")
    ckpt = folder / "ckpt"
    ckpt.mkdir()
    log = folder / "trainer.log"
    mid_write = 0
    rng = random.Random(7)
    for kill in range(kills):
        proc = _trainer(ckpt, every, 10**6, "auto")
        wait_for("the trainer's first step", functools.partial(_stepped, log, kill), 60, 0.01)
        mid_write += _kill_mid_write(proc, ckpt, rng.uniform(0.05, 0.6))
    code = _run_and_stop(ckpt, log, every, kills)  # resumes after the last kill
    runs = trainer_runs(log.read_text())
    losses = lost_between(runs)
    failures = resumed_badly(runs) + (code != 75)
    failures += sum(
        nxt.start == 0 and prev.checkpoint > 0 for prev, nxt in itertools.pairwise(runs)
    )
    temps = [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    detected, corrupt_bad = _corruptions(ckpt, log, every)
    beyond = sum(max(0, lost - every) for lost in losses)
    c.log(
        f"trainer: {kills} SIGKILLs ({mid_write} while a checkpoint was written), lost per kill "
        f"{losses}, checkpoint every {every}, SIGTERM exit {code}, temps left {temps}, "
        f"corruptions detected {detected}/2"
    )
    c.add(
        trainer_kills=kills,
        trainer_kills_mid_checkpoint=mid_write,
        trainer_resume_failures=failures + corrupt_bad,
        trainer_max_steps_lost=max(losses, default=0),
        checkpoint_corruptions_detected=f"{detected}/2",
        stale_checkpoint_temps_left=len(temps),
        steps_lost_beyond_checkpoint=beyond,
    )


# ============================================================================ server restarts


def _segment(job: str, steps: int, every: int) -> Any:
    command = ("python", "-m", "qosflow_trainer", *SMALL_TRAINER, "--log-every", "1")
    return submit_request(
        job,
        total_steps=steps,
        checkpoint_every_steps=every,
        checkpoint_dir=f"{CHECKPOINT_PATH}/{job}",
        command=command,
        resume=False,
    )


def _progress(cluster: Any, name: str) -> int:
    return int(cluster.status(name).steps_done or 0)


def _workflow_runs(state: Path, pods: list[dict[str, Any]]) -> list[Run]:
    runs: list[Run] = []
    ordered = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    for pod in ordered:
        log = state / "pods" / NS / pod["metadata"]["name"] / "main.log"
        with contextlib.suppress(OSError):
            runs += trainer_runs(log.read_text(encoding="utf-8", errors="replace"))
    return runs


def _pod_dir(state: Path, workflow: str) -> Path | None:
    found = sorted((state / "pods" / NS).glob(f"{workflow}-*"))
    return found[-1] if found else None


def _kill_container(cluster: Any, pod: Path, workflow: str) -> int:
    """SIGKILL the container (not its supervisor) of a training pod once it has trained on."""
    reached = _progress(cluster, workflow)
    wait_for(
        "training after the restart",
        lambda: _progress(cluster, workflow) >= reached + 100,
        60,
        0.05,
    )
    supervisor = int(json.loads((pod / ".pid").read_text())["pid"])
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for child in children:
        os.kill(int(child), signal.SIGKILL)
    return len(children)


def _restart_once(
    c: Campaign, state: Path, every: int, *, kill_container: bool
) -> tuple[int, int, int]:
    """Kill and restart the daemon; (steps lost beyond a checkpoint, reruns, workflows not done).

    Two segments train; the daemon is SIGKILLed while both run; the short one ends while the
    server is down; the daemon restarts on the same state folder (then, with ``kill_container``,
    the long one's container is SIGKILLed: the template's retry resumes it) and both must end
    Succeeded.
    """
    long_ = _segment("keep", 2500, every)
    short = _segment("done", 600, every)
    daemon, info = start_daemon(state, "--progress-tick", "0.2")
    cluster = argo_client(info)
    try:
        cluster.ensure_installed(checkpoint_claim=CLAIM)
        cluster.submit(long_)
        cluster.submit(short)
        wait_for(
            "both segments training",
            lambda: _progress(cluster, long_.name) >= 100 and _progress(cluster, short.name) >= 50,
            90,
            0.05,
        )
        scan_pod_envs(c, state, "restart")
        before = _progress(cluster, long_.name)
        daemon.kill()  # SIGKILL: no shutdown; the pods keep running
        daemon.wait()
        c.log("restart: SIGKILLed the daemon during training")
        short_pod, long_pod = _pod_dir(state, short.name), _pod_dir(state, long_.name)
        if short_pod is None or long_pod is None:
            raise RuntimeError("no pod folder of the running segments")
        wait_for(
            "the short segment ended while the server was down",
            lambda: (short_pod / ".exit_code").exists(),
            60,
            0.05,
        )
        if (long_pod / ".exit_code").exists():
            c.log("restart: the long segment ended during the downtime too (busy machine?)")
        daemon, info = start_daemon(state, "--progress-tick", "0.2")
        cluster.close()
        cluster = argo_client(info)
        after = _progress(cluster, long_.name)  # the first read: never back to 0/M
        c.add(progress_dropped_after_restart=int(after < before))
        killed = 0
        if kill_container:  # and a container killed under the restarted server: a retry resumes
            killed = _kill_container(cluster, long_pod, long_.name)
            c.add(training_pod_kills=killed)
        wait_for(
            "both workflows ended",
            lambda: all(cluster.status(r.name).phase.finished for r in (long_, short)),
            120,
            0.3,
        )
        beyond, runs_beyond_one, unfinished = _restart_tally(
            c, state, cluster, (long_, short), every
        )
        return beyond, runs_beyond_one - killed, unfinished
    finally:
        cluster.close()
        stop_daemon(daemon)


def _restart_tally(
    c: Campaign, state: Path, cluster: Any, reqs: tuple[Any, ...], every: int
) -> tuple[int, int, int]:
    beyond = reruns = unfinished = 0
    for request in reqs:
        pods = cluster.kube.list_pods(f"{WF_LABEL}={request.name}")
        runs = _workflow_runs(state, pods)
        losses = lost_between(runs)
        phase = cluster.status(request.name).phase.value
        last = runs[-1].last if runs else 0
        if phase != "Succeeded" or last < request.total_steps:
            unfinished += 1
            if runs:  # what a resume from the last checkpoint would have to redo
                losses.append(last % every)
        beyond += sum(max(0, lost - every) for lost in losses)
        reruns += max(0, len(runs) - 1)
        c.log(f"restart: {request.name}: {phase}, {len(pods)} pod(s), runs {runs}, lost {losses}")
    return beyond, reruns, unfinished


def scenario_restart(c: Campaign) -> None:
    state = c.folder("restart") / "state"
    beyond, reruns, unfinished = _restart_once(c, state, 50, kill_container=not c.quick)
    c.add(
        server_kills=1,
        trainer_reruns_after_server_restart=reruns,
        workflows_not_succeeded_after_restart=unfinished,
        steps_lost_beyond_checkpoint=beyond,
    )


# ============================================================================ poisoned controller


def _bad_cpu(name: str, value: str, key: str = "cpu", where: str = "requests") -> dict[str, Any]:
    body = container_wf(name)
    body["workflow"]["spec"]["templates"][0]["container"]["resources"][where][key] = value
    return body


def _with_main(name: str, **fields: Any) -> dict[str, Any]:
    body = container_wf(name)
    body["workflow"]["spec"]["templates"][0].update(fields)
    return body


def _with_spec(name: str, **fields: Any) -> dict[str, Any]:
    body = container_wf(name)
    body["workflow"]["spec"].update(fields)
    return body


def _bad_workflows() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, namespace, create request) of the issue's poisonous workflows and their kin."""
    param = _with_spec("bad-param", arguments={"parameters": [{"name": "cpu", "value": "lots"}]})
    param["workflow"]["spec"]["templates"][0]["container"]["resources"]["requests"]["cpu"] = (
        "{{workflow.parameters.cpu}}"
    )
    patch = "podSpecPatch"
    return [
        ("cpu abc", NS, _bad_cpu("bad-cpu", "abc")),
        ("cpu limit abc", NS, _bad_cpu("bad-cpu-limit", "abc", where="limits")),
        ("memory 1Gx", NS, _bad_cpu("bad-memory", "1Gx", key="memory")),
        ("cpu from a parameter 'lots'", NS, param),
        ("retry limit 'x'", NS, _with_main("bad-limit", retryStrategy={"limit": "x"})),
        ("retry limit 1.5", NS, _with_main("bad-limit-float", retryStrategy={"limit": 1.5})),
        (
            "backoff duration 'soon'",
            NS,
            _with_main("bad-backoff", retryStrategy={"limit": 1, "backoff": {"duration": "soon"}}),
        ),
        (
            "backoff maxDuration 'later'",
            NS,
            _with_main(
                "bad-maxduration",
                retryStrategy={"limit": 1, "backoff": {"duration": "1s", "maxDuration": "later"}},
            ),
        ),
        (
            "backoff factor 'two'",
            NS,
            _with_main("bad-factor", retryStrategy={"limit": 1, "backoff": {"factor": "two"}}),
        ),
        ("podSpecPatch not JSON", NS, _with_main("bad-patch", **{patch: "{not: [json"})),
        ("podSpecPatch a list", NS, _with_main("bad-patch-list", **{patch: "[1, 2]"})),
        (
            "podSpecPatch grace 'soon'",
            NS,
            _with_main("bad-patch-grace", **{patch: '{"terminationGracePeriodSeconds": "soon"}'}),
        ),
        ("workflow podSpecPatch not JSON", NS, _with_spec("bad-wf-patch", **{patch: "[oops"})),
        (
            "activeDeadlineSeconds 'soon'",
            NS,
            _with_spec("bad-deadline", activeDeadlineSeconds="soon"),
        ),
        ("priority 'high'", NS, _with_spec("bad-priority", priority="high")),
        (
            "env without a name",
            NS,
            _with_main(
                "bad-env",
                container={
                    **container_wf("x")["workflow"]["spec"]["templates"][0]["container"],
                    "env": [{"value": "v"}],
                },
            ),
        ),
        ("namespace '..', name state.json", "..", container_wf("state.json")),
        ("namespace '.', name state.json", ".", container_wf("state.json")),
    ]


def _post_raw(base: str, token: str, path: str, body: Any) -> int | None:
    data = json.dumps(body).encode()
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Content-Length": str(len(data)),
    }
    status, _, _ = raw_request(base, head("POST", path, headers) + data, timeout_s=10)
    return status


def _local_cli(c: Campaign, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "qosflow.cli", "local", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    c.check_traceback(f"qosflow local {args[0]}", output)
    return proc.returncode, output


def _up(c: Campaign, state: Path) -> dict[str, Any] | None:
    from qosflow.local.cli import read_info

    code, output = _local_cli(c, "up", "--port", "0", "--cpus", "2", "--state-dir", str(state))
    info = read_info(state)
    if code != 0 or info is None:
        c.log(f"poison: `qosflow local up` failed (exit {code}): {output[-800:]}")
        return None
    return info


def _down(c: Campaign, state: Path) -> bool:
    code, output = _local_cli(c, "down", "--state-dir", str(state))
    ok = code == 0 and not (state / "cluster.json").exists()
    if not ok:
        c.log(f"poison: `qosflow local down` failed (exit {code}): {output[-800:]}")
    return ok


SLEEPER = ["python", "-c", "import time; time.sleep(0.3)"]


def _template_poison(argo: Api) -> list[str]:
    """A queued workflow whose template is then updated with a CPU of 'abc'.

    Call it between two ticks of a virtual clock (the controller has not seen the workflow yet);
    returns its name if it was accepted.
    """
    spec = container_wf("x", command=SLEEPER)["workflow"]["spec"]
    spec["arguments"] = {"parameters": [{"name": "cpu", "value": "1"}]}
    spec["templates"][0]["container"]["resources"] = {
        "requests": {"cpu": "{{workflow.parameters.cpu}}"}
    }
    path = f"/api/v1/workflow-templates/{NS}"
    created = argo(
        "POST", path, json={"template": {"metadata": {"name": "tp"}, "spec": spec}}
    ).json()
    ref = {"metadata": {"name": "tp-victim"}, "spec": {"workflowTemplateRef": {"name": "tp"}}}
    accepted = argo("POST", WORKFLOWS, json={"workflow": ref}).status_code == 200
    spec["arguments"]["parameters"][0]["value"] = "abc"
    created["spec"] = spec
    argo("PUT", f"{path}/tp", json={"template": created})
    return ["tp-victim"] if accepted else []


def _isolated(c: Campaign, argo: Api, name: str, namespace: str) -> bool:
    """Whether an accepted bad workflow ended (or is gone: quarantined), not stuck."""
    response = argo("GET", f"/api/v1/workflows/{namespace}/{name}")
    status = response.json().get("status") or {} if response.status_code == 200 else {}
    phase = status.get("phase") or str(response.status_code)
    ok = phase in ("Succeeded", "Failed", "Error", "404")  # ended, or quarantined
    c.log(f"poison: {namespace}/{name}: {phase}: {str(status.get('message'))[:100]}")
    return ok


def _submit_bad(c: Campaign, info: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
    """Submit every bad workflow; (accepted (name, namespace), refused count)."""
    accepted: list[tuple[str, str]] = []
    refused = 0
    for label, namespace, body in _bad_workflows():
        status = _post_raw(info["argo_url"], info["token"], f"/api/v1/workflows/{namespace}", body)
        name = body["workflow"]["metadata"]["name"]
        c.log(f"poison: {label}: HTTP {status}")
        if status is not None and 200 <= status < 300:
            accepted.append((name, namespace))
        else:
            refused += 1
            c.tracebacks += (
                [f"create {label}: HTTP {status}"] if status is None or status >= 500 else []
            )
    return accepted, refused


def _bystander(argo: Api, name: str) -> bool:
    argo("POST", WORKFLOWS, json=container_wf(name, command=SLEEPER)).raise_for_status()
    try:
        wait_for(
            f"{name} succeeded",
            lambda: argo.phase(name) in ("Succeeded", "Failed", "Error"),
            30,
            0.2,
        )
    except TimeoutError:
        return False
    return argo.phase(name) == "Succeeded"


def _poison_state_file(state: Path) -> int:
    """Add poisoned objects to a stopped cluster's ``state.json``; how many were added."""
    doc = json.loads((state / "state.json").read_text())
    good: dict[str, Any] = next(
        r["object"] for r in doc["objects"] if r["object"]["metadata"]["name"] == "bystander"
    )

    def clone(name: str, **meta: Any) -> dict[str, Any]:
        obj = copy.deepcopy(good)
        obj["metadata"].update(name=name, uid=f"uid-{name}", **meta)
        obj.pop("status", None)
        return obj

    bad_cpu = clone("saved-bad-cpu")
    bad_cpu["spec"]["templates"][0]["container"]["resources"]["requests"]["cpu"] = "abc"
    rows = [bad_cpu, clone("state.json", namespace=".."), "garbage", {"kind": "Mystery"}]
    start = max(r["order"] for r in doc["objects"])
    doc["objects"] += [{"order": start + i + 1, "object": o} for i, o in enumerate(rows)]
    (state / "state.json").write_text(json.dumps(doc))
    return len(rows)


def scenario_poison(c: Campaign) -> None:
    root = c.folder("poison")
    state = root / "state"
    before = sorted(p.name for p in root.iterdir())
    info = _up(c, state)
    if info is None:
        raise RuntimeError("`qosflow local up` did not start on a fresh state folder")
    try:
        accepted, refused = _submit_bad(c, info)
        argo = Api(info["argo_url"], info["token"])
        moved = _bystander(argo, "bystander")
        isolated = {n: _isolated(c, argo, n, ns) for n, ns in accepted}
    finally:
        down_ok = _down(c, state)
    poisoned_rows = _poison_state_file(state)  # what an older version may have saved
    again = _up(c, state)
    up_ok = again is not None
    token_kept = up_ok and again is not None and again["token"] == info["token"]
    moved_after = saved_ok = False
    if again is not None:
        try:
            argo = Api(again["argo_url"], info["token"])  # the old token: clients keep working
            moved_after = _bystander(argo, "bystander-after-restart")
            saved_ok = _isolated(c, argo, "saved-bad-cpu", NS)
            isolated = {
                n: ok and _isolated(c, argo, n, ns)
                for (n, ns), ok in zip(accepted, isolated.values(), strict=True)
            }
        finally:
            down_ok = _down(c, state) and down_ok
    escaped = sorted(set(p.name for p in root.iterdir()) - set(before) - {"state"})
    escaped += [str(p) for p in (state / "pods").glob("*") if p.name in ("..", ".")]
    broken = not (moved and moved_after and down_ok and up_ok) or bool(escaped)
    poisoned = len(accepted) if broken else sum(not ok for ok in isolated.values())
    poisoned += not saved_ok  # the saved poison must fail alone (or be quarantined) too
    if broken and not accepted:
        poisoned = 1  # broken by something refused, still a poisoned controller
    c.log(
        f"poison: {len(accepted)} accepted {accepted}, {refused} refused; others moved: {moved}/"
        f"{moved_after}; down {down_ok}, up again {up_ok}, token kept {token_kept}, escaped {escaped}"
    )
    quarantined = (
        len(json.loads((state / "quarantine.json").read_text()))
        if (state / "quarantine.json").exists()
        else 0
    )
    c.add(
        saved_poison_rows=poisoned_rows,
        saved_poison_quarantined=quarantined,
        bad_workflows=len(accepted) + refused,
        bad_workflows_refused=refused,
        bad_workflows_accepted_isolated=sum(isolated.values()),
        restart_keeps_token=bool(token_kept),
        poisoned_controller=poisoned,
    )
    log = state / "server.log"
    if log.exists():
        c.add(server_log_tracebacks=log.read_text(errors="replace").count("Traceback (most recent"))


# ============================================================================ Airflow end to end


class RecordingTI:
    """A task instance stand-in: XCom in a dict, every value kept for the scan."""

    def __init__(self, dag_id: str) -> None:
        self.dag_id, self.map_index, self.task_id = dag_id, -1, ""
        self.try_number = 1
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        """Store a JSON copy."""
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        """Read one value back."""
        return self.xcoms.get((task_ids, key))


def drive(op: Any, ctx: dict[str, Any], kwargs_seen: list[Any], timeout_s: float = 120) -> Any:
    """Run an operator like Airflow would: execute, and for each deferral its trigger's event."""
    from airflow.sdk.exceptions import TaskDeferred

    ti = ctx["ti"]
    ti.task_id = op.task_id
    method: Callable[..., Any] = op.execute
    extra: dict[str, Any] = {}
    while True:
        try:
            result = method(ctx, **extra)
            break
        except TaskDeferred as deferred:
            classpath, kwargs = deferred.trigger.serialize()
            kwargs_seen.append({"classpath": classpath, "kwargs": kwargs})
            trigger = type(deferred.trigger)(**json.loads(json.dumps(kwargs, default=str)))
            event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), timeout_s))
            method, extra = getattr(op, deferred.method_name), {"event": event.payload}
    if result is not None:
        ti.xcoms[(op.task_id, "return_value")] = json.loads(json.dumps(result))
    return result


def _serve_history_by_sqlite(c: Campaign, path: Path) -> Callable[[], None]:
    """Serve the history URL (PostgreSQL, with a password) by a SQLite file.

    There is no database server on loopback; the steps still read the URL, password included,
    from the connection and pass it on.
    """
    import qosflow.store.history as history

    real = history.HistoryStore
    url = c.history_url

    class Served(real):  # type: ignore[valid-type, misc]
        def __init__(self, given: str = url) -> None:
            if given != url:
                raise AssertionError("the steps must use the connection's history URL")
            super().__init__(f"sqlite:///{path}")

    history.HistoryStore = Served  # type: ignore[misc, assignment]

    def restore() -> None:
        history.HistoryStore = real  # type: ignore[misc]

    return restore


def _job(steps: int) -> dict[str, Any]:
    return {
        "name": "campaign-e2e",
        "key": "campaign-e2e",
        "total_steps": steps,
        "deadline": "PT10M",
        "resources": {"unit": "cpu", "min": 1, "max": 1, "per_node": 2, "memory_per_unit": "256Mi"},
        "checkpoint_every_steps": 25,
        "margin_seconds": 5,
        "dwell_seconds": 10,
        "step_seconds_estimate": 0.02,
        "command": ["python", "-m", "qosflow_trainer", *SMALL_TRAINER],
    }


def _context(ti: RecordingTI, run_id: str) -> dict[str, Any]:
    run = SimpleNamespace(run_id=run_id, dag_id=ti.dag_id, queued_at=datetime.now(UTC))
    return {"ti": ti, "dag": SimpleNamespace(dag_id=ti.dag_id), "run_id": run_id, "dag_run": run}


def _replans(
    c: Campaign, local: Any, steps: int, kwargs_seen: list[Any]
) -> tuple[RecordingTI, dict[str, Any], int]:
    """Plan + submit of one DAG run, re-run; (ti, context, workflows beyond one per segment)."""
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator

    ti = RecordingTI("campaign")
    ctx = _context(ti, "manual__campaign-1")
    job_ids, deadlines = set(), set()
    replans = 2 if c.quick else 3
    for attempt in range(replans):
        plan = drive(
            PlanTrainingOperator(task_id="plan", job=_job(steps), deadline_anchor="plan"),
            ctx,
            kwargs_seen,
        )
        drive(SubmitTrainingOperator(task_id="submit", plan_task_id="plan"), ctx, kwargs_seen)
        job_ids.add(plan["job_id"])
        deadlines.add(plan["job"]["deadline"])
        c.log(
            f"airflow: plan + submit #{attempt + 1}: job {plan['job_id']}, deadline {plan['job']['deadline']}"
        )
        if attempt < replans - 1:
            time.sleep(1.1)  # the next re-run resolves PT10M from a later plan time
    items = Api(local.argo_url, local.token)("GET", WORKFLOWS).json()["items"] or []
    _, extra = count_duplicates(items)
    c.add(replans=replans, replan_job_ids=len(job_ids), replan_deadlines=len(deadlines))
    return ti, ctx, extra + (len(job_ids) - 1)


def _promises(path: Path, job: str) -> int:
    """Rows of the job on the board (and in the older promise ledger) of the served database."""
    import sqlite3

    rows = 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        for table in ("qosflow_board", "qosflow_promises") if tables else ():
            if table in tables:
                query = f"SELECT COUNT(*) FROM {table} WHERE job_id LIKE ?"
                rows += int(db.execute(query, (f"{job}-%",)).fetchone()[0])
    return rows


def _watch_and_finish(
    c: Campaign, local: Any, ti: RecordingTI, ctx: dict[str, Any], kwargs_seen: list[Any]
) -> dict[str, Any]:
    from qosflow_airflow.operators.finish import FinishTrainingOperator
    from qosflow_airflow.sensors.progress import DeadlineProgressSensor

    watch = DeadlineProgressSensor(
        task_id="watch", state_task_ids=["submit"], poll_interval=0.5, hold_seconds=1e9
    )
    event = drive(watch, ctx, kwargs_seen)
    finish = FinishTrainingOperator(
        task_id="finish",
        plan_task_id="plan",
        watch_task_ids=["watch"],
        state_task_ids=["submit"],
        report_dir=str(c.folder("airflow-reports")),
        poll_interval=0.5,
    )
    report: dict[str, Any] = drive(finish, ctx, kwargs_seen)
    c.log(f"airflow: watch ended {event.get('status')}; finish: {report.get('verdict')}")
    return report


def _write_outputs(
    c: Campaign, folder: Path, ti: RecordingTI, kwargs_seen: list[Any], reprs: list[str]
) -> None:
    """Everything Airflow would store or show, as files for the scan."""
    (folder / "xcom.json").write_text(
        json.dumps([[list(k), v] for k, v in ti.xcoms.items()], default=str)
    )
    (folder / "trigger-kwargs.json").write_text(json.dumps(kwargs_seen, default=str))
    (folder / "reprs.txt").write_text("\n".join(reprs))


@contextlib.contextmanager
def debug_log_to(path: Path) -> Iterator[None]:
    """Every log record of this process, at DEBUG level, also into ``path`` (for the scan)."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


def _flow(c: Campaign, local: Any, folder: Path, kwargs_seen: list[Any]) -> dict[str, Any]:
    """Re-planned plan + submit, watch and finish of one DAG run on ``local``."""
    from qosflow_argo import ArgoCluster

    ArgoCluster.from_local(local).ensure_installed(checkpoint_claim=CLAIM)
    c.log("airflow: local cluster up, template installed")
    os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = c.connection(
        local.argo_url, local.kube_url, {"checkpoint_claim": CLAIM, "image": IMAGE}
    )
    restore = _serve_history_by_sqlite(c, folder / "history.db")
    try:
        with sampling_pod_envs(c, local.state_dir, "airflow flow"):
            ti, ctx, extra = _replans(c, local, 300 if c.quick else 600, kwargs_seen)
            promises = _promises(folder / "history.db", "campaign-e2e")
            report = _watch_and_finish(c, local, ti, ctx, kwargs_seen)
    finally:
        restore()
    _write_outputs(c, folder, ti, kwargs_seen, _reprs(local))
    return {
        "e2e_deadline_met": "deadline met" in str(report.get("verdict")),
        "replan_promises": promises,
        "duplicates": extra + max(0, promises - 1),
    }


def scenario_airflow(c: Campaign) -> None:
    import qosflow_airflow.operators.finish
    import qosflow_airflow.operators.plan
    import qosflow_airflow.sensors.progress  # noqa: F401 - imported before the clock matters
    from qosflow.local import LocalCluster

    c.log("airflow: provider imported")
    folder = c.folder("airflow-flow")
    kwargs_seen: list[Any] = []
    with (
        debug_log_to(folder / "task-logs.txt"),
        captured_output(folder),
        LocalCluster(
            cpus=2, state_dir=folder / "local", token=c.token, progress_tick_s=0.2
        ) as local,
    ):
        figures = _flow(c, local, folder, kwargs_seen)
    c.add(**figures)


def _reprs(local: Any) -> list[str]:
    from qosflow_airflow.hooks.argo import QosflowArgoHook
    from qosflow_argo import ArgoCluster

    hook = QosflowArgoHook()
    cluster = ArgoCluster.from_local(local)
    out = [
        repr(hook.config),
        repr(hook),
        repr(cluster),
        repr(local),
        repr(cluster.argo),
        str(hook.config),
    ]
    cluster.close()
    return out


@contextlib.contextmanager
def captured_output(folder: Path) -> Iterator[None]:
    """Send this process's stdout and stderr to files under ``folder`` for the scan.

    File descriptors 1 and 2 are redirected, so Airflow's own log output is caught too; what went
    to stderr is replayed there afterwards.
    """
    out_path, err_path = folder / "task-stdout.txt", folder / "task-stderr.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sys.stderr.write(err_path.read_text(encoding="utf-8", errors="replace"))
        sys.stderr.flush()


# ============================================================================ the scan


def _secret_home(path: Path) -> bool:
    """The token's own files: ``token`` and ``cluster.json`` of a state folder, mode 0600."""
    return path.name in ("token", "cluster.json") and path.stat().st_mode & 0o077 == 0


def scan_files(c: Campaign) -> None:
    """Check every file under the campaign folder (the token's own files excepted)."""
    scanned = 0
    for path in sorted(c.root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        scanned += 1
        if _secret_home(path):
            continue
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            for secret in c.secrets:
                if secret.encode() in data:
                    kind = "token" if secret == c.token else "password"
                    c.leaks.append(f"{path.relative_to(c.root)}: {kind}")
    c.add(scanned_files=scanned)


def scan_with_canaries(c: Campaign) -> None:
    """The file scan, with a planted file and a process environment holding the secrets.

    Both must be found (else the scan could not find a leak: ``token_leaks`` is an error), and
    are then not counted as leaks.
    """
    canary = c.folder("canary") / "planted.txt"
    canary.write_text(f"token {c.token} password {c.password}\n")
    env = dict(os.environ, CAMPAIGN_CANARY=c.token)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        env_found = c.token in (environ_of(child.pid, wait_s=10) or "")
    finally:
        child.kill()
        child.wait()
    scan_files(c)
    planted = [leak for leak in c.leaks if leak.startswith("canary/")]
    c.leaks = [leak for leak in c.leaks if not leak.startswith("canary/")]
    found = len(planted) + env_found
    c.add(leak_scan_canaries_found=f"{found}/3", scanned_files=-1)
    if found != 3:
        c.failed["scan"] = f"the scan found {found} of 3 planted secrets"


# ============================================================================ main


SCENARIOS: dict[str, Callable[[Campaign], None]] = {
    "retry": scenario_retry,
    "storm": scenario_storm,
    "http": scenario_http,
    "cli": scenario_cli,
    "trainer": scenario_trainer,
    "restart": scenario_restart,
    "poison": scenario_poison,
    "airflow": scenario_airflow,
}
NEEDS: dict[str, tuple[str, ...]] = {
    "duplicates": ("storm", "airflow"),
    "steps_lost_beyond_checkpoint": ("trainer", "restart"),
    "poisoned_controller": ("poison", "http"),
    "token_leaks": ("airflow", "restart", "cli", "scan"),
    "tracebacks": ("cli", "http", "poison"),
    "retry_covers_long_segments": ("retry",),
}


def _prepare_environment(c: Campaign) -> None:
    """Airflow in a private home, and both secrets in the environment every child inherits."""
    home = c.folder("airflow-home")
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(c.folder("airflow-dags"))
    os.environ["QOSFLOW_LOCAL_TOKEN"] = c.token
    os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = c.connection(
        "http://127.0.0.1:9", "http://127.0.0.1:10"
    )


def run(c: Campaign, names: list[str], budget_s: float) -> None:
    for name in names:
        if time.monotonic() - c.started > budget_s:
            c.failed[name] = f"skipped: the campaign ran over its {budget_s:.0f} s budget"
            c.log(f"== {name}: {c.failed[name]}")
            continue
        c.log(f"== {name}")
        began = time.monotonic()
        try:
            SCENARIOS[name](c)
        except Exception as exc:
            c.failed[name] = f"{type(exc).__name__}: {exc}"
            c.log(f"scenario {name} FAILED: {traceback.format_exc()}")
        c.add(**{f"{name}_s": round(time.monotonic() - began, 1)})
    scan_with_canaries(c)
    c.leaks = sorted(set(c.leaks))
    c.metrics["token_leaks"] = len(c.leaks)
    c.metrics["tracebacks"] = len(c.tracebacks)
    c.metrics["pod_envs_scanned"] = len(c.pod_envs)
    for leak in c.leaks:
        c.log(f"LEAK: {leak}")


def report(c: Campaign, names: list[str]) -> bool:
    ok = True
    for key in CAMPAIGN_KEYS:
        failed = [n for n in NEEDS[key] if n in c.failed]
        ran = [n for n in NEEDS[key] if n in names]
        if failed or not ran or key not in c.metrics:
            value: Any = f"error ({'; '.join(c.failed[n] for n in failed) or 'not run'})"
        else:
            value = c.metrics[key]
        ok = ok and value == TARGETS[key]
        print(f"{key}: {str(value).lower() if isinstance(value, bool) else value}")
    for key, value in c.metrics.items():
        if key not in CAMPAIGN_KEYS:
            print(f"{key}: {str(value).lower() if isinstance(value, bool) else value}")
    print(f"campaign_s: {time.monotonic() - c.started:.0f}")
    return ok


def stop_leftovers(root: Path) -> None:
    """Stop any local-cluster daemon this campaign started that is still up (after a failure)."""
    from qosflow.local.cli import read_info

    for info_file in root.rglob("cluster.json"):
        info = read_info(info_file.parent)
        if info is not None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "qosflow.cli",
                    "local",
                    "down",
                    "--state-dir",
                    str(info_file.parent),
                ],
                capture_output=True,
                timeout=120,
                check=False,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer threads, kills and requests")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run these")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--budget", type=float, default=480.0, help="no scenario starts after this many seconds"
    )
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    root = Path(tempfile.mkdtemp(prefix="qosflow-campaign-"))
    c = Campaign(root=root, quick=args.quick)
    _prepare_environment(c)
    try:
        run(c, names, args.budget)
    finally:
        stop_leftovers(root)
        for child in STARTED:  # SIGTERM first: a daemon then stops its pods
            if child.poll() is None:
                child.terminate()
        for child in STARTED:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if args.keep:
            c.log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if report(c, names) else 1


if __name__ == "__main__":
    sys.exit(main())
