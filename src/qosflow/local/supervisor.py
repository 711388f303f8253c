"""The pod supervisor: a tiny process between the local cluster and each container.

Every container runs under ``python -I -S -c SHIM <cores> <cgroup.procs> <exit file> <argv...>``.
The supervisor pins itself to the pod's cores and joins its cgroup (the container inherits both),
forks and execs the container, forwards SIGTERM and SIGINT to it, waits for it, and writes its exit
code (``128 + signal`` when a signal killed it) atomically to ``<pod dir>/.exit_code`` before
exiting with the same code. It is the container runtime's ``shim`` in a real node: the server can
die and restart without losing what happened to its containers. A container still running after a
restart is re-adopted (same pid and start time, :func:`process_alive`); one that ended meanwhile
left its exit code in the file (:func:`read_exit_code`).

The supervisor is the session and process-group leader, so SIGKILL to the group ends both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

EXIT_FILE = ".exit_code"
PID_FILE = ".pid"

SHIM = """
import os,signal,sys
cores,procs,exit_file,argv=sys.argv[1],sys.argv[2],sys.argv[3],sys.argv[4:]
child=0
pending=[]
def forward(signum,frame):
    if child:
        try:
            os.kill(child,signum)
        except OSError:
            pass
    else:
        pending.append(signum)
signal.signal(signal.SIGTERM,forward)
signal.signal(signal.SIGINT,forward)
os.sched_setaffinity(0,[int(c) for c in cores.split(',')])
if procs:
    try:
        with open(procs,'w') as handle:
            handle.write(str(os.getpid()))
    except OSError:
        pass
child=os.fork()
if child==0:
    for s in (signal.SIGTERM,signal.SIGINT,signal.SIGPIPE,signal.SIGXFSZ):
        signal.signal(s,signal.SIG_DFL)
    try:
        os.execvp(argv[0],argv)
    except OSError as e:
        sys.stderr.write(f'exec {argv[0]!r}: {e.strerror}\\n')
        sys.stderr.flush()
    os._exit(127)
for s in pending:
    os.kill(child,s)
status=os.waitpid(child,0)[1]
code=os.waitstatus_to_exitcode(status)
code=128-code if code<0 else code
try:
    tmp=exit_file+'.tmp'
    fd=os.open(tmp,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600)
    os.write(fd,str(code).encode())
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp,exit_file)
except OSError:
    pass
os._exit(code)
"""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks, or ``None`` when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` and is not a zombie."""
    fields = _stat_fields(pid)
    return (
        start_ticks is not None
        and fields is not None
        and int(fields[19]) == start_ticks
        and fields[0] not in ("Z", "X")
    )


def read_exit_code(path: Path) -> int | None:
    """The exit code a supervisor recorded, or ``None`` when it recorded none."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def kill_orphan(pid: int, start_ticks: int | None) -> bool:
    """SIGKILL the process group of a supervisor, if ``pid`` is still that process."""
    if not process_alive(pid, start_ticks):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
        return True
    return False


def write_pid_file(workdir: Path, pid: int, start_ticks: int | None) -> None:
    """Record which supervisor runs in ``workdir`` (a launch the state file never recorded)."""
    with contextlib.suppress(OSError):
        (workdir / PID_FILE).write_text(json.dumps({"pid": pid, "start_ticks": start_ticks}))


def kill_leftover(workdir: Path) -> None:
    """Kill a supervisor a crashed server started in ``workdir`` but never recorded as started."""
    try:
        record = json.loads((workdir / PID_FILE).read_text())
        pid, ticks = int(record["pid"]), record.get("start_ticks")
    except (OSError, ValueError, KeyError, TypeError):
        return
    kill_orphan(pid, ticks if isinstance(ticks, int) else None)
