"""Run ``qosflow ARGS`` in this process, as a shell would see it (exit code, stdout, stderr).

Starting an interpreter per call (and importing numpy and scipy again) cost the CLI tests about
1.5 s a call; ``tests/test_wheel.py`` still runs the installed ``qosflow`` command for real.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import traceback
from pathlib import Path


def qosflow(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``qosflow ARGS`` in ``cwd``: the exit code and both streams as a run's.

    An exception that escapes ``main`` is written to stderr as the interpreter would (exit 1).
    """
    from qosflow.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.chdir(cwd or Path.cwd()),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["qosflow", *args], code, out.getvalue(), err.getvalue())
