"""The README's quickstart is the real example DAG's text, and its commands are the two set-up commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]


def test_readme_quickstart_snippet_is_taken_from_the_example_dag() -> None:
    readme = (ROOT / "README.md").read_text()
    source = (ROOT / "dags" / "qosflow_nightly_retrain.py").read_text()
    quickstart = readme.split("## Quickstart", 1)[1]
    block = re.findall(r"```python\n(.*?)```", quickstart, flags=re.S)[0]
    assert block in source
    assert "deadline_training(" in block


def test_readme_links_point_at_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?:docs|examples|dags|bench)/[^)#]+)\)", readme)
    assert targets
    assert [t for t in targets if not (ROOT / t).exists()] == []
