"""The DDP mode: does a second worker pod speed the same optimisation up?

A rendezvous daemon (``python -m qosflow_trainer.rendezvous``) and launcher processes (``python -m
qosflow_trainer.launch python -m qosflow_trainer --ddp``), each pinned to its own CPU so every rank
runs one thread, as 1-CPU pods would. First one launcher trains at world size 1, then two train at
world size 2, in the same run; the global batch is the same (4096 rows, width 256, float64), so
two workers each do half of every step's arithmetic, plus one all-reduce of the gradients over
loopback gloo. The rate is rank 0's, over ``WINDOW_S`` seconds after ``WARMUP_STEPS`` steps.
The all-reduce costs the same whatever the batch, so a smaller batch scales worse: the same pair
of runs at 1024 rows shows how much (``..._batch_1024``).

The wall-clock speedup needs two otherwise idle CPUs: on a machine busy with other work (and
Linux's autogroup scheduling) the ranks get a fraction of their CPUs whatever their pinning. Rank
0's CPU time per step does not depend on that load, so the two CPU figures show what the second
worker saves when the load average is high.

Needs PyTorch: ``make bench`` runs this script with torch layered over the locked environment (as
``make pytest-torch`` does); without it, it prints ``ddp_skipped: <why>`` and exits 0.

Then a job of that model (batch 1024) as qosflow ships it, on the local cluster (two 1-CPU
nodes, the rendered ``train-workers-cpu`` segments through :class:`qosflow_argo.ArgoCluster`): a ``unit: worker`` job
starts on one worker pod, is stopped (SIGTERM: rank 0 checkpoints to the claim), and resubmitted
at two pods of one worker, the way the pipeline's checkpoint-restart rescales it. The speed
model is fitted from the progress both segments reported (sizes as pods × units, as the history
keeps them): first from the one-worker segment alone (what the planner believed about two before
it had seen two), then from both (what it believes after).

Prints ``key: value`` lines:
  ddp_steps_per_s_1_worker, ddp_steps_per_s_2_workers   rank 0's step rate (bare processes)
  ddp_speedup_1_to_2_workers                            the ratio (2 idle CPUs: close to 2)
  ddp_speedup_1_to_2_workers_batch_1024                 the same at a quarter of the batch
  ddp_cpu_ms_per_step_1_worker, ..._2_workers           rank 0's CPU time per step (its share
                                                        of the arithmetic, plus the all-reduce)
  ddp_local_steps_per_s_1_worker, ..._2_workers         the job's rate on the local cluster
  ddp_fit_prior_steps_per_s_2_workers                   the model's 2-worker rate fitted from
                                                        the 1-worker segment alone
  ddp_fit_steps_per_s_2_workers, ddp_fit_error_2_workers   fitted from both segments, and its
                                                        relative error against the measurement
  ddp_rescale_stop_to_resume_s                          stop request → first step past the
                                                        checkpoint at the new world size
  ddp_steps_lost, ddp_checkpoint_interval_steps         steps reached by world 1 and not resumed
                                                        by world 2 (≤ the interval)
  ddp_load_average_1m                                   the machine's load at the end
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARMUP_STEPS = 5
WINDOW_S = 4.0
SIZES = {
    "QOSFLOW_WIDTH": "256",
    "QOSFLOW_DEPTH": "3",
    "QOSFLOW_INPUT_DIM": "256",
    "QOSFLOW_BATCH_SIZE": "4096",
    "QOSFLOW_TOTAL_STEPS": "1000000",
    "QOSFLOW_CHECKPOINT_EVERY": "0",
    "QOSFLOW_LOG_EVERY": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}


class Proc:
    """A ``python -m <module>`` process, pinned to one CPU, with its stderr events on a queue."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cpu: int | None):
        full = {k: v for k, v in os.environ.items() if not k.startswith("QOSFLOW_")}
        full.update(env)
        cpus = sorted(os.sched_getaffinity(0))

        def pin() -> None:
            if cpu is not None:
                os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})

        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=full,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pin,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def stop(self) -> None:
        """SIGTERM: a launcher's ranks checkpoint (none here) and exit 75; the daemon exits 0."""
        self.proc.send_signal(signal.SIGTERM)


def _step_event(
    pod: Proc, done: Callable[[dict[str, Any]], bool], timeout: float = 180.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            event = pod.events.get(timeout=1.0)
        except queue.Empty:
            if pod.proc.poll() is not None:
                raise RuntimeError(f"launcher exited with {pod.proc.returncode}") from None
            continue
        if event["event"] == "step" and event["rank"] == 0 and done(event):
            return event
    raise RuntimeError("no step event in time")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rate(port: int, workers: int, checkpoints: Path, batch: int = 4096) -> tuple[float, float]:
    """Rank 0's steps per second and CPU ms per step, with ``workers`` launchers of 1 CPU each."""
    env = {
        **SIZES,
        "QOSFLOW_BATCH_SIZE": str(batch),
        "QOSFLOW_NNODES": str(workers),
        "QOSFLOW_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "QOSFLOW_RDZV_ID": f"bench-{workers}-{batch}",
        "QOSFLOW_CHECKPOINT_DIR": str(checkpoints / f"{workers}-{batch}"),
    }
    args = ["python", "-m", "qosflow_trainer", "--ddp"]
    pods = [
        Proc("qosflow_trainer.launch", args, {**env, "POD_IP": f"127.0.0.{2 + i}"}, i)
        for i in range(workers)
    ]
    try:
        rank0: Proc | None = None
        pid = 0
        while rank0 is None:  # whichever pod got rank 0
            for pod in pods:
                try:
                    event = pod.events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if event["event"] == "start" and event["rank"] == 0:
                    rank0, pid = pod, int(event["pid"])
        first = _step_event(rank0, lambda e: e["step"] >= WARMUP_STEPS)
        cpu_first = _cpu_s(pid)
        last = _step_event(rank0, lambda e: e["t"] - first["t"] >= WINDOW_S)
        steps = last["step"] - first["step"]
        return steps / (last["t"] - first["t"]), (_cpu_s(pid) - cpu_first) * 1000 / steps
    finally:
        for pod in pods:
            pod.stop()
        for pod in pods:
            pod.proc.wait(timeout=120)


LOCAL_STEPS = 1_000_000
LOCAL_CHECKPOINT_EVERY = 200
LOCAL_WINDOW_S = 8.0
LOCAL_COMMAND = (
    "python",
    "-m",
    "qosflow_trainer",
    "--ddp",
    "--width",
    "256",
    "--depth",
    "3",
    "--input-dim",
    "256",
    "--batch-size",
    "1024",
    "--log-every",
    "1",
)


def _samples(cluster: Any, name: str, units: int, past: int, seconds: float) -> list[Any]:
    """Progress samples of segment ``name`` for ``seconds`` once it is past step ``past``."""
    from qosflow.core.speed import ProgressSample

    samples: list[Any] = []
    end = None
    while end is None or time.monotonic() < end:
        status = cluster.status(name)
        if status.phase not in ("Pending", "Running"):
            raise RuntimeError(f"{name} ended early: {status.phase} {status.message}")
        if (status.steps_done or 0) > past:
            end = end or time.monotonic() + seconds
            samples.append(ProgressSample(time.time(), status.steps_done, units, pods=units))
        time.sleep(0.25)
    return samples


def _rate_of(samples: list[Any]) -> float:
    first, last = samples[0], samples[-1]
    return (last.steps_done - first.steps_done) / (last.time - first.time)


def _logged(cluster: Any, name: str, event: str) -> list[dict[str, Any]]:
    """The JSON events ``event`` of every worker pod of workflow ``name``."""
    found: list[dict[str, Any]] = []
    for pod in cluster.kube.list_pods(f"workflows.argoproj.io/workflow={name}"):
        if pod["metadata"]["labels"].get("qosflow.dev/role") == "rendezvous":
            continue
        for line in cluster.kube.pod_log(pod["metadata"]["name"], tail_lines=10**6).splitlines():
            if line.startswith("{") and f'"event": "{event}"' in line:
                found.append(json.loads(line))
    return found


def local_rescale() -> dict[str, float]:
    """One ``unit: worker`` job on the local cluster: 1 worker, checkpoint-restart, 2 workers."""
    from dataclasses import replace

    from qosflow.core.cluster import SubmitRequest
    from qosflow.core.fit import fit
    from qosflow.core.pod import Checkpoint, PodSettings
    from qosflow.local.cluster import LocalCluster
    from qosflow_argo import ArgoCluster

    claim = "qosflow-checkpoints"
    with (
        tempfile.TemporaryDirectory(prefix="ddp-local-") as tmp,
        LocalCluster(cpus=1, nodes=2, state_dir=Path(tmp) / "state") as local,
        ArgoCluster.from_local(local) as cluster,
    ):
        cluster.ensure_installed(checkpoint_claim=claim)
        first = SubmitRequest(
            job="ddp-bench",
            segment=0,
            units=1,
            unit="worker",
            total_steps=LOCAL_STEPS,
            resume=False,
            priority_class="qosflow-normal",
            priority=10,
            image="qosflow-trainer:local",
            command=LOCAL_COMMAND,
            memory_per_unit="1Gi",
            deadline=time.time() + 3600,
            checkpoint_dir="/ckpt/ddp-bench",
            checkpoint_every_steps=LOCAL_CHECKPOINT_EVERY,
            pod=PodSettings(
                volumes=({"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}},)
            ),
            checkpoint=Checkpoint("ckpt", "/ckpt"),
            launcher="torchrun",
            per_node=1,
            worker_unit="cpu",
            per_worker=1,
        )
        print("ddp bench: one worker on the local cluster", file=sys.stderr, flush=True)
        cluster.submit(first)
        one = _samples(cluster, first.name, 1, WARMUP_STEPS, LOCAL_WINDOW_S)
        print("ddp bench: stop, resubmit at two worker pods", file=sys.stderr, flush=True)
        stopped_at = time.time()  # the samples' clock
        ended = cluster.stop(first.name, message="bench: rescale to 2 workers")
        second = replace(first, segment=1, units=2, resume=True)
        cluster.submit(second)
        two = _samples(cluster, second.name, 2, ended.steps_done or 0, LOCAL_WINDOW_S)
        reached = max(
            [ended.steps_done or 0, *(e["step"] for e in _logged(cluster, first.name, "step"))]
        )
        resumed = min(e["step"] for e in _logged(cluster, second.name, "resume"))
        cluster.stop(second.name, message="bench: done")
    before = fit(one, node_size=1)
    after = fit([*one, *two], node_size=1)
    measured = _rate_of(two)
    fitted = 1.0 / after.model.step_time(2)
    return {
        "ddp_local_steps_per_s_1_worker": _rate_of(one),
        "ddp_local_steps_per_s_2_workers": measured,
        "ddp_fit_prior_steps_per_s_2_workers": 1.0 / before.model.step_time(2),
        "ddp_fit_steps_per_s_2_workers": fitted,
        "ddp_fit_error_2_workers": fitted / measured - 1.0,
        "ddp_rescale_stop_to_resume_s": two[0].time - stopped_at,
        "ddp_steps_lost": float(reached - resumed),
        "ddp_checkpoint_interval_steps": float(LOCAL_CHECKPOINT_EVERY),
    }


def main() -> int:
    if importlib.util.find_spec("torch") is None:
        print("ddp_skipped: PyTorch is not importable (make bench layers it in)")
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    daemon = Proc(
        "qosflow_trainer.rendezvous",
        [],
        {"POD_IP": "127.0.0.1", "QOSFLOW_RDZV_PORT": str(port)},
        None,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
            one, cpu_one = _rate(port, 1, Path(tmp))
            two, cpu_two = _rate(port, 2, Path(tmp))
            small = _rate(port, 2, Path(tmp), 1024)[0] / _rate(port, 1, Path(tmp), 1024)[0]
    finally:
        daemon.stop()
        daemon.proc.wait(timeout=60)
    print(f"ddp_steps_per_s_1_worker: {one:.2f}")
    print(f"ddp_steps_per_s_2_workers: {two:.2f}")
    print(f"ddp_speedup_1_to_2_workers: {two / one:.2f}")
    print(f"ddp_speedup_1_to_2_workers_batch_1024: {small:.2f}")
    print(f"ddp_cpu_ms_per_step_1_worker: {cpu_one:.1f}")
    print(f"ddp_cpu_ms_per_step_2_workers: {cpu_two:.1f}")
    for key, value in local_rescale().items():
        print(f"{key}: {int(value)}" if key.endswith(("lost", "steps")) else f"{key}: {value:.3f}")
    print(f"ddp_load_average_1m: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
