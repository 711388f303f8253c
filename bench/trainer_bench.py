"""Reference trainer: does an in-place CPU resize really speed it up?

One `python -m qosflow_trainer` process (default sizes) runs pinned to 1 CPU, is re-pinned to 2
CPUs with os.sched_setaffinity (what the local cluster does on an in-place resize), and so on,
alternating ``ROUNDS`` times; the step rates of the same process are compared side by side. Then it
is stopped with SIGTERM and the time to a written checkpoint and exit code 75 is measured.

The wall-clock speedup needs two otherwise idle CPUs. On a busy Linux host with autogroup
scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) a session's CPU share is fixed whatever
its thread count, so the ratio drops towards 1; the CPU time per step and the load average are
printed so such a run can be recognised.

Prints ``key: value`` lines:
  trainer_step_ms_1cpu, trainer_step_ms_2cpu  median step time at each size
  resize_speedup_1_to_2_cpus                  step rate at 2 CPUs / at 1 CPU (target >= 1.5)
  trainer_cpu_ms_per_step_{1,2}cpu            CPU time per step (load-independent; equal values
                                              mean the 2-CPU run wastes nothing on coordination)
  resize_reaction_steps                       max steps between a re-pin and the pool resize
  sigterm_to_checkpointed_exit_s              SIGTERM -> checkpoint written -> exit 75
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROUNDS = 3
WINDOW_S = 4.0


def _reader(proc: subprocess.Popen[str], events: queue.Queue[dict[str, Any]]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("{"):
            events.put(json.loads(line))


def _next(events: queue.Queue[dict[str, Any]], kind: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ev = events.get(timeout=max(0.01, deadline - time.monotonic()))
        if ev["event"] == kind:
            return ev


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(
    events: queue.Queue[dict[str, Any]], threads: int, pid: int
) -> tuple[list[float], int, float]:
    """Wait for the pool resize to ``threads``, then collect step times for WINDOW_S seconds.

    Returns:
        Step durations (s), steps between the re-pin and the pool resize, CPU seconds per step.
    """
    ev = _next(events, "threads")
    assert ev["threads"] == threads, ev
    reaction = ev["step"]
    times: list[float] = []
    stamps: list[float] = []
    first = _next(events, "step")
    cpu0 = _cpu_s(pid)
    reaction = first["step"] - reaction
    stamps.append(first["t"])
    while stamps[-1] - stamps[0] < WINDOW_S:
        ev = _next(events, "step")
        assert ev["threads"] == threads, ev
        stamps.append(ev["t"])
    cpu = (_cpu_s(pid) - cpu0) / (len(stamps) - 1)
    times = [b - a for a, b in itertools.pairwise(stamps)]
    return times, reaction, cpu


def main() -> int:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("resize_speedup_1_to_2_cpus: nan")
        print("note: needs 2 CPUs")
        return 0
    one, two = {cpus[0]}, set(cpus[:2])
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QOSFLOW_")}
        env.update(
            QOSFLOW_TOTAL_STEPS="1000000",
            QOSFLOW_CHECKPOINT_DIR=tmp,
            QOSFLOW_CHECKPOINT_EVERY="0",
            QOSFLOW_CPU_CHECK_EVERY="1",
            QOSFLOW_LOG_EVERY="1",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "qosflow_trainer"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, one),
        )
        events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=_reader, args=(proc, events), daemon=True).start()
        try:
            steps: dict[int, list[float]] = {1: [], 2: []}
            reactions: list[int] = []
            cpu: dict[int, list[float]] = {1: [], 2: []}
            for r in range(ROUNDS):
                if r > 0:
                    os.sched_setaffinity(proc.pid, one)
                t1, _, c1 = _phase(events, 1, proc.pid)
                os.sched_setaffinity(proc.pid, two)
                t2, reaction, c2 = _phase(events, 2, proc.pid)
                cpu[1].append(c1)
                cpu[2].append(c2)
                steps[1] += t1
                steps[2] += t2
                reactions.append(reaction)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            stop_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ms1 = statistics.median(steps[1]) * 1000
    ms2 = statistics.median(steps[2]) * 1000
    print(f"trainer_step_ms_1cpu: {ms1:.1f}")
    print(f"trainer_step_ms_2cpu: {ms2:.1f}")
    print(f"resize_speedup_1_to_2_cpus: {ms1 / ms2:.2f}")
    print(f"trainer_cpu_ms_per_step_1cpu: {statistics.median(cpu[1]) * 1000:.1f}")
    print(f"trainer_cpu_ms_per_step_2cpu: {statistics.median(cpu[2]) * 1000:.1f}")
    print(f"resize_reaction_steps: {max(reactions)}")
    print(f"sigterm_to_checkpointed_exit_s: {stop_s:.2f}")
    print(f"sigterm_exit_code: {code}")
    print(f"load_average_1m: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
