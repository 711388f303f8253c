from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Small sizes: a step takes a few milliseconds but its GEMMs are still big enough for OpenBLAS to
# split across threads. Trainers run pinned to one CPU unless a test needs two: two spinning BLAS
# threads on a machine shared with other jobs can be 20x slower than one.
SMALL = {
    "QOSFLOW_WIDTH": "128",
    "QOSFLOW_DEPTH": "2",
    "QOSFLOW_INPUT_DIM": "32",
    "QOSFLOW_BATCH_SIZE": "128",
}


class Trainer:
    """A real `python -m qosflow_trainer` process with its stderr events on a queue."""

    def __init__(self, env: dict[str, str], args: list[str], cpus: set[int] | None) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QOSFLOW_")}
        full_env.pop("ARGO_PROGRESS_FILE", None)
        full_env.update(env)

        def pin() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qosflow_trainer", *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pin,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def wait_event(self, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"event not seen; stderr: {''.join(self.stderr_lines)[-2000:]}"
                )
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if pred(ev):
                return ev

    def finish(self, timeout: float = 120.0) -> tuple[int, list[dict[str, Any]]]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        return self.proc.returncode, lines


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Any]:
    started: list[Trainer] = []

    def start(
        ckpt: Path | None = None,
        *,
        steps: int,
        cpus: set[int] | None = None,
        extra: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> Trainer:
        env = {
            **SMALL,
            "QOSFLOW_TOTAL_STEPS": str(steps),
            "QOSFLOW_SEED": "7",
            "QOSFLOW_CHECKPOINT_DIR": str(ckpt or tmp_path / "ckpt"),
            "QOSFLOW_CHECKPOINT_EVERY": "50",
            **(extra or {}),
        }
        t = Trainer(env, args or [], cpus or one_cpu())
        started.append(t)
        return t

    yield start
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def one_cpu() -> set[int]:
    return {min(os.sched_getaffinity(0))}
