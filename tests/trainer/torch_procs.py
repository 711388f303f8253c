"""Real processes for the PyTorch tests: the rendezvous daemon, launchers and direct DDP ranks.

Each process's JSON stderr lines land on a queue as they come (torchrun's own log lines are kept
as text), so a test waits for an event instead of sleeping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

WAIT_S = 300.0
"""How long a test waits for an event or an exit before it calls the process hung: a bound on a
hang, not on speed. These tests run beside others (`make test`); run at nice 19 beside the slow
stories, a trainer got so little CPU that it did not start within the 90 s this was."""

# A few milliseconds a step, yet real matrix products and a real all-reduce.
SMALL = {
    "QOSFLOW_WIDTH": "64",
    "QOSFLOW_DEPTH": "2",
    "QOSFLOW_INPUT_DIM": "32",
    "QOSFLOW_BATCH_SIZE": "128",
    "QOSFLOW_SEED": "7",
}


def require_torch() -> None:
    """Skip without PyTorch — but fail when ``CI`` is set: CI must run these tests."""
    if importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get("CI"):
        pytest.fail("PyTorch is not importable and CI is set: run `make pytest-torch`")
    pytest.skip("PyTorch is not importable (`make pytest-torch` layers it in)")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu(index: int) -> set[int]:
    """The ``index``-th CPU this process may use (wrapping around on a 1-CPU machine)."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[index % len(cpus)]}


class Proc:
    """A real ``python -m <module> args`` process with its stderr JSON events on a queue."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cpus: set[int] | None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QOSFLOW_")}
        for name in ("ARGO_PROGRESS_FILE", "POD_IP", "RANK", "WORLD_SIZE", "OMP_NUM_THREADS"):
            full_env.pop(name, None)
        full_env.update(env)

        def pin() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pin,
        )
        self.events: list[dict[str, Any]] = []
        self.stderr_lines: list[str] = []
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            if line.startswith("{"):
                event = json.loads(line)
                self.events.append(event)
                self._queue.put(event)

    def log(self) -> str:
        return "".join(self.stderr_lines)[-3000:]

    def wait_event(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self._queue.empty():
                    self._reader.join(timeout=5)
                    if self._queue.empty():
                        break
                continue
            if pred(event):
                return event
        raise AssertionError(f"event not seen (exit {self.proc.poll()}); stderr:\n{self.log()}")

    def finish(self, timeout: float = WAIT_S) -> tuple[int, list[dict[str, Any]]]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return self.proc.returncode, lines

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Procs:
    """Starts processes and kills whatever is still running at the end of a test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Proc] = []

    def start(
        self,
        module: str,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
    ) -> Proc:
        proc = Proc(module, args or [], env or {}, cpus)
        self.started.append(proc)
        return proc

    def rendezvous(self, port: int) -> Proc:
        """The daemon, started: the agents keep trying to reach it while it loads PyTorch."""
        return self.start(
            "qosflow_trainer.rendezvous",
            env={"POD_IP": "127.0.0.1", "QOSFLOW_RDZV_PORT": str(port)},
        )

    def launcher(self, env: dict[str, str], cpus: set[int]) -> Proc:
        return self.start(
            "qosflow_trainer.launch", ["python", "-m", "qosflow_trainer", "--ddp"], env, cpus
        )

    def close(self) -> None:
        for proc in self.started:
            proc.stop()
