"""The nodes of the local cluster: their accounting and their kubelets (one object for all).

* **Scheduling** is :mod:`qosflow.local.scheduler` (which node takes a pending pod, or why none
  can); a bound pod gets a loopback address of its node (:mod:`qosflow.local.addresses`) and its
  container is started (:mod:`qosflow.local.kubelet`), pinned to cores of its node.
* **Kubelets.** Every tick they retry the containers still waiting for a ConfigMap or Secret,
  poll the running ones (exit codes, the progress file, readiness probes:
  :mod:`qosflow.local.readiness`), finish in-place resizes against the pod's node
  (``PodResizePending`` Deferred / Infeasible, ``PodResizeInProgress``), and SIGKILL pods whose
  grace period after SIGTERM is over. When a pod ends, its container layers and own volumes are
  removed (:func:`qosflow.local.sandbox.release`) and its address is free again.
* **Restarts.** A container a previous server started and that still runs is re-adopted; one that
  ended while the server was down gets the exit code its supervisor recorded
  (:mod:`qosflow.local.supervisor`); only a container that left no trace is failed.
* **Isolation.** A pod the nodes cannot read (a quantity that does not parse, say, from an old
  state file) is failed with a message; it never stops the scheduling of the others.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.errors import LocalClusterError
from qosflow.local.kubelet import bind, launch_spec, start_container
from qosflow.local.names import pod_dir
from qosflow.local.pods import (
    allocated_cpu,
    desired,
    desired_cpu,
    desired_memory,
    drop_condition,
    pod_key,
    set_condition,
)
from qosflow.local.readiness import update_readiness
from qosflow.local.resize import kubelet_resize
from qosflow.local.runner import PodProcess, Runner
from qosflow.local.sandbox import progress_file, release
from qosflow.local.scheduler import schedule
from qosflow.local.store import Obj, Store
from qosflow.local.topology import NodeInfo

LIVE = ("Pending", "Running")
LOST_MESSAGE = (
    "The container could not be located when the pod was terminated: the local cluster "
    "restarted while this pod was running (pid {pid}) and found neither its process nor its "
    "exit code"
)
_LOG = logging.getLogger(__name__)


class Nodes:
    """The cluster's nodes over the shared store: accounting and kubelets (callers hold the lock).

    Args:
        store: The object store.
        clock: Time source.
        runner: Starts containers.
        nodes: The nodes (:func:`qosflow.local.topology.make_nodes`).
        host_cpus: Host CPU ids virtual core ``i`` maps to (``i % len``).
        grace_s: Default termination grace period.
        argo_priority: ``pod -> spec.priority`` of its workflow (live, for the queue order).
        wake: Runs a tick soon; called when a process exits.
        preemption: Let pending pods evict lower-priority running pods (off by default).
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        runner: Runner,
        *,
        nodes: tuple[NodeInfo, ...],
        host_cpus: tuple[int, ...],
        grace_s: float,
        argo_priority: Callable[[Obj], int],
        wake: Callable[[], None] | None = None,
        preemption: bool = False,
    ) -> None:
        self.store = store
        self.clock = clock
        self.runner = runner
        self.nodes = nodes
        self.by_name = {node.name: node for node in nodes}
        self.host_cpus = host_cpus
        self.grace_s = grace_s
        self.argo_priority = argo_priority
        self.wake = wake
        self.preemption = preemption
        self.procs: dict[str, PodProcess] = {}

    # -- accounting ----------------------------------------------------------------------------
    def node_of(self, pod: Obj) -> NodeInfo:
        """The node a bound pod is on (the first node for a name no node has, from old state)."""
        return self.by_name.get(str(pod["spec"].get("nodeName") or ""), self.nodes[0])

    def running_pods(self, node: NodeInfo | None = None) -> list[Obj]:
        """Pods whose container runs (on ``node``, when given)."""
        return [
            p
            for p in self.store.items("Pod")
            if p["status"].get("phase") == "Running" and (node is None or self.node_of(p) is node)
        ]

    def bound_pods(self, node: NodeInfo | None = None) -> list[Obj]:
        """Pods bound and not finished (running, or waiting for their container), on ``node``."""
        return [
            p
            for p in self.store.items("Pod")
            if (
                p["status"].get("phase") == "Running"
                or (p["status"].get("phase") == "Pending" and p["spec"].get("nodeName"))
            )
            and (node is None or self.node_of(p) is node)
        ]

    def waiting_pods(self) -> list[Obj]:
        """Bound pods whose container has not started (waiting for a ConfigMap or Secret)."""
        return [
            p
            for p in self.bound_pods()
            if p["status"].get("phase") == "Pending" and pod_key(p) not in self.procs
        ]

    def addresses_in_use(self) -> set[str]:
        """The pod addresses live pods hold."""
        return {
            str(p["status"].get("podIP")) for p in self.bound_pods() if p["status"].get("podIP")
        }

    def used_cpu(self, node: NodeInfo, *, exclude: Obj | None = None, kubelet: bool = False) -> int:
        """Millicores taken on ``node`` by bound pods (scheduler: max of desired and allocated)."""
        total = 0
        for pod in self.bound_pods(node):
            if pod is not exclude:
                alloc = allocated_cpu(pod)
                total += alloc if kubelet else max(alloc, desired_cpu(pod))
        return total

    def free(self, node: NodeInfo) -> dict[str, Decimal]:
        """What ``node`` has free for the scheduler: ``cpu`` in millicores, ``memory``, GPUs..."""
        pods = self.bound_pods(node)
        free = {
            "cpu": Decimal(node.cpus * 1000 - self.used_cpu(node)),
            "memory": Decimal(node.memory) - sum((desired_memory(p) for p in pods), Decimal(0)),
        }
        for name, amount in node.allocatable().items():
            if name not in free:
                free[name] = amount - sum((desired(p, name) for p in pods), Decimal(0))
        return free

    def _cores_in_use(self, node: NodeInfo, exclude: str = "") -> dict[int, int]:
        """Virtual core of ``node`` -> number of running pods pinned to it."""
        counts = dict.fromkeys(node.cores, 0)
        for key, record in self.store.runtime.items():
            if key != exclude and record.get("cores") is not None and key in self.procs:
                for core in record["cores"]:
                    if core in counts:
                        counts[core] += 1
        return counts

    def pick_cores(
        self, node: NodeInfo, milli: int, current: list[int], exclude: str = ""
    ) -> list[int]:
        """Virtual cores of ``node`` for ``milli`` millicores: keep ``current``, add the least shared."""
        want = node.cpus if milli <= 0 else max(1, min(node.cpus, math.ceil(milli / 1000)))
        current = [c for c in current if c in node.cores]
        if len(current) >= want:
            return sorted(current[:want])
        counts = self._cores_in_use(node, exclude)
        spare = sorted((c for c in counts if c not in current), key=lambda c: (counts[c], c))
        return sorted(current + spare[: want - len(current)])

    def host_cores(self, cores: list[int]) -> tuple[int, ...]:
        """Host CPU ids of virtual cores."""
        return tuple(sorted({self.host_cpus[c % len(self.host_cpus)] for c in cores}))

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self, now: float) -> None:
        """Bind and start every queued pod that fits somewhere (:mod:`qosflow.local.scheduler`)."""
        schedule(self, now)

    def start(self, pod: Obj, node: NodeInfo, now: float) -> None:
        """Bind ``pod`` to ``node`` and start its ``main`` container (or let it wait)."""
        bind(self, pod, node, now)
        start_container(self, pod, now)

    # -- kubelet -------------------------------------------------------------------------------
    def progress_of(self, pod: Obj) -> str | None:
        """The last non-empty line of the pod's progress file, when valid ``N/M``.

        The file is the one in the pod's own directory (never a path read from the state file).
        """
        if pod_key(pod) not in self.store.runtime:
            return None
        meta = pod["metadata"]
        try:
            path = progress_file(pod_dir(self.store.state_dir, meta["namespace"], meta["name"]))
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError, LocalClusterError):
            return None
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        parts = last.split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        done, total = int(parts[0]), int(parts[1])
        return f"{done}/{total}" if 0 <= done <= total and total > 0 else None

    def poll(self, now: float) -> None:
        """Waiting containers, exits, grace-period kills and resizes (in the kubelet's order)."""
        self._fail_unreadable(now)
        for pod in self.waiting_pods():
            try:
                start_container(self, pod, now)
            except Exception as exc:  # one pod the kubelet cannot start must not stop the rest
                self.fail_pod(pod, now, exc)
        for pod in self.resize_order():
            try:
                self._poll_one(pod, now)
            except Exception as exc:  # one pod the kubelet cannot handle must not stop the rest
                self.fail_pod(pod, now, exc)

    def _poll_one(self, pod: Obj, now: float) -> None:
        """Kubelet work for one running pod: its exit, its grace-period kill, its resize."""
        key = pod_key(pod)
        process = self.procs.get(key)
        if process is None:
            return
        record = self.store.runtime[key]
        term_at = record.get("term_at")
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", self.grace_s))
        if term_at is not None and now >= term_at + grace:
            process.kill()
        code = process.poll(now)
        if code is not None:
            self.finish(pod, now, code, "")
            return
        kubelet_resize(self, pod, now)
        update_readiness(self, pod, process, now)

    def _fail_unreadable(self, now: float) -> None:
        """Fail live pods whose resources or priority do not parse (the accounting reads them)."""
        for pod in list(self.store.items("Pod")):
            try:
                if pod["status"].get("phase") not in LIVE:
                    continue
                desired_cpu(pod), desired_memory(pod), allocated_cpu(pod)
                int(pod["spec"].get("priority", 0)), self.argo_priority(pod)
            except Exception as exc:
                self.fail_pod(pod, now, exc)

    def fail_pod(self, pod: Obj, now: float, exc: Exception) -> None:
        """Fail a pod the node cannot handle, with a message; its container is killed."""
        meta = pod.get("metadata") or {}
        _LOG.error("pod %s/%s failed on the node: %r", meta.get("namespace"), meta.get("name"), exc)
        message = f"the local cluster cannot run this pod: {exc}"
        try:
            process = self.procs.pop(pod_key(pod), None)
            if process is not None:
                process.kill()
            if not isinstance(pod.get("status"), dict):
                pod["status"] = {}
            self.finish(pod, now, 128, message)
        except Exception:  # pragma: no cover - a pod too broken even to be failed
            _LOG.exception("could not fail pod %s", meta.get("name"))
            pod["status"] = {"phase": "Failed", "message": message}
            self.store.touch(pod)

    def terminate(self, pod: Obj, now: float) -> None:
        """SIGTERM a running pod once (SIGKILL follows after its grace period)."""
        key = pod_key(pod)
        record = self.store.runtime.get(key)
        process = self.procs.get(key)
        if record is None or process is None or record.get("term_at") is not None:
            return
        record["term_at"] = now
        self.store.mark_dirty()
        process.terminate()
        if float(pod["spec"].get("terminationGracePeriodSeconds", self.grace_s)) <= 0:
            process.kill()

    def finish(self, pod: Obj, now: float, code: int, message: str, reason: str = "") -> None:
        """Record a container exit on the pod; its container layers and own volumes go."""
        key = pod_key(pod)
        self.procs.pop(key, None)
        stamp = rfc3339(now)
        status = pod["status"]
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        reason = reason or ("Completed" if code == 0 else "Error")
        if message and not status.get("containerStatuses"):
            status["message"] = message
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": status.get("startTime"),
            "finishedAt": stamp,
        }
        if message:
            terminated["message"] = message
        for cstatus in status.get("containerStatuses") or []:
            cstatus.update({"ready": False, "started": False, "state": {"terminated": terminated}})
        for ctype in ("ContainersReady", "Ready"):
            set_condition(pod, ctype, "False", stamp or "", reason="PodCompleted")
        drop_condition(pod, "PodResizePending")
        drop_condition(pod, "PodResizeInProgress")
        record = self.store.runtime.get(key)
        if record is not None:
            record["exit_code"] = code
        self.release(pod)
        self.store.touch(pod)

    def release(self, pod: Obj) -> None:
        """Remove what ends with a pod: its container layers and its own volumes."""
        meta = pod.get("metadata") or {}
        try:
            release(pod_dir(self.store.state_dir, meta.get("namespace", ""), meta.get("name", "")))
        except (OSError, LocalClusterError) as exc:  # a leftover folder must not stop the node
            _LOG.warning("pod %s: could not remove its files: %r", meta.get("name"), exc)

    def fail_unstarted(self, pod: Obj, now: float, message: str) -> None:
        """Fail a pod that never started (shutdown of a queued pod, or a restart)."""
        pod["status"]["phase"] = "Failed"
        pod["status"]["message"] = message
        self.release(pod)
        self.store.touch(pod)

    def delete(self, pod: Obj) -> None:
        """Kill a pod's container at once (the pod object is removed by the caller)."""
        process = self.procs.pop(pod_key(pod), None)
        if process is not None:
            process.kill()
            process.poll(self.clock.now())
        self.store.runtime.pop(pod_key(pod), None)
        self.release(pod)

    def recover(self, now: float) -> None:
        """After a restart: re-adopt the containers that still run, collect the exits of the rest.

        A container that ended while the server was down ends Succeeded or Failed by the exit
        code its supervisor recorded (at the first poll); one that left no trace is failed with
        the kubelet's ``ContainerStatusUnknown``.
        """
        for pod in self.running_pods():
            key = pod_key(pod)
            record = self.store.runtime.get(key)
            process = None
            try:
                if isinstance(record, dict):
                    cpu = allocated_cpu(pod)
                    spec = launch_spec(self, pod, list(record.get("cores") or []), cpu)
                    process = self.runner.adopt(spec, record, now)
            except Exception as exc:  # an unreadable record: the container cannot be found
                _LOG.error("pod %s: cannot re-adopt its container: %r", key, exc)
            if process is None:
                pid = (record or {}).get("pid") if isinstance(record, dict) else None
                message = LOST_MESSAGE.format(pid=pid)
                self.finish(pod, now, 137, message, reason="ContainerStatusUnknown")
                continue
            self.procs[key] = process
            _LOG.info("pod %s: re-adopted its container (pid %s)", key, process.pid)

    def shutdown(self, now: float, wait_s: float = 10.0) -> None:
        """Stop every container when the server shuts down; the pods are failed with a message.

        Processes get SIGTERM and up to ``wait_s`` real seconds to checkpoint and exit, then SIGKILL.
        """
        pods = self.running_pods()
        for pod in pods:
            process = self.procs.get(pod_key(pod))
            if process is not None and process.pid is not None:
                process.terminate()
        deadline = time.monotonic() + wait_s
        for pod in pods:
            process = self.procs.get(pod_key(pod))
            while process is not None and process.pid is not None and time.monotonic() < deadline:
                if process.poll(now) is not None:
                    break
                time.sleep(0.05)
            if process is not None:
                process.kill()
            self.finish(pod, now, 137, "the local cluster was shut down while this pod was running")

    def resize_order(self) -> list[Obj]:
        """Running pods with a resize to try, in the kubelet's retry order (priority, then age)."""
        return sorted(
            self.running_pods(),
            key=lambda p: (-int(p["spec"].get("priority", 0)), self.store.creation_seq(p)),
        )
