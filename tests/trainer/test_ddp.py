"""The DDP mode for real: a rendezvous daemon, two launcher pods, a stop, a resume at world size 1.

Marked `torch`: `make pytest-torch` runs them with PyTorch layered over the locked environment
(skipped without PyTorch, failed when CI is set). Every rank runs with one thread, each pod pinned
to its own CPU, as two 1-CPU pods would.

Tolerance of the result comparisons, 1e-9 relative: every run trains the same float64
optimisation (same batches, initial weights, loss and update); a different world size only
changes the order of the additions in each gradient (each rank's partial sums, then the
all-reduce), about 1e-16 relative per addition, and a few dozen momentum-SGD steps on this
regression do not amplify that to anywhere near 1e-9.
"""

from __future__ import annotations

import io
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qosflow_trainer.config import TrainerConfig, parse_config
from qosflow_trainer.ddp_model import rank_batch, rank_parts, scaled_loss
from qosflow_trainer.job import TrainingJob
from qosflow_trainer.model import Task, init_params, sgd_step
from qosflow_trainer.progress import parse_progress

from .torch_procs import SMALL, Proc, Procs, cpu, free_port, require_torch

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(900)]  # WAIT_S per wait
REL = 1e-9


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    started = Procs(tmp_path)
    yield started
    started.close()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def _config(steps: int, ckpt: Path) -> TrainerConfig:
    env = {**SMALL, "QOSFLOW_TOTAL_STEPS": str(steps), "QOSFLOW_CHECKPOINT_DIR": str(ckpt)}
    return parse_config([], env)


def test_rank_shares_of_a_batch_average_to_the_global_gradient() -> None:
    import torch

    from qosflow_trainer.ddp_model import build_model, load_momentum, to_arrays

    cfg = _config(1, Path("unused"))
    task, params = Task(cfg.shape, cfg.seed), init_params(cfg.shape, cfg.seed)
    grads = []
    for world in (1, 2, 3):
        model = build_model(cfg.shape, params)
        for rank in range(world):
            parts = rank_parts(8, world, rank)
            x, y = rank_batch(task, 5, cfg.batch_size, cfg.shards, parts)
            out = model(torch.from_numpy(x))
            loss = scaled_loss(
                out, torch.from_numpy(y), batch_size=cfg.batch_size, world_size=world
            )
            loss.backward()  # gradients add up over the ranks, as DDP's sum before its mean
        grads.append([p.grad.numpy() / world for p in model.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    # one momentum-SGD step in torch equals the numpy trainer's step, and the arrays round-trip
    model = build_model(cfg.shape, params)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    load_momentum(model, optimizer, params)
    x, y = task.batch(5, cfg.batch_size, cfg.shards)
    scaled_loss(
        model(torch.from_numpy(x)), torch.from_numpy(y), batch_size=len(x), world_size=1
    ).backward()
    optimizer.step()
    reference = {k: v.copy() for k, v in params.items()}
    sgd_step(reference, x, y, lr=cfg.lr, shards=cfg.shards)
    for name, value in to_arrays(model, optimizer).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-10, atol=1e-13)


def _pods_env(tmp_path: Path, port: int, rdzv_id: str, nnodes: int) -> dict[str, str]:
    return {
        **SMALL,
        "QOSFLOW_NNODES": str(nnodes),
        "QOSFLOW_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "QOSFLOW_RDZV_ID": rdzv_id,
        "QOSFLOW_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "QOSFLOW_CHECKPOINT_EVERY": "10",
        "QOSFLOW_LOG_EVERY": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # every rank is on this machine: keep gloo on loopback
    }


def _poll_progress(files: list[Path], seen: dict[Path, list[int]]) -> None:
    for path in files:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        value = parse_progress(text)
        assert value is not None, f"invalid progress {text!r} in {path.name}"
        seen.setdefault(path, []).append(value[0])


def _world_of_two(
    procs: Procs, tmp_path: Path, port: int
) -> tuple[dict[int, Proc], dict[int, Path], dict[Path, list[int]], int]:
    """Two pods train at world size 2; the pod without rank 0 is stopped; both exit 75."""
    env = {**_pods_env(tmp_path, port, "seg-1", 2), "QOSFLOW_TOTAL_STEPS": "1000000"}
    progress = [tmp_path / "progress-a", tmp_path / "progress-b"]
    pods = [
        procs.launcher(
            {**env, "POD_IP": f"127.0.0.{2 + i}", "ARGO_PROGRESS_FILE": str(progress[i])}, cpu(i)
        )
        for i in range(2)
    ]
    starts = [p.wait_event(lambda e: e["event"] == "start") for p in pods]
    assert sorted(s["rank"] for s in starts) == [0, 1]
    assert {(s["world_size"], s["step"], s["threads"]) for s in starts} == {(2, 0, 1)}
    by_rank = {s["rank"]: p for s, p in zip(starts, pods, strict=True)}
    files = {s["rank"]: f for s, f in zip(starts, progress, strict=True)}
    seen: dict[Path, list[int]] = {}
    deadline = time.monotonic() + 60
    while not any(e.get("step", 0) >= 100 for e in by_rank[0].events if e["event"] == "step"):
        assert time.monotonic() < deadline, by_rank[0].log()
        _poll_progress(progress, seen)
        time.sleep(0.01)  # polling a file another process writes: no clock to inject
    by_rank[1].proc.send_signal(signal.SIGTERM)  # only the pod without rank 0 is told
    results = {rank: pod.finish() for rank, pod in by_rank.items()}
    _poll_progress(progress, seen)
    assert {rank: code for rank, (code, _) in results.items()} == {0: 75, 1: 75}
    stops = {r: p.wait_event(lambda e: e["event"] == "stopped") for r, p in by_rank.items()}
    step = stops[0]["step"]
    assert {(s["step"], s["world_size"]) for s in stops.values()} == {(step, 2)}
    assert results[0][1] == [
        {
            "event": "stopped",
            "steps": step,
            "checkpoint": str(tmp_path / "ckpt" / f"ckpt-{step:010d}.qfck"),
        }
    ]
    assert results[1][1] == []  # the final stdout line is rank 0's alone
    assert [e for e in by_rank[1].events if e["event"] == "checkpoint"] == []
    return by_rank, files, seen, step


def test_two_pods_stop_together_then_resume_at_world_size_one(procs: Procs, tmp_path: Path) -> None:
    port = free_port()
    daemon = procs.rendezvous(port)
    _, files, seen, stop_step = _world_of_two(procs, tmp_path, port)

    # progress: only rank 0's pod wrote it, every value read was valid and non-decreasing
    rank0_file = files[0]
    assert not files[1].exists()
    assert list(seen) == [rank0_file] and len(seen[rank0_file]) >= 2
    assert seen[rank0_file] == sorted(seen[rank0_file]) and seen[rank0_file][-1] == stop_step
    assert rank0_file.read_text() == f"{stop_step}/1000000\n"

    # relaunch one pod (a new segment id) and, beside it, an uninterrupted world of one
    total = stop_step + 20
    env = {**_pods_env(tmp_path, port, "seg-2", 1), "QOSFLOW_TOTAL_STEPS": str(total)}
    progress = tmp_path / "progress-resumed"
    resumed = procs.launcher(
        {**env, "POD_IP": "127.0.0.2", "ARGO_PROGRESS_FILE": str(progress)}, cpu(0)
    )
    reference = procs.start(
        "qosflow_trainer",
        ["--ddp"],
        {
            **SMALL,
            "QOSFLOW_TOTAL_STEPS": str(total),
            "QOSFLOW_CHECKPOINT_DIR": str(tmp_path / "ref"),
        },
        cpu(1),
    )
    code, lines = resumed.finish()
    assert code == 0, resumed.log()
    events = resumed.events
    resume = next(e for e in events if e["event"] == "resume")
    assert (resume["step"], resume["world_size"], resume["from_world_size"]) == (stop_step, 1, 2)
    start = next(e for e in events if e["event"] == "start")
    assert (start["step"], start["world_size"], start["rank"]) == (stop_step, 1, 0)
    trained = [e["step"] for e in events if e["event"] == "step"]
    assert trained == list(range(stop_step + 1, total + 1))  # no step twice, none missing
    assert progress.read_text() == f"{total}/{total}\n"
    assert [line["event"] for line in lines] == ["done"]
    done = lines[0]
    assert (done["steps"], done["resumed_from"], done["world_size"]) == (total, stop_step, 1)

    ref_code, ref_lines = reference.finish()
    assert ref_code == 0, reference.log()
    assert ref_lines[0]["resumed_from"] is None and ref_lines[0]["world_size"] == 1
    assert _rel(done["loss"], ref_lines[0]["loss"]) <= REL
    numpy_out = io.StringIO()
    assert (
        TrainingJob(
            _config(total, tmp_path / "numpy"), stdout=numpy_out, stderr=io.StringIO()
        ).run()
        == 0
    )
    assert _rel(done["loss"], _json_loss(numpy_out.getvalue())) <= REL

    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.finish()[0] == 0
    assert [e["event"] for e in daemon.events] == ["listening", "stopping"]


def _json_loss(out: str) -> float:
    import json

    value: Any = json.loads(out.strip().splitlines()[-1])["loss"]
    return float(value)


def test_rendezvous_on_a_taken_port_exits_1_naming_it(procs: Procs) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = procs.start(
            "qosflow_trainer.rendezvous",
            env={"POD_IP": "127.0.0.1", "QOSFLOW_RDZV_PORT": str(port)},
        )
        code, _ = daemon.finish()
    assert code == 1
    assert [(e["event"], e["port"]) for e in daemon.events] == [("error", port)]
