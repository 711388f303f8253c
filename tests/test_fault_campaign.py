"""The fault campaign of issue 15 (``bench/fault_campaign.py``) in its quick mode: every scenario
runs and every acceptance key has its target value."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "bench" / "fault_campaign.py"
TARGETS = {
    "duplicates": "0",
    "steps_lost_beyond_checkpoint": "0",
    "poisoned_controller": "0",
    "token_leaks": "0",
    "tracebacks": "0",
    "retry_covers_long_segments": "true",
}


@pytest.mark.slow
@pytest.mark.beside  # every scenario has its own time bound, far above what load adds
@pytest.mark.timeout(900)
def test_the_quick_campaign_finds_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, str(CAMPAIGN), "--quick"],
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    lines = dict(re.findall(r"(?m)^([a-z0-9_]+): (.*)$", proc.stdout))
    assert {k: lines.get(k) for k in TARGETS} == TARGETS, proc.stderr[-4000:]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(lines["scanned_files"]) > 0 and int(lines["pod_envs_scanned"]) > 0
    assert int(lines["bad_workflows_refused"]) > 0 and int(lines["faults_injected"]) > 0
