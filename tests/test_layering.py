"""The import contract, checked mechanically in the test run as well as by `make contracts`."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"airflow", "hera", "kubernetes"}
CORE = Path(__file__).resolve().parents[1] / "src" / "qosflow"


def test_core_never_imports_airflow_hera_or_kubernetes() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
    assert len(list(CORE.rglob("*.py"))) >= 3


def test_the_cli_loads_no_airflow_hera_or_kubernetes() -> None:
    import subprocess
    import sys

    code = (
        "import sys, qosflow.cli; qosflow.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'airflow', 'hera', 'kubernetes'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
