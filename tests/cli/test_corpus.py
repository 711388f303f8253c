"""The CLI tells the truth: every spec in ``corpus/`` gives its exit code and its message.

Each file says what ``qosflow plan`` must do with it in its leading comments::

    # expect: 2 error: total_step: is not a known field; did you mean total_steps?
    # args: --cluster 8x4 --now 2026-11-29T22:00:00+00:00

``expect`` is the exit code (0 guaranteed, 3 best effort, 4 rejected, 2 bad input) and a
substring of what it prints; ``args`` replaces the default ``--cluster 4x8 --now NOW`` (paths are
relative to ``corpus/``). A file that cannot carry a comment (JSON) has its lines in
``NAME.expect`` beside it. Whatever the file holds, no run prints a traceback, and bad input is
exactly one ``error:`` line on stderr.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from in_process import qosflow

CORPUS = Path(__file__).resolve().parent / "corpus"
NOW = "2026-11-29T22:00:00+00:00"
DEFAULT_ARGS = ("--cluster", "4x8", "--now", NOW)


@dataclass(frozen=True)
class Case:
    """One corpus file and what ``qosflow plan`` must do with it."""

    path: Path
    code: int
    message: str
    args: tuple[str, ...]


def _case(path: Path) -> Case:
    source = path.with_name(path.name + ".expect") if path.suffix == ".json" else path
    head = source.read_bytes().decode("utf-8", errors="replace").splitlines()
    fields = dict(
        line[2:].split(": ", 1) for line in head if line.startswith(("# expect: ", "# args: "))
    )
    assert "expect" in fields, f"{source.name}: no '# expect: CODE MESSAGE' line"
    code, message = fields["expect"].split(" ", 1)
    args = tuple(shlex.split(fields["args"])) if "args" in fields else DEFAULT_ARGS
    return Case(path, int(code), message, args)


CASES = [_case(p) for p in sorted(CORPUS.iterdir()) if p.is_file() and p.suffix != ".expect"]


@pytest.mark.parametrize("case", CASES, ids=[c.path.name for c in CASES])
def test_each_spec_gets_its_exit_code_and_message_and_never_a_traceback(case: Case) -> None:
    proc = qosflow("plan", case.path.name, *case.args, cwd=CORPUS)
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said
    assert proc.returncode == case.code, said
    if case.code == 2:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        assert proc.stdout == ""
    else:
        assert proc.stderr == ""
    assert case.message in " ".join(said.split()), said  # the console wraps long lines


def test_the_corpus_covers_every_verdict_and_many_bad_inputs() -> None:
    codes = [c.code for c in CASES]
    assert len(CASES) >= 40
    assert {0, 2, 3, 4} <= set(codes)
    assert codes.count(2) >= 40


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ("missing.yaml", "error: cannot read job spec file 'missing.yaml': No such file"),
        ("clusters", "error: cannot read job spec file 'clusters': Is a directory"),
    ],
)
def test_a_missing_file_or_a_directory_is_bad_input(job: str, message: str) -> None:
    proc = qosflow("plan", job, *DEFAULT_ARGS, cwd=CORPUS)
    assert proc.returncode == 2 and proc.stderr.strip() == proc.stderr.strip().splitlines()[0]
    assert proc.stderr.startswith(message)


def test_the_exit_codes_are_in_the_help() -> None:
    for command in ("plan", "replay"):
        proc = qosflow(command, "--help")
        assert proc.returncode == 0
        assert "exit codes:" in proc.stdout and "2  bad input" in proc.stdout
    plan = qosflow("plan", "--help").stdout
    for line in ("0  guaranteed", "3  best effort", "4  rejected", "1  an unexpected error"):
        assert line in plan
