"""The one node of the local cluster: scheduler and kubelet in one.

* **Scheduling.** Pending pods are considered in priority order (pod priority from its
  PriorityClass, then the workflow's Argo ``spec.priority``, then creation order). A pod whose
  PersistentVolumeClaim is missing, or whose ``nodeSelector`` / required node affinity does not
  match the node's labels (:data:`NODE_LABELS`), stays Pending with an ``Unschedulable``
  condition and the scheduler's message; so does one that does not fit the free CPU and memory.
  Each one that fits is bound and its container started (:mod:`qosflow.local.kubelet`).
* **Kubelet.** Every tick it retries the containers still waiting for a ConfigMap or Secret,
  polls the running ones (exit codes, the progress file), finishes in-place resizes
  (``PodResizePending`` Deferred / Infeasible, ``PodResizeInProgress``), and SIGKILLs pods whose
  grace period after SIGTERM is over. When a pod ends, its container layers and own volumes are
  removed (:func:`qosflow.local.sandbox.release`).
* **Restarts.** A container a previous server started and that still runs is re-adopted; one that
  ended while the server was down gets the exit code its supervisor recorded
  (:mod:`qosflow.local.supervisor`); only a container that left no trace is failed.
* **Isolation.** A pod the node cannot read (a quantity that does not parse, say, from an old
  state file) is failed with a message; it never stops the scheduling of the others.
"""

from __future__ import annotations

import logging
import math
import platform
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.errors import LocalClusterError
from qosflow.local.kubelet import bind, launch_spec, start_container
from qosflow.local.names import pod_dir
from qosflow.local.pod_volumes import claim_problem
from qosflow.local.pods import (
    allocated_cpu,
    condition,
    desired_cpu,
    desired_memory,
    drop_condition,
    pod_key,
    set_condition,
)
from qosflow.local.preemption import choose_victims
from qosflow.local.resize import kubelet_resize
from qosflow.local.runner import PodProcess, Runner
from qosflow.local.sandbox import progress_file, release
from qosflow.local.scheduling import AFFINITY_MESSAGE, fits_node
from qosflow.local.store import Obj, Store

NODE_NAME = "qosflow-local"
NODE_LABELS = {
    "kubernetes.io/hostname": NODE_NAME,
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64",
}
"""The one node's labels (nodeSelector and node affinity are matched against them)."""
LIVE = ("Pending", "Running")
LOST_MESSAGE = (
    "The container could not be located when the pod was terminated: the local cluster "
    "restarted while this pod was running (pid {pid}) and found neither its process nor its "
    "exit code"
)
_LOG = logging.getLogger(__name__)


class Node:
    """Scheduler + kubelet over the shared store (callers hold ``store.lock``).

    Args:
        store: The object store.
        clock: Time source.
        runner: Starts containers.
        cpus: Allocatable CPUs of the node.
        memory: Allocatable memory in bytes.
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
        cpus: int,
        memory: int,
        host_cpus: tuple[int, ...],
        grace_s: float,
        argo_priority: Callable[[Obj], int],
        wake: Callable[[], None] | None = None,
        preemption: bool = False,
    ) -> None:
        self.store = store
        self.clock = clock
        self.runner = runner
        self.cpus = cpus
        self.memory = memory
        self.host_cpus = host_cpus
        self.grace_s = grace_s
        self.argo_priority = argo_priority
        self.wake = wake
        self.preemption = preemption
        self.procs: dict[str, PodProcess] = {}

    # -- accounting ----------------------------------------------------------------------------
    def running_pods(self) -> list[Obj]:
        """Pods whose container runs."""
        return [p for p in self.store.items("Pod") if p["status"].get("phase") == "Running"]

    def bound_pods(self) -> list[Obj]:
        """Pods bound to the node and not finished (running, or waiting for their container)."""
        return [
            p
            for p in self.store.items("Pod")
            if p["status"].get("phase") == "Running"
            or (p["status"].get("phase") == "Pending" and p["spec"].get("nodeName"))
        ]

    def waiting_pods(self) -> list[Obj]:
        """Bound pods whose container has not started (waiting for a ConfigMap or Secret)."""
        return [
            p
            for p in self.bound_pods()
            if p["status"].get("phase") == "Pending" and pod_key(p) not in self.procs
        ]

    def used_cpu(self, *, exclude: Obj | None = None, kubelet: bool = False) -> int:
        """Millicores taken by bound pods (scheduler: max of desired and allocated)."""
        total = 0
        for pod in self.bound_pods():
            if pod is not exclude:
                alloc = allocated_cpu(pod)
                total += alloc if kubelet else max(alloc, desired_cpu(pod))
        return total

    def used_memory(self) -> Decimal:
        """Bytes requested by bound pods."""
        return sum((desired_memory(p) for p in self.bound_pods()), Decimal(0))

    def _cores_in_use(self, exclude: str = "") -> dict[int, int]:
        """Virtual core -> number of running pods pinned to it."""
        counts = dict.fromkeys(range(self.cpus), 0)
        for key, record in self.store.runtime.items():
            if key != exclude and record.get("cores") is not None and key in self.procs:
                for core in record["cores"]:
                    counts[core] = counts.get(core, 0) + 1
        return counts

    def pick_cores(self, milli: int, current: list[int], exclude: str = "") -> list[int]:
        """Virtual cores for ``milli`` millicores: keep ``current`` ones, add the least shared."""
        want = self.cpus if milli <= 0 else max(1, min(self.cpus, math.ceil(milli / 1000)))
        if len(current) >= want:
            return sorted(current[:want])
        counts = self._cores_in_use(exclude)
        spare = sorted((c for c in counts if c not in current), key=lambda c: (counts[c], c))
        return sorted(current + spare[: want - len(current)])

    def host_cores(self, cores: list[int]) -> tuple[int, ...]:
        """Host CPU ids of virtual cores."""
        return tuple(sorted({self.host_cpus[c % len(self.host_cpus)] for c in cores}))

    # -- scheduling ----------------------------------------------------------------------------
    def queue(self) -> list[Obj]:
        """Pending, unbound pods in admission order."""
        pending = [
            p
            for p in self.store.items("Pod")
            if p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")
        ]
        return sorted(
            pending,
            key=lambda p: (
                -int(p["spec"].get("priority", 0)),
                -self.argo_priority(p),
                self.store.creation_seq(p),
            ),
        )

    def schedule(self, now: float) -> None:
        """Bind and start every queued pod that fits, in priority order."""
        for pod in self.queue():
            try:
                self._schedule_one(pod, now)
            except Exception as exc:  # one pod that cannot start must not stop the queue
                self.fail_pod(pod, now, exc)

    def unschedulable(self, pod: Obj) -> str | None:
        """The scheduler's message when the node can never take ``pod`` as it is, else ``None``."""
        problem = claim_problem(self.store, pod)
        if problem is not None:
            return problem
        if not fits_node(pod["spec"], NODE_LABELS, NODE_NAME):
            return AFFINITY_MESSAGE
        return None

    def _mark_unschedulable(self, pod: Obj, message: str, now: float) -> None:
        """``PodScheduled=False / Unschedulable`` with ``message`` (touched only on a change)."""
        current = condition(pod, "PodScheduled")
        if current is not None and current.get("message") == message:
            return
        stamp = rfc3339(now) or ""
        set_condition(pod, "PodScheduled", "False", stamp, reason="Unschedulable", message=message)
        self.store.touch(pod)

    def _schedule_one(self, pod: Obj, now: float) -> None:
        """Start one queued pod, or mark it Unschedulable (preempting for it when allowed)."""
        blocked = self.unschedulable(pod)
        if blocked is not None:
            self._mark_unschedulable(pod, blocked, now)
            return
        cpu, memory = desired_cpu(pod), desired_memory(pod)
        free_cpu = self.cpus * 1000 - self.used_cpu()
        free_memory = self.memory - self.used_memory()
        short = [
            n for n, ok in (("cpu", cpu <= free_cpu), ("memory", memory <= free_memory)) if not ok
        ]
        if short == ["cpu"] and self.preemption and self._preempt(pod, cpu, free_cpu, now):
            return
        if short:
            reasons = ", ".join(f"1 Insufficient {n}" for n in short)
            message = (
                f"0/1 nodes are available: {reasons}. preemption: 0/1 nodes are "
                "available: 1 No preemption victims found for incoming pod."
            )
            self._mark_unschedulable(pod, message, now)
            return
        self.start(pod, now)

    def _preempt(self, pod: Obj, need: int, free: int, now: float) -> bool:
        """Evict lower-priority pods for ``pod`` (once); True when it now waits for them."""
        if pod["status"].get("nominatedNodeName"):
            return any(self.store.runtime.get(k, {}).get("preempted_by") for k in self.procs)
        terminating = {k for k, r in self.store.runtime.items() if r.get("term_at") is not None}
        running = [p for p in self.running_pods() if pod_key(p) not in terminating]
        victims = choose_victims(pod, running, need=need, free=free, cpu_of=allocated_cpu)
        if not victims:
            return False
        preemptor = pod_key(pod)
        for victim in victims:
            self.store.runtime[pod_key(victim)]["preempted_by"] = preemptor
            set_condition(
                victim,
                "DisruptionTarget",
                "True",
                rfc3339(now) or "",
                reason="PreemptionByScheduler",
                message=f"{preemptor}: preempting to accommodate a higher priority pod",
            )
            self.terminate(victim, now)
            self.store.touch(victim)
        pod["status"]["nominatedNodeName"] = NODE_NAME
        self.store.touch(pod)
        return True

    def start(self, pod: Obj, now: float) -> None:
        """Bind ``pod`` to the node and start its ``main`` container (or let it wait)."""
        bind(self, pod, NODE_NAME, now)
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
