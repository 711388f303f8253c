"""In-process runs of the training job (small sizes) and its configuration."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from qosflow_trainer.__main__ import main
from qosflow_trainer.config import TrainerConfig, parse_config
from qosflow_trainer.errors import TrainerError
from qosflow_trainer.job import TrainingJob
from qosflow_trainer.model import ModelShape, Task, init_params, loss, sgd_step

ENV = {
    "QOSFLOW_WIDTH": "64",
    "QOSFLOW_DEPTH": "2",
    "QOSFLOW_INPUT_DIM": "16",
    "QOSFLOW_BATCH_SIZE": "32",
    "QOSFLOW_SEED": "5",
}


def _config(tmp_path: Path, **env: str) -> TrainerConfig:
    return parse_config([], {**ENV, "QOSFLOW_CHECKPOINT_DIR": str(tmp_path / "ck"), **env})


def _run(cfg: TrainerConfig) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    out, err = io.StringIO(), io.StringIO()
    code = TrainingJob(cfg, stdout=out, stderr=err).run()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    return code, json.loads(lines[0]), [json.loads(x) for x in err.getvalue().splitlines()]


def test_env_defaults_and_flags_override(tmp_path: Path) -> None:
    cfg = parse_config(
        ["--total-steps", "9", "--resume", "FALSE"],
        {"QOSFLOW_TOTAL_STEPS": "5", "QOSFLOW_CHECKPOINT_EVERY": "3", "ARGO_PROGRESS_FILE": "/p"},
    )
    assert cfg.total_steps == 9 and cfg.checkpoint_every == 3 and cfg.resume == "false"
    assert cfg.progress_file == Path("/p") and cfg.batch_size == 1024 and cfg.cgroup_cpu_max is None
    assert parse_config(["--steps=4"], {"QOSFLOW_RESUME": "Yes"}).total_steps == 4
    assert parse_config([], {"QOSFLOW_RESUME": " 0 "}).resume == "false"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"QOSFLOW_TOTAL_STEPS": "0"}, "total_steps (QOSFLOW_TOTAL_STEPS)"),
        ({"QOSFLOW_BATCH_SIZE": "many"}, "batch_size (QOSFLOW_BATCH_SIZE)"),
        ({"QOSFLOW_RESUME": "maybe"}, "resume (QOSFLOW_RESUME)"),
        ({"QOSFLOW_LR": "-1"}, "lr (QOSFLOW_LR)"),
    ],
)
def test_bad_values_name_option_and_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(TrainerError) as exc:
        parse_config([], env)
    assert exc.value.field == names


def test_main_reports_bad_config_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--total-steps", "-3"]) == 2
    assert "QOSFLOW_TOTAL_STEPS" in capsys.readouterr().err


def test_training_reduces_held_out_loss() -> None:
    shape = ModelShape(input_dim=16, width=64, depth=2)
    task = Task(shape, seed=1)
    params = init_params(shape, 1)
    before = loss(params, task.eval_x, task.eval_y)
    for k in range(150):
        sgd_step(params, *task.batch(k, 64), lr=0.01)
    assert loss(params, task.eval_x, task.eval_y) < 0.6 * before


def test_batches_depend_only_on_seed_and_index() -> None:
    shape = ModelShape(input_dim=8, width=8, depth=1)
    a, b = Task(shape, 3), Task(shape, 3)
    b.batch(0, 4)  # drawing other batches first changes nothing
    x1, _ = a.batch(5, 4)
    x2, _ = b.batch(5, 4)
    assert (x1 == x2).all()
    assert not (Task(shape, 4).batch(5, 4)[0] == x1).all()


def test_resume_from_periodic_checkpoint_equals_uninterrupted(tmp_path: Path) -> None:
    code, straight, _ = _run(_config(tmp_path / "a", QOSFLOW_TOTAL_STEPS="20"))
    assert code == 0 and straight["steps"] == 20
    cfg = _config(tmp_path / "b", QOSFLOW_TOTAL_STEPS="20", QOSFLOW_CHECKPOINT_EVERY="7")
    _run(cfg)
    # pretend the run died after step 14: drop everything newer
    (cfg.checkpoint_dir / "ckpt-0000000020.qfck").unlink()
    code, resumed, events = _run(cfg)
    assert code == 0 and resumed["resumed_from"] == 14
    assert {
        "event": "resume",
        "path": str(cfg.checkpoint_dir / "ckpt-0000000014.qfck"),
        "step": 14,
    } in events
    assert resumed["loss"] == pytest.approx(straight["loss"], rel=1e-6)
    result = json.loads((cfg.checkpoint_dir / "result.json").read_text())
    assert result == resumed


def test_finished_run_resumes_to_done_without_training(tmp_path: Path) -> None:
    cfg = _config(tmp_path, QOSFLOW_TOTAL_STEPS="5")
    _, first, _ = _run(cfg)
    _, again, events = _run(cfg)
    assert again["resumed_from"] == 5 and again["loss"] == first["loss"]
    assert not [e for e in events if e["event"] == "checkpoint"]


def test_resume_false_discards_old_checkpoints(tmp_path: Path) -> None:
    _run(_config(tmp_path, QOSFLOW_TOTAL_STEPS="6", QOSFLOW_CHECKPOINT_EVERY="2"))
    code, result, events = _run(_config(tmp_path, QOSFLOW_TOTAL_STEPS="3", QOSFLOW_RESUME="false"))
    assert code == 0 and result["resumed_from"] is None and result["steps"] == 3
    assert events[0] == {"event": "discarded", "checkpoints": 3}


def test_checkpoints_of_another_run_are_refused(tmp_path: Path) -> None:
    _run(_config(tmp_path, QOSFLOW_TOTAL_STEPS="2"))
    with pytest.raises(TrainerError, match="belongs to another run"):
        TrainingJob(_config(tmp_path, QOSFLOW_TOTAL_STEPS="2", QOSFLOW_SEED="6")).run()
    with pytest.raises(TrainerError, match="beyond 1"):
        TrainingJob(_config(tmp_path, QOSFLOW_TOTAL_STEPS="1")).run()


def test_unwritable_progress_file_does_not_stop_training(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path, QOSFLOW_TOTAL_STEPS="3", ARGO_PROGRESS_FILE=str(tmp_path / "no" / "dir" / "p")
    )
    code, result, events = _run(cfg)
    assert code == 0 and result["steps"] == 3
    assert [e["event"] for e in events].count("progress_error") == 1


def test_a_run_removes_temp_files_of_killed_writers_and_says_so(tmp_path: Path) -> None:
    cfg = _config(tmp_path, QOSFLOW_TOTAL_STEPS="2")
    _run(cfg)
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    stale = [cfg.checkpoint_dir / f".ckpt-{s:010d}.qfck.{dead}.tmp" for s in (3, 4)]
    for path in stale:
        path.write_bytes(b"\0" * 1000)
    live = cfg.checkpoint_dir / f".ckpt-0000000005.qfck.{os.getppid()}.tmp"
    live.write_bytes(b"\0")
    code, _, events = _run(cfg)
    assert code == 0 and events[0] == {"event": "cleaned_temp", "files": 2, "bytes": 2000}
    assert not any(p.exists() for p in stale) and live.exists()
    _, _, events = _run(cfg)  # nothing stale left: no event
    assert "cleaned_temp" not in [e["event"] for e in events]
