"""``LocalCluster``: the embedded Argo Server + Kubernetes API on loopback, in-process.

Usage (tests, other helpers, the daemon behind ``qosflow local up``)::

    with LocalCluster(cpus=2, state_dir=tmp_path) as cluster:
        requests.get(cluster.argo_url + "/api/v1/version",
                     headers={"Authorization": f"Bearer {cluster.token}"})

With the default wall clock a background thread ticks the controller every ``progress_tick_s``
seconds (and at once after every write). With a :class:`~qosflow.local.clock.VirtualClock`, no
thread runs: every ``clock.advance(s)`` runs exactly one tick, for deterministic tests.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from qosflow.local.access import Access
from qosflow.local.admission import stored_problem
from qosflow.local.argo_api import ArgoApi
from qosflow.local.body import MAX_BODY_BYTES, READ_TIMEOUT_S
from qosflow.local.cgroups import CpuWeights
from qosflow.local.clock import Clock, VirtualClock, WallClock
from qosflow.local.controller import Controller
from qosflow.local.errors import LocalClusterError
from qosflow.local.faults import FaultPlan
from qosflow.local.kube_api import KubeApi
from qosflow.local.kube_version import DEFAULT_KUBERNETES_VERSION, kubernetes_minor
from qosflow.local.node import Nodes
from qosflow.local.objects import stored_problem as object_problem
from qosflow.local.runner import ProcessRunner, Runner
from qosflow.local.sandbox import AUTO, SHARED, choose
from qosflow.local.server import Listener
from qosflow.local.store import Obj, Store, snapshot
from qosflow.local.topology import GPU_RESOURCE, make_nodes
from qosflow.local.watch import WatchHub

_LOG = logging.getLogger(__name__)


def _total_memory() -> int:
    """Physical memory of this machine in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class LocalCluster:
    """An emulated Argo Server + Kubernetes API running pods as local processes.

    Args:
        cpus: Allocatable CPUs of each node (their sum may exceed the host's CPUs; host cores
            are then shared, see :mod:`qosflow.local.topology`).
        state_dir: Where state, pod directories and logs live (a temporary directory when None).
        token: The admin bearer token both APIs accept (``system:masters``: allowed everything).
            ServiceAccount tokens (:meth:`token_for`, the TokenRequest API) are accepted too,
            and may do what the stored RBAC grants them.
        port: Argo Server port (Kubernetes API on ``port + 1``); 0 picks free ports.
        clock: Time source; a ``VirtualClock`` makes ticks explicit.
        runner: How containers run (real processes by default; ``ScriptedRunner`` in tests).
        progress_tick_s: Controller period with the wall clock.
        faults: Fault-injection plan for both listeners.
        grace_s: Default ``terminationGracePeriodSeconds`` of pods.
        memory: Allocatable memory of each node in bytes (by default this machine's, shared
            evenly by the nodes).
        namespace: The namespace qosflow uses.
        watch_keepalive_s: Interval of the ``:`` keep-alive lines of SSE watch streams.
        preemption: Let pending pods evict lower-priority running pods, as the Kubernetes
            scheduler does (off by default: a pending pod waits).
        cpu_weights: Weight pods' cgroups by their CPU requests where the host allows it, so they
            get their CPUs ahead of the host's other processes (:mod:`qosflow.local.cgroups`);
            only with the default process runner. :attr:`weighted` tells whether it is on.
        read_timeout_s: Time a request body may take to arrive (408 after it).
        max_body_bytes: Largest request body the listeners accept (413 above it).
        isolation: Pod file systems of the process runner: ``auto`` (private where this host
            allows mount namespaces, else ``shared``, with a warning), ``private`` (an error
            when the host cannot) or ``shared`` (pods share the host's file system, volume
            paths rewritten; see :mod:`qosflow.local.sandbox`). :attr:`isolation` tells which.
        kubernetes_version: The Kubernetes version the API emulates (``/version``); before
            ``1.33`` there is no ``pods/{name}/resize`` (404), so clients rescale by restarting.
        nodes: Number of nodes (``qosflow-local`` when 1, else ``qosflow-local-0`` ...).
        gpus: GPUs of each node, advertised as ``gpu_resource`` (a number the scheduler counts:
            no device reaches the pods).
        gpu_resource: The extended resource name of the GPUs.
    """

    def __init__(
        self,
        cpus: int = 2,
        state_dir: Path | str | None = None,
        token: str = "local-token",
        port: int = 0,
        clock: Clock | None = None,
        runner: Runner | None = None,
        progress_tick_s: float = 1.0,
        faults: FaultPlan | None = None,
        *,
        grace_s: float = 30.0,
        memory: int | None = None,
        namespace: str = "qosflow",
        watch_keepalive_s: float = 15.0,
        preemption: bool = False,
        cpu_weights: bool = True,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_body_bytes: int = MAX_BODY_BYTES,
        isolation: str = AUTO,
        kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
        nodes: int = 1,
        gpus: int = 0,
        gpu_resource: str = GPU_RESOURCE,
    ) -> None:
        self.state_dir = (
            Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="qosflow-local-"))
        )
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()
        share = _total_memory() // max(nodes, 1)
        network = 1 + int(digest, 16) % 254  # this cluster's pod networks: 127.<network + i>/16
        topology = make_nodes(nodes, cpus, memory or share, gpus, gpu_resource, network)
        self.cpus = cpus
        self.gpus = gpus
        self.gpu_resource = gpu_resource
        self.token = token
        self.port = port
        self.clock: Clock = clock or WallClock()
        self.weights: CpuWeights | None = None
        if runner is None and cpu_weights:
            self.weights = CpuWeights.detect(digest[:12], cpus * nodes)
        self.isolation = SHARED  # what a scripted or custom runner gets: nothing is isolated
        if runner is None:
            self.isolation = choose(isolation, self.state_dir)
            hide = (self.state_dir.resolve(),)
            runner = ProcessRunner(self.weights, isolation=self.isolation, hide=hide)
        self.runner: Runner = runner
        self.progress_tick_s = progress_tick_s
        self.faults = faults or FaultPlan()
        self.namespace = namespace
        self.http_limits = {"read_timeout_s": read_timeout_s, "max_body_bytes": max_body_bytes}
        kubernetes_minor(kubernetes_version)  # a bad version fails here, not at start
        self.kubernetes_version = kubernetes_version
        self.preemption = preemption
        self.store = Store(self.state_dir, validate=lambda o: object_problem(o, stored_problem))
        self.access = Access(self.store, self.clock, token)
        host = tuple(sorted(os.sched_getaffinity(0)))
        self._wake = threading.Event()
        self.nodes = Nodes(
            self.store,
            self.clock,
            self.runner,
            nodes=topology,
            host_cpus=host,
            grace_s=grace_s,
            argo_priority=self._argo_priority,
            wake=self.wake,
            preemption=preemption,
        )
        self.controller = Controller(self.store, self.clock, self.nodes)
        self._argo: Listener | None = None
        self._kube: Listener | None = None
        self.watches = WatchHub(self.store, keepalive_s=watch_keepalive_s)
        self._stopping = threading.Event()
        self._loop: threading.Thread | None = None

    def __repr__(self) -> str:
        argo, kube = getattr(self, "_argo", None), getattr(self, "_kube", None)
        urls = f"{argo.url}, {kube.url}" if argo and kube else "not serving"
        nodes = getattr(self, "nodes", None)
        count = len(nodes.nodes) if nodes is not None else 0
        return (
            f"LocalCluster(cpus={self.cpus}, nodes={count}, gpus={self.gpus}, "
            f"state_dir={str(self.state_dir)!r}, {urls})"
        )

    def _argo_priority(self, pod: Obj) -> int:
        """Argo ``spec.priority`` of a pod's workflow, read live (patches re-order the queue)."""
        name = pod["metadata"]["labels"].get("workflows.argoproj.io/workflow", "")
        wf = self.store.get("Workflow", pod["metadata"]["namespace"], name)
        return int((wf or {}).get("spec", {}).get("priority") or 0)

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Recover the stored state, open both listeners, start ticking.

        Containers still running from a previous server are re-adopted; objects of the state
        file that cannot be served were quarantined by the store (see ``quarantine.json``).
        """
        with self.store.lock:
            self.nodes.recover(self.clock.now())
            kube = KubeApi(
                self.store,
                self.clock,
                self.nodes,
                self.wake,
                self.namespace,
                access=self.access,
                kubernetes_version=self.kubernetes_version,
            )
            argo = ArgoApi(self.store, self.clock, self.controller, self.wake, self.watches)
            try:
                self.controller.tick(self.clock.now())
            except Exception:  # serve anyway: the next ticks retry, the log says what failed
                _LOG.exception("the first tick after start failed")
        self.store.save(force=True)
        self._argo = Listener(
            "argo",
            argo.routes(),
            self.store,
            self.token,
            self.faults,
            self.port,
            gate=self.access.gate("argo"),
            **self.limits(),
        )
        self._kube = Listener(
            "kube",
            kube.routes(),
            self.store,
            self.token,
            self.faults,
            self.port + 1 if self.port else 0,
            gate=self.access.gate("kube"),
            **self.limits(),
        )
        self._argo.start()
        self._kube.start()
        if isinstance(self.clock, VirtualClock):
            self.clock.subscribe(self._on_advance)
        else:
            self._loop = threading.Thread(
                target=self._run, name="qosflow-local-controller", daemon=True
            )
            self._loop.start()
        return self

    def limits(self) -> dict[str, Any]:
        """The listeners' read timeout and body size limit (keyword arguments of ``Listener``)."""
        return dict(self.http_limits)

    def stop(self) -> None:
        """Close the listeners, stop every container, save the state (each step even if one fails)."""
        self._stop_serving()
        steps: list[Callable[[], None]] = [
            lambda: self.nodes.shutdown(self.clock.now()),
            lambda: self.controller.settle(self.clock.now()),
        ]
        with self.store.lock:
            for step in steps:
                try:
                    step()
                except Exception:
                    _LOG.exception("local cluster shutdown step failed")
        self.store.save(force=True)
        if self.weights is not None:
            self.weights.close()

    def crash(self) -> None:
        """Stop serving as a killed server would: no shutdown of the containers (test hook).

        The listeners close and ticks stop; containers keep running and the state stays as last
        saved, so a new ``LocalCluster`` on the same state directory re-adopts them.
        """
        self._stop_serving()

    def _stop_serving(self) -> None:
        """Stop ticking and close the watches and both listeners."""
        self._stopping.set()
        self._wake.set()
        if self._loop is not None:
            self._loop.join(timeout=10)
        if isinstance(self.clock, VirtualClock):
            self.clock.unsubscribe(self._on_advance)
        self.watches.close()
        for listener in (self._argo, self._kube):
            if listener is not None:
                listener.stop()

    @property
    def weighted(self) -> bool:
        """True when pods' cgroups are weighted by their CPU requests (see ``cpu_weights``)."""
        return self.weights is not None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _on_advance(self, now: float) -> None:
        self.tick()

    def _run(self) -> None:
        """The controller loop of the wall-clock mode."""
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # keep serving; the traceback goes to the daemon's log
                _LOG.exception("local cluster tick failed")
            self._wake.wait(self.progress_tick_s)
            self._wake.clear()

    # -- control API (in-process, never over HTTP) ---------------------------------------------
    @property
    def argo_url(self) -> str:
        """Base URL of the emulated Argo Server."""
        if self._argo is None:
            raise LocalClusterError("the local cluster is not started")
        return self._argo.url

    @property
    def kube_url(self) -> str:
        """Base URL of the emulated Kubernetes API."""
        if self._kube is None:
            raise LocalClusterError("the local cluster is not started")
        return self._kube.url

    def token_for(
        self, namespace: str, service_account: str, expiration_s: int | None = None
    ) -> str:
        """A bearer token of the ServiceAccount ``namespace/service_account`` (test hook).

        What ``kubectl create token`` gives, without the TokenRequest round trip: both listeners
        accept it, and RBAC decides what it may do. It never expires unless ``expiration_s`` is
        given; it stops working when the ServiceAccount is deleted. Kept (as a hash) across
        restarts of the same state directory.

        Raises:
            LocalClusterError: When the ServiceAccount does not exist.
        """
        with self.store.lock:
            account = self.store.get("ServiceAccount", namespace, service_account)
            if account is None:
                raise LocalClusterError(
                    f'serviceaccounts "{service_account}" not found in namespace {namespace}'
                )
            token, _ = self.access.tokens.issue(namespace, account, expiration_s)
        self.store.save()
        return token

    def wake(self) -> None:
        """Run a tick soon (wall-clock mode); a no-op with a virtual clock."""
        self._wake.set()

    def break_watches(self) -> None:
        """End every open watch stream with Argo's in-band ``EOF`` error (clients must reconnect)."""
        self.watches.break_all()

    def tick(self) -> None:
        """Run one controller tick now and save the state."""
        with self.store.lock:
            self.controller.tick(self.clock.now())
        self.store.save()

    def workflow(self, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of a stored workflow, or ``None``."""
        with self.store.lock:
            wf = self.store.get("Workflow", namespace or self.namespace, name)
            return snapshot(wf) if wf is not None else None

    def pods(self, workflow: str | None = None) -> list[Obj]:
        """Copies of the pods (of one workflow, when given)."""
        with self.store.lock:
            return [
                snapshot(p)
                for p in self.store.items("Pod")
                if workflow is None
                or p["metadata"]["labels"].get("workflows.argoproj.io/workflow") == workflow
            ]

    def wait_until(
        self, predicate: Callable[[], Any], timeout_s: float = 30.0, poll_s: float = 0.05
    ) -> Any:
        """Wall-clock wait for a truthy ``predicate()`` (for real-process tests); raises on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise LocalClusterError(f"condition not met within {timeout_s} s")
            time.sleep(poll_s)
