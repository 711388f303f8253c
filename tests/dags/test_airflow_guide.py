"""docs/airflow.md "Add qosflow to an existing Airflow": its shell blocks run, in order, as written.

The blocks run in one ``bash -euo pipefail`` against a fresh local cluster (the guide starts it
with ``qosflow local up``) and an "existing" Airflow: a fresh ``AIRFLOW_HOME`` the test migrates
first, with nothing of the test session's Airflow settings. Only a block marked
``<!-- guide: not run -->`` is left out (the install into your environment; this one is the lock's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.beside, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "airflow.md"
SECTION = "## Add qosflow to an existing Airflow"
_BLOCK = re.compile(r"(<!-- guide: not run -->\n)?```bash\n(.*?)```", re.DOTALL)


def guide_blocks() -> list[str]:
    """The bash blocks of the guide section that the guide says to run, in order."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else None]
    return [body for skip, body in _BLOCK.findall(section) if not skip]


def _env(tmp: Path) -> dict[str, str]:
    """A shell's environment: the checkout's venv on PATH, a fresh AIRFLOW_HOME, nothing else of
    this test session's Airflow or qosflow settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "QOSFLOW_")) and k not in ("VIRTUAL_ENV", "KUBECONFIG")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["AIRFLOW_HOME"] = str(tmp / "airflow")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    env["MPLBACKEND"] = "Agg"
    return env


def test_the_guide_has_the_blocks_it_promises() -> None:
    blocks = guide_blocks()
    joined = "\n".join(blocks)
    assert len(blocks) >= 3
    for command in ("qosflow local up", "qosflow argo check", "airflow connections add"):
        assert command in joined
    assert "airflow dags test qosflow_nightly_retrain" in joined
    assert "pip install" not in joined  # the one block that is not run


def test_the_guide_runs_on_a_fresh_local_cluster(tmp_path: Path) -> None:
    env = _env(tmp_path)
    (tmp_path / "airflow" / "dags").mkdir(parents=True)
    (tmp_path / "dags").symlink_to(REPO / "dags")  # the guide copies from a checkout's dags/
    migrate = subprocess.run(
        ["airflow", "db", "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    script = "\n".join(guide_blocks())
    try:
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=780,
        )
    finally:
        subprocess.run(
            ["qosflow", "local", "down"], cwd=tmp_path, env=env, capture_output=True, timeout=120
        )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    up = (tmp_path / "local-up.txt").read_text()
    assert "PersistentVolumeClaim/qosflow-checkpoints: created (Bound" in up
    assert "WorkflowTemplate/qosflow-train: unchanged" in run.stdout  # the dry run after `up`
    assert "check passed" in run.stdout
    assert re.search(r"DagRun Finished: .*state=success", out), out[-6000:]
