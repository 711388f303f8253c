"""The pytest plugin: record the client's exchanges for the whole session, check them, report.

On by default (``tests/conftest.py`` loads it). ``QOSFLOW_CONTRACT=off`` or ``--no-contract``
turns it off for debugging. At the end of a session that recorded anything it prints

    contract: 412 requests (argo 230, kubernetes 182), 412 responses, 97 fields read on 31
    endpoints: 0 invalid

writes the details (per-endpoint counts and reads, every invalid case with the tests that made
it) to ``.qosflow/contract-report.json`` (``contract-report-kubernetes<N>.json`` when the
``kubernetes`` client is not the locked one, so ``make pytest-k8s36`` keeps its own), and fails
the session when anything was invalid or unmapped. A test that breaks the contract on purpose
says so with ``@pytest.mark.contract_exempt("why")``: its findings are listed apart and fail
nothing.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contract_recorder.ledger import Ledger
from contract_recorder.recorder import Patches, Recorder

OFF = ("0", "off", "no", "false")
SHOWN = 15


@dataclass
class State:
    """The plugin's state for one session."""

    recorder: Recorder
    patches: Patches
    ledger: Ledger
    report: dict[str, Any] | None = None
    path: Path | None = None


_STATE: State | None = None


def session_recorder() -> tuple[Recorder, Ledger] | None:
    """The session's recorder and ledger, or ``None`` when the plugin is off."""
    return (_STATE.recorder, _STATE.ledger) if _STATE is not None else None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-contract",
        action="store_true",
        help="do not record and check the client's Argo/Kubernetes exchanges",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _STATE
    config.addinivalue_line(
        "markers",
        "contract_exempt(reason): the test makes the client send or get what the contract forbids "
        "on purpose; its exchanges are reported apart and fail nothing",
    )
    if config.getoption("--no-contract", False):
        return
    if os.environ.get("QOSFLOW_CONTRACT", "on").strip().lower() in OFF:
        return
    recorder = Recorder()
    patches = Patches(recorder)
    patches.install()
    _STATE = State(recorder, patches, Ledger(recorder))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if _STATE is None:
        yield
        return
    marker = item.get_closest_marker("contract_exempt")
    _STATE.recorder.test = item.nodeid
    _STATE.recorder.exempt = str(marker.args[0] if marker and marker.args else "") or (
        "exempt" if marker else ""
    )
    yield
    _STATE.ledger.check_pending()
    _STATE.recorder.test, _STATE.recorder.exempt = "(between tests)", ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _STATE
    state = _STATE
    if state is None:
        return
    state.ledger.check_pending(final=True)
    state.patches.undo()
    _STATE = None
    if not state.ledger.checked:
        return
    report = state.ledger.report()
    state.report = report
    state.path = report_path(session.config.rootpath)
    state.path.parent.mkdir(parents=True, exist_ok=True)
    state.path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    session.config.stash[_REPORT] = state
    if report["invalid_count"] and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_REPORT = pytest.StashKey[State]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_REPORT, None)
    if state is None or state.report is None:
        return
    report = state.report
    write = terminalreporter.write_line
    if report["invalid"]:
        terminalreporter.section("contract violations", sep="=", red=True, bold=True)
        for case in report["invalid"][:SHOWN]:
            tests = ", ".join(case["tests"][:3]) + (" ..." if len(case["tests"]) > 3 else "")
            write(f"{case['endpoint']} [{case['where']}] x{case['count']}: {case['error']}")
            write(f"    e.g. {case['exchange']} in {tests}")
        if len(report["invalid"]) > SHOWN:
            write(f"... {len(report['invalid']) - SHOWN} more in {state.path}")
    write(report["summary"], red=bool(report["invalid_count"]), bold=True)
    write(report["not_validated"])
    if report["exempt"]:
        count = sum(case["count"] for case in report["exempt"])
        write(f"contract: {count} findings in tests marked contract_exempt (not failing)")
    write(f"contract: details in {state.path}")


def report_path(root: Path) -> Path:
    """``.qosflow/contract-report.json``, suffixed when the kubernetes client is not the locked one."""
    override = os.environ.get("QOSFLOW_CONTRACT_REPORT")
    if override:
        return Path(override)
    name = "contract-report.json"
    try:
        import kubernetes

        running = str(kubernetes.__version__)
        lock = (root / "uv.lock").read_text(encoding="utf-8")
        match = re.search(r'name = "kubernetes"\nversion = "([^"]+)"', lock)
        if match and match[1] != running:
            name = f"contract-report-kubernetes{running.split('.')[0]}.json"
    except (ImportError, OSError):
        pass
    return root / ".qosflow" / name
