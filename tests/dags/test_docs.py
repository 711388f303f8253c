from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_snippet_is_taken_from_the_real_example_dag():
    doc = (ROOT / "docs" / "airflow.md").read_text()
    source = (ROOT / "dags" / "qosflow_nightly_retrain.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/airflow.md has no python snippet"
    assert blocks[0] in source
    assert "deadline_training(" in blocks[0]
