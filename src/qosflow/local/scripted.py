"""Scripted pods: no process, progress is a function of virtual time and CPUs.

For fast deterministic tests the local cluster takes a :class:`ScriptedRunner`. A scripted pod
advances ``rate(cpus)`` steps per second of (virtual) time between polls, writes ``N/M`` to its
``ARGO_PROGRESS_FILE`` like a real trainer, exits 0 at ``M``, and on SIGTERM exits after
``term_exit_s`` seconds without further progress (a checkpoint), or ignores it when ``None`` so only
the grace-period SIGKILL ends it. Its readiness probes pass once it has run ``ready_after_s`` seconds
(never when ``None``), whatever the probe's handler; a script that never ends (``total_steps`` and
``rate`` such that it does not finish, say ``rate=lambda cpus: 0``) plays a daemon.
The total ``M`` is taken from the script, else from the pod's ``QOSFLOW_TOTAL_STEPS`` variable or a
``--steps`` argument.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qosflow.local.probes import ProbeAction
from qosflow.local.runner import PodLaunch, PodProcess


def linear_rate(cpus: float) -> float:
    """The default script speed: one step per second per CPU."""
    return max(cpus, 0.0)


@dataclass(frozen=True, slots=True)
class Script:
    """Behaviour of a scripted pod.

    Attributes:
        total_steps: Steps to run; ``None`` to read them from the pod (env or ``--steps``).
        rate: Steps per second as a function of the pod's CPUs.
        term_exit_s: Seconds from SIGTERM to exit (a checkpoint); ``None`` ignores SIGTERM.
        term_exit_code: Exit code after SIGTERM.
        fail_at_step: Exit 1 when this step is reached, if set.
        start_step: Step to start from (a resumed segment).
        ready_after_s: Seconds after its start from which its readiness probes pass (``None``:
            never).
        exit_at_s: Exit with ``exit_code_at`` this many seconds after the start, if set.
        exit_code_at: Exit code at ``exit_at_s``.
    """

    total_steps: int | None = None
    rate: Callable[[float], float] = linear_rate
    term_exit_s: float | None = 0.0
    term_exit_code: int = 0
    fail_at_step: int | None = None
    start_step: int = 0
    ready_after_s: float | None = 0.0
    exit_at_s: float | None = None
    exit_code_at: int = 0


def _total_from(spec: PodLaunch, default: int = 100) -> int:
    """``QOSFLOW_TOTAL_STEPS`` or ``--steps N`` / ``--steps=N`` of the pod, else ``default``."""
    if "QOSFLOW_TOTAL_STEPS" in spec.env:
        return int(spec.env["QOSFLOW_TOTAL_STEPS"])
    argv = list(spec.argv)
    for index, arg in enumerate(argv):
        if arg.startswith("--steps="):
            return int(arg.split("=", 1)[1])
        if arg == "--steps" and index + 1 < len(argv):
            return int(argv[index + 1])
    return default


class ScriptedProcess:
    """A scripted pod (see :class:`Script`)."""

    def __init__(self, spec: PodLaunch, script: Script, now: float) -> None:
        self.spec = spec
        self.script = script
        self.total = script.total_steps if script.total_steps is not None else _total_from(spec)
        self.steps = float(script.start_step)
        self.cpus = spec.cpus
        self.cores = spec.cores
        self.started = now
        self.last = now
        self.term_at: float | None = None
        self.exit_code: int | None = None
        self.signals: list[str] = []
        self._write()

    @property
    def pid(self) -> int | None:
        """Scripted pods have no process."""
        return None

    @property
    def start_ticks(self) -> int | None:
        """Scripted pods have no process."""
        return None

    def _write(self) -> None:
        """Write ``N/M`` atomically, like the reference trainer."""
        path = self.spec.progress_file
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{math.floor(self.steps)}/{self.total}\n", encoding="utf-8")
        os.replace(tmp, path)

    def poll(self, now: float) -> int | None:
        """Advance the script to ``now``; the exit code once it ended."""
        if self.exit_code is not None:
            return self.exit_code
        elapsed = max(0.0, now - self.last)
        self.last = now
        checkpointing = self.term_at is not None and self.script.term_exit_s is not None
        if not checkpointing:
            self.steps = min(float(self.total), self.steps + self.script.rate(self.cpus) * elapsed)
        fail = self.script.fail_at_step
        exit_at = self.script.exit_at_s
        if exit_at is not None and now >= self.started + exit_at:
            self.exit_code = self.script.exit_code_at
        elif fail is not None and self.steps >= fail:
            self.steps = float(fail)
            self.exit_code = 1
        elif self.steps >= self.total:
            self.exit_code = 0
        elif self._term_due(now):
            self.exit_code = self.script.term_exit_code
        self._write()
        return self.exit_code

    def _term_due(self, now: float) -> bool:
        """Whether the scripted checkpoint after SIGTERM is done by ``now``."""
        wait = self.script.term_exit_s
        return self.term_at is not None and wait is not None and now >= self.term_at + wait

    def set_cores(self, cores: tuple[int, ...], cpus: float) -> None:
        """New CPUs: the rate changes from the next poll on."""
        self.cores = cores
        self.cpus = cpus

    def terminate(self) -> None:
        """SIGTERM: exit ``term_exit_s`` later (at the next poll after that)."""
        self.signals.append("SIGTERM")
        if self.term_at is None:
            self.term_at = self.last

    def kill(self) -> None:
        """SIGKILL: exit 137 at once."""
        self.signals.append("SIGKILL")
        if self.exit_code is None:
            self.exit_code = 137

    def probe(self, action: ProbeAction) -> bool:
        """Readiness by script: passes once it has run ``ready_after_s`` (virtual) seconds."""
        wait = self.script.ready_after_s
        return self.exit_code is None and wait is not None and self.last >= self.started + wait


@dataclass
class ScriptedRunner:
    """Runs scripted pods instead of processes.

    Attributes:
        default: Script of pods without a specific one.
        by_workflow: Scripts by workflow name.
        select: Chooses the script of a pod from its launch (pod name, environment...) first;
            ``None`` from it falls back to ``by_workflow``, then ``default``.
        launched: Every scripted pod started, by pod name (for assertions).
    """

    default: Script = field(default_factory=Script)
    by_workflow: Mapping[str, Script] = field(default_factory=dict)
    select: Callable[[PodLaunch], Script | None] | None = None
    launched: dict[str, ScriptedProcess] = field(default_factory=dict)

    def launch(self, spec: PodLaunch, now: float) -> PodProcess:
        """Start a scripted pod at virtual time ``now``."""
        chosen = self.select(spec) if self.select is not None else None
        script = chosen or self.by_workflow.get(spec.workflow, self.default)
        process = ScriptedProcess(spec, script, now)
        self.launched[spec.pod] = process
        return process

    def adopt(self, spec: PodLaunch, record: Mapping[str, Any], now: float) -> PodProcess | None:
        """After a restart with the same runner: the scripted pod it launched (it kept running).

        A fresh runner knows no pod, like a host whose processes are gone: ``None``.
        """
        process = self.launched.get(spec.pod)
        if process is None or process.spec.namespace != spec.namespace:
            return None
        return process
