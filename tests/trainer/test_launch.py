"""The launcher's torchrun command, its checks, its exit codes; the daemon's and DDP rank's checks.

None of these needs PyTorch: the launcher checks everything and prints (``--dry-run``) before it
would load torch, and the rest are pure functions.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qosflow_trainer import install_checkpoint_handler
from qosflow_trainer.ddp import World
from qosflow_trainer.ddp_model import batch_parts, rank_parts
from qosflow_trainer.errors import TrainerError
from qosflow_trainer.launch import (
    exit_for_failed_workers,
    exit_for_signal,
    main,
    plan,
    script_args,
)
from qosflow_trainer.preemption import (
    STOPPED_DIR_ENV,
    clear_checkpointed_exit,
    mark_checkpointed_exit,
)
from qosflow_trainer.rendezvous import address

POD = {
    "QOSFLOW_NNODES": "2",
    "QOSFLOW_RDZV_ENDPOINT": "10.1.2.3:29400",
    "QOSFLOW_RDZV_ID": "nightly-7f2k-seg-3",
    "POD_IP": "10.1.2.9",
}
DDP = ["python", "-m", "qosflow_trainer", "--ddp", "--width", "256"]


def test_dry_run_prints_the_torchrun_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", *DDP], POD) == 0
    assert capsys.readouterr().out == (
        f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 OMP_NUM_THREADS={_cpus()} torchrun --nnodes=2 "
        "--nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=10.1.2.3:29400 "
        "--rdzv-id=nightly-7f2k-seg-3 --rdzv-conf=is_host=false --local-addr=10.1.2.9 "
        "--max-restarts=0 -m qosflow_trainer --ddp --width 256\n"
    )


def _cpus() -> int:
    from qosflow_trainer import allowed_cpus

    return allowed_cpus()


@pytest.mark.slow
def test_dry_run_as_a_process_prints_one_line() -> None:
    env = {**os.environ, **POD, "QOSFLOW_NPROC_PER_NODE": "2", "GLOO_SOCKET_IFNAME": "eth0"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "qosflow_trainer.launch",
            "--dry-run",
            "--",
            "python3",
            "t.py",
            "-x",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.count("\n") == 1
    assert " GLOO_SOCKET_IFNAME=eth0 torchrun " in out
    assert "--nproc-per-node=2" in out and out.endswith(" --max-restarts=0 t.py -x\n")


def test_elastic_segment_timeouts_threads_and_no_gloo_unless_set() -> None:
    env = {
        **POD,
        "QOSFLOW_NNODES": "1:4",
        "QOSFLOW_NPROC_PER_NODE": "2",
        "QOSFLOW_RDZV_JOIN_TIMEOUT": "120",
        "QOSFLOW_RDZV_LAST_CALL_TIMEOUT": "5",
        "QOSFLOW_RDZV_CLOSE_TIMEOUT": "10",
    }
    launch = plan(["python", "train.py"], env, cpus=5)
    assert launch.args[0] == "--nnodes=1:4"
    assert "--rdzv-conf=is_host=false,join_timeout=120,last_call_timeout=5,close_timeout=10" in (
        launch.args
    )
    assert "--max-restarts=3" in launch.args  # elastic: a pod leaving costs a restart
    assert launch.env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "2"}
    assert (
        "--max-restarts=1"
        in plan(["python", "t.py"], {**env, "QOSFLOW_MAX_RESTARTS": "1"}, cpus=1).args
    )
    assert plan(["python", "t.py"], env, cpus=1).env["OMP_NUM_THREADS"] == "1"  # never 0
    without_ip = {k: v for k, v in POD.items() if k != "POD_IP"}
    assert not any(
        a.startswith("--local-addr") for a in plan(["python", "t.py"], without_ip, cpus=1).args
    )


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "-m", "pkg.mod", "--a", "1"], ["-m", "pkg.mod", "--a", "1"]),
        (["python3", "train.py"], ["train.py"]),
        (["/usr/local/bin/python3.11", "train.py", "-v"], ["train.py", "-v"]),
    ],
)
def test_the_leading_python_is_dropped(command: list[str], expected: list[str]) -> None:
    assert script_args(command) == expected


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["bash", "run.sh"],
        ["python"],
        ["python", "-u", "t.py"],
        ["python", "-m"],
        ["torchrun", "t.py"],
    ],
)
def test_anything_but_python_script_or_module_is_refused_naming_command(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TrainerError, match=r"^command: "):
        script_args(command)
    assert main(["--dry-run", *command], POD) == 2
    assert capsys.readouterr().err.startswith("error: command: ")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QOSFLOW_NNODES", None),
        ("QOSFLOW_NNODES", "two"),
        ("QOSFLOW_NNODES", "0"),
        ("QOSFLOW_NNODES", "3:2"),
        ("QOSFLOW_NPROC_PER_NODE", "0"),
        ("QOSFLOW_NPROC_PER_NODE", "auto"),
        ("QOSFLOW_RDZV_ENDPOINT", None),
        ("QOSFLOW_RDZV_ENDPOINT", "10.1.2.3"),
        ("QOSFLOW_RDZV_ENDPOINT", "10.1.2.3:70000"),
        ("QOSFLOW_RDZV_ID", None),
        ("QOSFLOW_RDZV_ID", "seg 3"),
        ("POD_IP", "my-pod"),
        ("QOSFLOW_MAX_RESTARTS", "-1"),
        ("QOSFLOW_RDZV_JOIN_TIMEOUT", "0"),
        ("QOSFLOW_RDZV_LAST_CALL_TIMEOUT", "soon"),
        ("GLOO_SOCKET_IFNAME", "eth0 lo"),
    ],
)
def test_each_bad_variable_is_named_and_exits_2(
    variable: str, value: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in POD.items() if k != variable}
    if value is not None:
        env[variable] = value
    assert main(["--dry-run", *DDP], env) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {variable}: ") and err.count("\n") == 1


def test_unknown_launcher_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--verbose", *DDP], POD) == 2
    assert "--verbose" in capsys.readouterr().err


def test_exit_codes_after_torchrun(tmp_path: Path) -> None:
    assert exit_for_failed_workers([75, 75]) == 75  # the ranks stopped together, checkpointed
    assert exit_for_failed_workers([75, 1]) == 1
    assert exit_for_failed_workers([2, 2]) == 2  # every rank refused the configuration
    assert exit_for_failed_workers([-9]) == 1
    assert exit_for_signal(15, tmp_path, 2) == 143  # stopped before any worker checkpointed
    env = {STOPPED_DIR_ENV: str(tmp_path), "LOCAL_RANK": "0"}
    mark_checkpointed_exit(env)
    assert exit_for_signal(15, tmp_path, 2) == 143  # local rank 1 did not say so
    mark_checkpointed_exit({**env, "LOCAL_RANK": "1"})
    assert exit_for_signal(15, tmp_path, 2) == 75
    clear_checkpointed_exit(env)  # a restarted worker has not checkpointed its own stop yet
    assert exit_for_signal(15, tmp_path, 2) == 143
    mark_checkpointed_exit({})  # without the launcher's variable: nothing to tell
    clear_checkpointed_exit({})


def test_checkpoint_handler_marks_its_checkpointed_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.setenv(STOPPED_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "3")
    (tmp_path / "local-rank-3").write_text("75\n")  # left by this worker's previous run
    previous = signal.getsignal(signal.SIGTERM)
    handler = install_checkpoint_handler(lambda: None)
    try:
        assert not (tmp_path / "local-rank-3").exists()
        with pytest.raises(SystemExit) as exc, handler.critical():
            os.kill(os.getpid(), signal.SIGTERM)
        assert exc.value.code == 75
        assert (tmp_path / "local-rank-3").read_text() == "75\n"
    finally:
        handler.uninstall()
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ("0.0.0.0", 29400)),
        ({"POD_IP": "10.0.0.7", "QOSFLOW_RDZV_PORT": "29500"}, ("10.0.0.7", 29500)),
    ],
)
def test_rendezvous_address(env: dict[str, str], expected: tuple[str, int]) -> None:
    assert address(env) == expected


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"POD_IP": "pod-a"}, "POD_IP"),
        ({"QOSFLOW_RDZV_PORT": "http"}, "QOSFLOW_RDZV_PORT"),
        ({"QOSFLOW_RDZV_PORT": "0"}, "QOSFLOW_RDZV_PORT"),
    ],
)
def test_rendezvous_variables_are_checked(env: dict[str, str], variable: str) -> None:
    with pytest.raises(TrainerError, match=f"^{variable}: "):
        address(env)


@pytest.mark.slow
def test_the_rendezvous_daemon_checks_its_variables_before_torch_loads() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qosflow_trainer.rendezvous"],
        env={**os.environ, "QOSFLOW_RDZV_PORT": "70000"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr == "error: QOSFLOW_RDZV_PORT: must be in 1..65535 (got 70000)\n"


def test_world_of_a_rank_from_torchruns_variables() -> None:
    assert World.from_env({}) == World()  # run directly: a world of one
    world = World.from_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    )
    assert (world.rank, world.world_size, world.local_world_size, world.launched) == (3, 4, 2, True)
    with pytest.raises(TrainerError, match=r"^RANK: "):
        World.from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(TrainerError, match=r"^WORLD_SIZE: "):
        World.from_env({"RANK": "0", "WORLD_SIZE": "x"})


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 11])
def test_every_block_of_a_batch_goes_to_exactly_one_rank(world: int) -> None:
    parts = batch_parts(1024, 8)
    shares = [rank_parts(parts, world, rank) for rank in range(world)]
    assert sorted(p for share in shares for p in share) == list(range(parts))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # as even as blocks allow
    with pytest.raises(ValueError, match="rank"):
        rank_parts(parts, world, world)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed")
def test_ddp_mode_without_torch_says_how_to_install_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qosflow_trainer", "--ddp", "--checkpoint-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "qosflow-trainer[torch]" in out.stderr and out.stderr.startswith("error: PyTorch: ")
