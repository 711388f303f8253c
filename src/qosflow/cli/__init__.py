"""The ``qosflow`` command line.

Subcommands:

* ``plan JOB.yaml --cluster CLUSTER.yaml [--now ISO] [--history URL]`` — admission verdict, initial
  size, median and conservative finish, and the deadline-derived schedule;
* ``replay JOB.yaml PROGRESS.csv`` — feed a progress log (time, steps, units) through the decision
  function and print each decision with its reason;
* ``local up|down`` — the embedded local cluster (``qosflow.local``);
* ``simulate`` / ``bound`` — the trace-driven simulator and the offline upper bound (``qosflow.sim``);
* ``argo render|install|check`` — the install manifests, installing them, checking a cluster
  (:mod:`qosflow.cli.argo`; needs the ``argo`` extra).

Exit codes (:data:`EXIT_CODES`): ``plan`` exits 0 when the deadline is guaranteed, 3 when the job
would run best-effort, 4 when it is rejected; every command exits 2 on bad input (a spec, a file,
a flag) and 1 on an unexpected error, each with one line on stderr starting ``error:`` — never a
traceback (``QOSFLOW_TRACEBACK=1`` shows the traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qosflow.cli import argo as argo_commands
from qosflow.cli import sim_commands
from qosflow.cli.files import read_spec, spec_or_file
from qosflow.core.cluster_spec import ClusterSpec, load_cluster
from qosflow.core.errors import QosflowError, SpecError
from qosflow.core.spec import JobSpec, load_job
from qosflow.core.words import duration, instant

if TYPE_CHECKING:
    from qosflow.core.planning import Plan

Handler = Callable[[argparse.Namespace], int]


EXIT_GUARANTEED, EXIT_UNEXPECTED, EXIT_BAD_INPUT, EXIT_BEST_EFFORT, EXIT_REJECTED = 0, 1, 2, 3, 4
EXIT_CODES = {
    "guaranteed": EXIT_GUARANTEED,
    "best_effort": EXIT_BEST_EFFORT,
    "rejected": EXIT_REJECTED,
}
"""``qosflow plan``'s exit code per verdict: a script can tell a promise from a refusal."""
ERRORS_EPILOG = """\
  2  bad input: a spec, a file or a flag; one "error: <field>: <rule>" line on stderr
  1  an unexpected error (a bug): one "error:" line; QOSFLOW_TRACEBACK=1 shows the traceback"""
PLAN_EPILOG = f"""\
exit codes:
  0  guaranteed: the deadline is promised
  3  best effort: the job runs, without a promise
  4  rejected: the job would not run (if_not_guaranteed: reject)
{ERRORS_EPILOG}"""
REPLAY_EPILOG = f"""\
exit codes:
  0  the log was replayed
{ERRORS_EPILOG}"""


def _parse_now(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise SpecError("--now", f"must be an ISO-8601 instant (got {text!r})") from None
    if moment.tzinfo is None:
        raise SpecError("--now", f"must be timezone-aware (got {text!r})")
    return moment


def _plan(args: argparse.Namespace) -> int:
    from qosflow.core.planning import plan_job

    now = _parse_now(args.now)
    job = load_job(read_spec(args.job), now=now)
    cluster = load_cluster(spec_or_file(args.cluster, "cluster spec"))
    refusal = cluster.refusal(job)
    if refusal is not None:
        raise refusal
    prior, calibration, history, timings = None, None, [], []
    if args.history:
        from qosflow.core.prior import prior_of
        from qosflow.store.history import HistoryStore

        store = HistoryStore(args.history)
        history = store.history(job.key, job.resources.unit)
        prior = prior_of(history, job.resources.per_node, now=now.timestamp())
        calibration = store.calibration(job.key)
        timings = store.timings(job.key, job.resources.unit)
    result = plan_job(
        job,
        capacity=cluster.total_units,
        now=now.timestamp(),
        prior=prior,
        calibration=calibration,
        history=history,
        timings=timings,
    )
    _print_plan(Console(width=max(Console().width, 110)), job, cluster, result)
    return EXIT_CODES[result.verdict.kind]


def _print_plan(console: Console, job: JobSpec, cluster: ClusterSpec, result: Plan) -> None:
    """The verdict with its reason, the first size and finish times, and the schedule."""
    verdict = result.verdict
    style = {"guaranteed": "green", "best_effort": "yellow", "rejected": "red"}[verdict.kind]
    console.print(f"[bold]{job.name}[/]: [{style}]{verdict.kind}[/] — {escape(verdict.reason)}")
    if verdict.counter_offer is not None:
        console.print(f"counter-offer: a deadline of {instant(verdict.counter_offer)} would pass")
    table = Table(
        title=f"plan for {job.name} on {cluster.nodes}x{cluster.units_per_node} {cluster.unit}"
    )
    for col in (
        "initial size",
        "median finish",
        "conservative finish",
        "deadline",
        "priority class",
    ):
        table.add_column(col, no_wrap=True)
    pred = result.prediction
    table.add_row(
        f"{verdict.units} {job.resources.unit}",
        instant(pred.median_finish),
        instant(pred.conservative_finish),
        instant(job.deadline),
        result.priority_class,
    )
    console.print(table)
    if not result.schedule:
        console.print("no schedule yet: it is derived from the measured speed")
        return
    sched = Table(title="deadline-derived schedule (steps that must be done by then)")
    sched.add_column("time")
    sched.add_column("steps", justify="right")
    for when, steps in result.schedule:
        sched.add_row(instant(when), str(steps))
    console.print(sched)


def _read_progress(path: Path, job: JobSpec) -> list[tuple[float, int, int]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SpecError("", f"cannot read progress log {str(path)!r}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            rows = _progress_rows(path, reader, job)
        except UnicodeDecodeError:
            raise SpecError(
                str(path), "is not a text file: a progress log is CSV in UTF-8"
            ) from None
        except csv.Error as exc:
            raise SpecError(f"{path}:{reader.line_num}", f"not valid CSV: {exc}") from None
    if not rows:
        raise SpecError(str(path), "has no progress rows")
    return rows


def _progress_rows(
    path: Path, reader: csv.DictReader[str], job: JobSpec
) -> list[tuple[float, int, int]]:
    rows: list[tuple[float, int, int]] = []
    missing = {"time", "steps", "units"} - set(reader.fieldnames or [])
    if missing:
        raise SpecError(
            f"{path}:1",
            f"header must have columns time, steps, units (missing {sorted(missing)})",
        )
    for line, row in enumerate(reader, start=2):
        when, steps, units = _progress_row(path, line, row, job)
        if rows and when < rows[-1][0]:
            raise SpecError(
                f"{path}:{line}:time", f"must not go back in time (got {row['time']!r})"
            )
        rows.append((when, steps, units))
    return rows


def _progress_row(
    path: Path, line: int, row: dict[str, str], job: JobSpec
) -> tuple[float, int, int]:
    where = f"{path}:{line}"
    short = [c for c in ("time", "steps", "units") if row.get(c) is None]
    if short:
        raise SpecError(
            f"{where}:{short[0]}", "is missing: the row has fewer columns than the header"
        )
    text = row["time"]
    try:
        when = job.submitted_at + float(text)
    except (TypeError, ValueError):
        try:
            when = _parse_now(str(text)).timestamp()
        except SpecError:
            raise SpecError(
                f"{where}:time",
                f"must be seconds since submission or an ISO instant (got {text!r})",
            ) from None
    values: list[int] = []
    for column in ("steps", "units"):
        try:
            values.append(int(row[column]))
        except (TypeError, ValueError):
            raise SpecError(
                f"{where}:{column}", f"must be an integer (got {row[column]!r})"
            ) from None
    if not math.isfinite(when):
        raise SpecError(f"{where}:time", f"must be a finite number (got {text!r})")
    if values[0] < 0 or values[1] < 1:
        raise SpecError(where, f"steps must be >= 0 and units >= 1 (got {values[0]}, {values[1]})")
    return when, values[0], values[1]


def _replay(args: argparse.Namespace) -> int:
    from qosflow.core.planning import replay_progress

    if args.free_units < 0 or args.every < 1:
        raise SpecError(
            "--free-units/--every", f"must be >= 0 and >= 1 (got {args.free_units}, {args.every})"
        )
    job = load_job(read_spec(args.job), now=_parse_now(args.now))
    rows = _read_progress(Path(args.progress), job)
    console = Console(width=max(Console().width, 120))
    table = Table(title=f"replay of {job.name}: {len(rows)} progress reports")
    for col in ("since submission", "steps", "units", "decision", "target", "reason"):
        table.add_column(col, overflow="fold")
    for step in replay_progress(job, rows, free_units=args.free_units, every=args.every):
        d = step.decision
        table.add_row(
            duration(step.time - job.submitted_at),
            str(step.steps),
            str(step.units),
            d.action.value,
            str(d.units),
            escape(d.reason),
        )
    console.print(table)
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``error:`` line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: <prog>: <message>`` on stderr and exit 2 (no usage block)."""
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = _Parser(
        prog="qosflow", description="Deadline-driven training: plan, replay, simulate."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser(
        "plan",
        help="admission verdict, initial size, finish times and schedule of a job",
        description="Plan a job on a cluster: the verdict, the first size, the finish times.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("job", help="job spec (YAML or JSON)")
    plan.add_argument(
        "--cluster", required=True, help="cluster spec (YAML/JSON) or NODESxUNITS like 4x8"
    )
    plan.add_argument("--now", help="submission instant (ISO-8601 with timezone); default: now")
    plan.add_argument("--history", help="history store SQLAlchemy URL (observed step times)")
    plan.set_defaults(func=_plan)

    replay = sub.add_parser(
        "replay",
        help="replay a progress log through the decision function",
        description="Feed a progress log through the decision function, one decision a report.",
        epilog=REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("job", help="job spec (YAML or JSON)")
    replay.add_argument(
        "progress", help="CSV with columns time (s since submission or ISO), steps, units"
    )
    replay.add_argument("--now", help="submission instant (ISO-8601); default: now")
    replay.add_argument(
        "--free-units", type=int, default=0, help="units free beyond the job's own (default 0)"
    )
    replay.add_argument(
        "--every", type=int, default=1, help="decide at every Nth report (default 1)"
    )
    replay.set_defaults(func=_replay)

    argo_commands.add_subcommands(sub)

    try:
        local = importlib.import_module("qosflow.local.cli")
    except ImportError:  # pragma: no cover - optional parts not built into this install
        pass
    else:
        local.add_subcommands(sub, on_up=argo_commands.install_on_local)
    sim_commands.add_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; the exit code says how it went (:data:`EXIT_CODES`, module docstring).

    Bad input is exit code 2 and an unexpected error exit code 1, each with one ``error:`` line
    on stderr; ``QOSFLOW_TRACEBACK=1`` lets an unexpected error end in its traceback instead.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Any = args.func
    try:
        code = int(func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except QosflowError as exc:  # one line, even when a driver's message has several
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # pragma: no cover
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # pragma: no cover - `qosflow plan ... | head`: the reader left
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE, like any other command in a pipe
    except Exception as exc:  # a bug: said in one line, the traceback on request
        if os.environ.get("QOSFLOW_TRACEBACK"):
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {_one_line(str(exc))} (a bug in qosflow: "
            "please report it with the command; QOSFLOW_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED


def _one_line(message: str) -> str:
    return " ".join(part for line in message.splitlines() if (part := line.strip()))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
