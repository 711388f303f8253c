"""``python -m qosflow_trainer.launch [--dry-run] <command...>``: one worker pod of a segment.

A multi-pod segment is a rendezvous daemon (``python -m qosflow_trainer.rendezvous``, an Argo
daemon step) and N worker pods that each run this launcher with the job's command, e.g.
``python -m qosflow_trainer.launch python -m qosflow_trainer --ddp`` or ``... python train.py
--lr 0.1``. The launcher turns the pod's environment into a torchrun command and runs it::

    torchrun --nnodes=$QOSFLOW_NNODES --nproc-per-node=$QOSFLOW_NPROC_PER_NODE
             --rdzv-backend=c10d --rdzv-endpoint=$QOSFLOW_RDZV_ENDPOINT --rdzv-id=$QOSFLOW_RDZV_ID
             --rdzv-conf=is_host=false[,join_timeout=..,last_call_timeout=..,close_timeout=..]
             --local-addr=$POD_IP --max-restarts=$QOSFLOW_MAX_RESTARTS [-m] <script or module> args

Every agent is a client of the daemon's store (``is_host=false``), so all worker pods are equal
and any of them may leave or join. The command must start with ``python`` or ``python3`` (torchrun
starts the Python processes itself): ``python -m MODULE args`` becomes ``-m MODULE args``,
``python SCRIPT args`` becomes ``SCRIPT args``; anything else is refused (exit 2).

Variables (each checked; an error names it and the launcher exits 2):

==================================  ========================================================
``QOSFLOW_NNODES``                  required: ``N`` pods, or ``MIN:MAX`` for an elastic segment
``QOSFLOW_NPROC_PER_NODE``          processes (ranks) per pod, default 1
``QOSFLOW_RDZV_ENDPOINT``           required: ``HOST:PORT`` of the rendezvous daemon
``QOSFLOW_RDZV_ID``                 required: the segment's id (letters, digits, ``._-``)
``POD_IP``                          this pod's address (``--local-addr``); unset: the host name
``QOSFLOW_MAX_RESTARTS``            default 0 for ``N``, 3 for ``MIN:MAX`` (a pod leaving costs one)
``QOSFLOW_RDZV_JOIN_TIMEOUT``       seconds to wait for the pods (torchrun's default 600)
``QOSFLOW_RDZV_LAST_CALL_TIMEOUT``  seconds to wait for more pods once MIN joined (default 30)
``QOSFLOW_RDZV_CLOSE_TIMEOUT``      seconds to wait for the round to close (default 30)
``GLOO_SOCKET_IFNAME``              passed on when set (gloo's network interface)
==================================  ========================================================

It also sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (torchrun's agents otherwise hung when a pod
joined a running segment) and ``OMP_NUM_THREADS`` to the pod's allowed CPUs per process.

Exit codes: the job's (``0`` done), ``75`` when the workers stopped after a checkpoint — also
when this pod was sent SIGTERM, which torchrun alone would report as an error (the workers mark a
checkpointed exit in ``$QOSFLOW_STOPPED_DIR``: :func:`~qosflow_trainer.preemption.mark_checkpointed_exit`),
``128 + signal`` when stopped before its workers checkpointed, ``1`` when the workers failed,
``2`` for a bad variable or command, PyTorch missing, or workers that all exited 2.

torchrun runs in this process (its entry point, ``torch.distributed.run.main``) rather than by
``exec``: the same agent and workers, and the launcher still sees how they ended.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qosflow_trainer.cpus import allowed_cpus
from qosflow_trainer.errors import TrainerError, missing_torch
from qosflow_trainer.preemption import (
    EXIT_CHECKPOINTED,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    STOPPED_DIR_ENV,
)

NNODES_ENV = "QOSFLOW_NNODES"
NPROC_ENV = "QOSFLOW_NPROC_PER_NODE"
ENDPOINT_ENV = "QOSFLOW_RDZV_ENDPOINT"
RDZV_ID_ENV = "QOSFLOW_RDZV_ID"
POD_IP_ENV = "POD_IP"
MAX_RESTARTS_ENV = "QOSFLOW_MAX_RESTARTS"
GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
TIMEOUT_ENVS = {
    "join_timeout": "QOSFLOW_RDZV_JOIN_TIMEOUT",
    "last_call_timeout": "QOSFLOW_RDZV_LAST_CALL_TIMEOUT",
    "close_timeout": "QOSFLOW_RDZV_CLOSE_TIMEOUT",
}
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
ELASTIC_MAX_RESTARTS = 3
"""Default restarts of an elastic (``MIN:MAX``) segment: each pod that leaves costs one."""

_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
_NNODES = re.compile(r"^(\d+)(?::(\d+))?$")
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(\d+)$")
_RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*$")


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What the launcher runs: torchrun's arguments and the variables set for it.

    Attributes:
        args: torchrun's command line, without ``torchrun`` itself.
        env: Variables set for torchrun and its workers (over the pod's environment).
        nproc_per_node: Processes per pod.
    """

    args: tuple[str, ...]
    env: dict[str, str]
    nproc_per_node: int

    def command(self) -> str:
        """The plan as one shell line: ``VAR=value ... torchrun args``."""
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        line = shlex.join(["torchrun", *self.args])
        return f"{assignments} {line}" if assignments else line


def script_args(command: Sequence[str]) -> list[str]:
    """The ``<script or -m module> args`` of torchrun, from the job's ``python ...`` command.

    Raises:
        TrainerError: Naming ``command``, for anything but ``python[3] SCRIPT|-m MODULE args``.
    """
    if not command:
        raise TrainerError("command", "missing: give the job's command, e.g. python train.py")
    if not _PYTHON.match(os.path.basename(command[0])):
        raise TrainerError(
            "command",
            f"must start with python or python3, since torchrun starts the Python processes "
            f"(got {shlex.join(command)!r})",
        )
    rest = list(command[1:])
    if rest[:1] == ["-m"]:
        if len(rest) < 2 or not rest[1] or rest[1].startswith("-"):
            raise TrainerError("command", f"python -m needs a module (got {shlex.join(command)!r})")
        return rest
    if not rest or rest[0].startswith("-"):
        raise TrainerError(
            "command",
            "after python comes a script or -m MODULE; interpreter options are not passed on "
            f"(got {shlex.join(command)!r})",
        )
    return rest


def parse_nnodes(text: str | None) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` as ``(min, max)``.

    Raises:
        TrainerError: Naming ``QOSFLOW_NNODES``.
    """
    match = _NNODES.match((text or "").strip())
    if text is None or not text.strip():
        raise TrainerError(NNODES_ENV, "is required (N, or MIN:MAX for an elastic segment)")
    low = int(match.group(1)) if match else 0
    high = int(match.group(2) or low) if match else 0
    if match is None or not 1 <= low <= high:
        raise TrainerError(NNODES_ENV, f"must be N or MIN:MAX with 1 <= MIN <= MAX (got {text!r})")
    return low, high


def _integer(environ: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise TrainerError(name, f"must be an integer (got {text!r})") from None
    if value < low:
        raise TrainerError(name, f"must be >= {low} (got {value})")
    return value


def _required(environ: Mapping[str, str], name: str, pattern: re.Pattern[str], rule: str) -> str:
    text = environ.get(name, "").strip()
    if not text:
        raise TrainerError(name, f"is required ({rule})")
    if not pattern.match(text):
        raise TrainerError(name, f"must be {rule} (got {text!r})")
    return text


def _endpoint(environ: Mapping[str, str]) -> str:
    text = _required(environ, ENDPOINT_ENV, _ENDPOINT, "HOST:PORT of the rendezvous daemon")
    port = int(text.rsplit(":", 1)[1])
    if not 1 <= port <= 65535:
        raise TrainerError(ENDPOINT_ENV, f"port must be in 1..65535 (got {port})")
    return text


def _pod_ip(environ: Mapping[str, str]) -> str | None:
    text = environ.get(POD_IP_ENV, "").strip()
    if not text:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise TrainerError(POD_IP_ENV, f"must be an IP address (got {text!r})") from None


def _rdzv_conf(environ: Mapping[str, str]) -> str:
    conf = ["is_host=false"]
    for key, name in TIMEOUT_ENVS.items():
        seconds = _integer(environ, name, None, 1)
        if seconds is not None:
            conf.append(f"{key}={seconds}")
    return ",".join(conf)


def _env(environ: Mapping[str, str], nproc: int, cpus: int) -> dict[str, str]:
    env = {SHARE_STORE_ENV: "1", "OMP_NUM_THREADS": str(max(1, cpus // nproc))}
    if GLOO_IFNAME_ENV in environ:
        ifname = environ[GLOO_IFNAME_ENV].strip()
        if not _IFNAME.match(ifname):
            raise TrainerError(
                GLOO_IFNAME_ENV, f"must be interface names, comma-separated (got {ifname!r})"
            )
        env[GLOO_IFNAME_ENV] = ifname
    return env


def plan(command: Sequence[str], environ: Mapping[str, str], *, cpus: int) -> LaunchPlan:
    """The torchrun command for this pod.

    Args:
        command: The job's command (``python ...``).
        environ: The pod's environment.
        cpus: CPUs the pod may use (:func:`~qosflow_trainer.allowed_cpus`).

    Raises:
        TrainerError: Naming the first invalid variable, or ``command``.
    """
    low, high = parse_nnodes(environ.get(NNODES_ENV))
    nproc = _integer(environ, NPROC_ENV, 1, 1) or 1
    endpoint = _endpoint(environ)
    rdzv_id = _required(environ, RDZV_ID_ENV, _RDZV_ID, "letters, digits and ._- (128 at most)")
    pod_ip = _pod_ip(environ)
    restarts = _integer(environ, MAX_RESTARTS_ENV, ELASTIC_MAX_RESTARTS if low < high else 0, 0)
    args = [
        f"--nnodes={low}" if low == high else f"--nnodes={low}:{high}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf={_rdzv_conf(environ)}",
        *([f"--local-addr={pod_ip}"] if pod_ip else []),
        f"--max-restarts={restarts}",
        *script_args(command),
    ]
    return LaunchPlan(tuple(args), _env(environ, nproc, cpus), nproc)


def exit_for_failed_workers(codes: Collection[int]) -> int:
    """The launcher's code when torchrun gave up on failed workers (their exit codes).

    ``75`` when every failed worker exited 75 (the ranks stopped together after rank 0's
    checkpoint, e.g. because another pod was told to stop); ``2`` when every one exited 2 (a bad
    configuration: retrying will not help); else ``1``.
    """
    if codes and set(codes) in ({EXIT_CHECKPOINTED}, {EXIT_USAGE}):
        return next(iter(codes))
    return EXIT_ERROR


def exit_for_signal(signum: int, stopped_dir: Path, nproc: int) -> int:
    """The launcher's code after torchrun forwarded a stop signal to its workers and ended.

    ``75`` when every local worker marked a checkpointed exit in ``stopped_dir``; else
    ``128 + signum`` (stopped before anything was saved, like a process killed by the signal).
    """
    marked = all((stopped_dir / f"local-rank-{i}").is_file() for i in range(nproc))
    return EXIT_CHECKPOINTED if marked else 128 + signum


def run_torchrun(launch: LaunchPlan) -> int:
    """Run torchrun in this process with the plan's arguments and variables; the exit code."""
    try:
        from torch.distributed.elastic.multiprocessing import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun_main
    except ImportError:
        raise missing_torch("python -m qosflow_trainer.launch") from None
    stopped_dir = Path(tempfile.mkdtemp(prefix="qosflow-launch-"))
    os.environ.update({**launch.env, STOPPED_DIR_ENV: str(stopped_dir)})
    try:
        torchrun_main(list(launch.args))
    except ChildFailedError as exc:
        return exit_for_failed_workers([f.exitcode for f in exc.failures.values()])
    except SignalException as exc:
        return exit_for_signal(int(exc.sigval), stopped_dir, launch.nproc_per_node)
    finally:
        shutil.rmtree(stopped_dir, ignore_errors=True)
    return EXIT_OK


def _split(argv: Sequence[str]) -> tuple[bool, list[str]]:
    dry_run = False
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option == "--":
            break
        if option != "--dry-run":
            raise TrainerError("launch", f"unknown option {option!r} (only --dry-run, or --)")
        dry_run = True
    return dry_run, rest


USAGE = (
    "usage: python -m qosflow_trainer.launch [--dry-run] [--] python (-m MODULE | SCRIPT) [args]\n"
    "Runs the job's command under torchrun, configured by QOSFLOW_NNODES, "
    "QOSFLOW_NPROC_PER_NODE,\nQOSFLOW_RDZV_ENDPOINT, QOSFLOW_RDZV_ID, POD_IP, QOSFLOW_MAX_RESTARTS "
    "(see the module docstring).\n"
)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Check the environment and the command, then print (``--dry-run``) or run torchrun."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return EXIT_OK
    try:
        dry_run, command = _split(args)
        launch = plan(command, os.environ if environ is None else environ, cpus=allowed_cpus())
        if dry_run:
            sys.stdout.write(launch.command() + "\n")
            return EXIT_OK
        return run_torchrun(launch)
    except TrainerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
