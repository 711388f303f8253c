"""The house rules, checked mechanically (import-linter checks the package layers in `make check`).

* the core is pure: no I/O, wall clock, threads, processes or SQL;
* no module imports another module's ``_private`` names;
* modules stay at most 500 lines and functions at most 80;
* ``import qosflow_trainer`` loads the standard library only (the helpers go into users' images).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "src", ROOT / "trainer", ROOT / "operators", ROOT / "argo_templates"]
CORE = ROOT / "src" / "qosflow" / "core"
IMPURE = {
    "time",
    "threading",
    "socket",
    "subprocess",
    "multiprocessing",
    "sqlite3",
    "sqlalchemy",
    "requests",
    "urllib",
    "http",
    "asyncio",
    "shutil",
    "tempfile",
    "pathlib",
    "airflow",
    "hera",
    "kubernetes",
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules(*roots: Path) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def imported(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node, node.module


def test_the_core_does_no_io_reads_no_clock_and_starts_no_thread() -> None:
    offenders = []
    for path, tree in modules(CORE):
        for _, name in imported(tree):
            if name.split(".")[0] in IMPURE:
                offenders.append(f"{path.name} imports {name}")
        for node in ast.walk(tree):
            call = node.func if isinstance(node, ast.Call) else None
            if isinstance(call, ast.Name) and call.id == "open":
                offenders.append(f"{path.name}:{node.lineno} calls open()")
            if isinstance(call, ast.Attribute) and call.attr in ("now", "utcnow", "today"):
                offenders.append(f"{path.name}:{node.lineno} reads the clock ({call.attr}())")
    assert offenders == []
    assert len(list(CORE.glob("*.py"))) >= 10


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = []
    for path, tree in modules(*SOURCES):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qos"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private and not a_dunder(private):
                    offenders.append(f"{path.relative_to(ROOT)}: {node.module} {private}")
    assert offenders == []


def a_dunder(names: list[str]) -> bool:
    return all(n.startswith("__") and n.endswith("__") for n in names)


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for path, tree in modules(*SOURCES):
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}: {node.name}() {span} lines")
    assert too_long == []


def _loaded(setup: str, which: str) -> list[str]:
    """The modules ``setup`` leaves loaded in a fresh interpreter for which ``which`` (of ``m``) holds."""
    code = f"import sys\n{setup}\nprint(sorted(m for m in sys.modules if {which}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = ast.literal_eval(out.stdout.strip())
    return loaded


def test_importing_the_trainer_helpers_loads_only_the_standard_library() -> None:
    mine = "sys.stdlib_module_names | {'__main__', 'qosflow_trainer'}"
    assert _loaded("import qosflow_trainer", f"m.split('.')[0] not in {mine}") == []


CLI = "import qosflow.cli; qosflow.cli.build_parser()"


def test_the_cli_loads_no_airflow_hera_or_kubernetes() -> None:
    assert _loaded(CLI, "m.split('.')[0] in {'airflow', 'hera', 'kubernetes'}") == []


def test_the_cli_loads_the_simulator_and_scipy_only_to_simulate() -> None:
    # about a second of every other command's start (`qosflow --help`, `argo check`, `local up`)
    which = "m.split('.')[0] == 'scipy' or m.startswith(('qosflow.sim', 'qosflow.cli.simulate'))"
    assert _loaded(CLI, which) == []
