"""Wheels that stand alone: build them, install them in clean venvs, run them outside the repo.

The wheels are built the way a release is (``uv build``: an sdist, then the wheel from that
sdist): ``qosflow`` and the small ``qosflow-trainer`` it depends on (the helpers that go into
training images; numpy only). ``qosflow`` is installed with its ``argo`` extra into a fresh
``python -m venv`` (dependencies from pip's configured index, the trainer from the built file),
and ``qosflow plan``, ``qosflow simulate`` (on a packaged trace) and
``qosflow argo render --out`` run from a temporary working directory with ``$QOSFLOW_SHARED``
pointing nowhere, so nothing may come from the checkout or from ``../shared``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.beside, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
DATA = "qosflow/sim/data/elasticflow"
SCHEDULER = f"{DATA}/pkusys-ElasticFlow/ElasticFlow/scheduler"
MANIFESTS = ("workflow-template.yaml", "priority-classes.yaml", "rbac.yaml")
JOB = """\
name: wheel-smoke
total_steps: 600
deadline: "2026-11-30T06:00:00+00:00"
resources:
  unit: cpu
  min: 1
  max: 2
  per_node: 1
  memory_per_unit: 1Gi
checkpoint_every_steps: 50
step_seconds_estimate: 2.0
"""


def _uv() -> str:
    found = shutil.which("uv") or str(REPO / ".uv" / "bin" / "uv")
    assert Path(found).is_file(), "uv not found on PATH nor in .uv/bin (run `make uv`)"
    return found


def _env(tmp: Path) -> dict[str, str]:
    """The caller's environment without anything that points into the checkout's venv."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["QOSFLOW_SHARED"] = str(tmp / "no-shared-here")
    env["MPLBACKEND"] = "Agg"
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = _env(out)
    _run([_uv(), "build", "--quiet", "--out-dir", str(out), str(REPO)], out, env, 300)
    _run([_uv(), "build", "--quiet", "--out-dir", str(out), str(REPO / "trainer")], out, env, 300)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (built,) = dist.glob("qosflow-*.whl")
    return built


@pytest.fixture(scope="module")
def trainer_wheel(dist: Path) -> Path:
    (built,) = dist.glob("qosflow_trainer-*.whl")
    return built


def _venv(root: Path) -> tuple[Path, list[str]]:
    """A fresh venv under ``root`` and its ``pip install`` command."""
    _run([sys.executable, "-m", "venv", str(root / "venv")], root, _env(root), 120)
    python = root / "venv" / "bin" / "python"
    return root / "venv", [str(python), "-m", "pip", "install", "--quiet"]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("venv")
    path, pip = _venv(root)
    _run([*pip, "--find-links", str(wheel.parent), f"{wheel}[argo]"], root, _env(root), 600)
    yield path


def test_the_trainer_wheel_installs_with_numpy_only_and_runs(
    trainer_wheel: Path, tmp_path: Path
) -> None:
    path, pip = _venv(tmp_path)
    _run([*pip, str(trainer_wheel)], tmp_path, _env(tmp_path), 600)
    listed = _run([str(path / "bin" / "python"), "-m", "pip", "list"], tmp_path, _env(tmp_path), 60)
    names = {line.split()[0].lower() for line in listed.splitlines()[2:] if line.strip()}
    assert names - {"pip", "setuptools", "wheel"} == {"numpy", "qosflow-trainer"}
    env = {**_env(tmp_path), "ARGO_PROGRESS_FILE": str(tmp_path / "progress")}
    ckpt = str(tmp_path / "ckpt")
    run = [str(path / "bin" / "python"), "-m", "qosflow_trainer", "--steps", "12", "--width", "16"]
    out = _run([*run, "--checkpoint-dir", ckpt, "--checkpoint-every", "5"], tmp_path, env, 120)
    assert '"event": "done"' in out and '"steps": 12' in out
    assert (tmp_path / "progress").read_text().strip().splitlines()[-1] == "12/12"
    helpers = (
        "from qosflow_trainer import allowed_cpus, install_checkpoint_handler, report_progress"
    )
    _run(
        [str(path / "bin" / "python"), "-c", f"{helpers}; print(allowed_cpus())"], tmp_path, env, 60
    )


def test_the_wheel_holds_the_example_dags_the_tables_and_the_licences(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for dag in ("qosflow_nightly_retrain.py", "qosflow_multi_tenant.py"):
        assert f"qosflow_airflow/example_dags/{dag}" in names
        shipped = zipfile.ZipFile(wheel).read(f"qosflow_airflow/example_dags/{dag}")
        assert shipped == (REPO / "dags" / dag).read_bytes()
    for gpu, model in (("A100", "bert"), ("A100", "resnet50"), ("T4", "yolov3")):
        assert f"{SCHEDULER}/throughputs_{gpu}/{model}.csv" in names
    assert f"{SCHEDULER}/cluster_specs/n16g8.csv" in names
    assert f"{DATA}/pkusys-ElasticFlow/LICENCE" in names
    assert f"{DATA}/microsoft-elasticflow-traces/LICENSE" in names
    assert "qosflow_argo/schemas/schema.json" in names
    assert "qosflow_argo/schemas/LICENSE.argo-workflows.txt" in names
    data = sum(
        i.file_size for i in zipfile.ZipFile(wheel).infolist() if i.filename.startswith(DATA)
    )
    assert data < 1_000_000  # only the small traces; the large cluster traces stay in shared/


def test_the_installed_cli_plans_simulates_and_renders_outside_the_repo(
    venv: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.yaml").write_text(JOB, encoding="utf-8")
    qosflow = str(venv / "bin" / "qosflow")
    now = "2026-11-29T22:00:00+00:00"

    plan = _run([qosflow, "plan", "job.yaml", "--cluster", "2x1", "--now", now], work, env, 120)
    assert "wheel-smoke" in plan

    sim = [qosflow, "simulate", "--trace", "100jobs_1500lam", "--cluster", "16x8", "--slot", "240"]
    _run(
        [*sim, "--policies", "edf-elastic,elasticflow", "--no-bound", "--out", "sim"],
        work,
        env,
        180,
    )
    assert (work / "sim" / "results.csv").read_text().count("\n") == 3  # header + two policies

    _run([qosflow, "argo", "render", "--out", str(tmp_path / "rendered")], work, env, 120)
    for name in MANIFESTS:
        assert (tmp_path / "rendered" / name).read_text().startswith("# Generated by")
    check = [qosflow, "argo", "render", "--check", "--out", str(tmp_path / "rendered")]
    _run(check, work, env, 120)
    site = Path(_run([str(venv / "bin" / "python"), "-c", SITE], work, env, 60).strip())
    assert not [p for name in MANIFESTS for p in site.rglob(name)]  # nothing in site-packages


SITE = "import qosflow_argo, pathlib; print(pathlib.Path(qosflow_argo.__file__).parents[1])"


def test_the_installed_demo_and_simulator_find_the_packaged_data(
    venv: Path, tmp_path: Path
) -> None:
    code = (
        "import qosflow_airflow.demo as d, qosflow.sim.trace as t\n"
        "assert d.DAGS.name == 'example_dags', d.DAGS\n"
        "assert (d.DAGS / 'qosflow_nightly_retrain.py').is_file()\n"
        "assert 'site-packages' in str(d.DAGS), d.DAGS\n"
        "assert len(t.load_throughputs('A100').curves) > 0\n"
        "assert len(t.load_throughputs('T4').curves) > 0\n"
        "assert t.load_cluster_spec('n16g8').total == 128\n"
        "assert len(t.load_trace('195job')) == 195\n"
    )
    _run([str(venv / "bin" / "python"), "-c", code], tmp_path, _env(tmp_path), 60)
