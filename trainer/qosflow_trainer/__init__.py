"""The qosflow reference trainer and a tiny helper API for users' own training loops.

Its own small distribution, ``qosflow-trainer`` (built from ``trainer/`` of the qosflow
repository; it depends on numpy only and imports nothing else of qosflow), so a team adds it to
its own training image without the scheduler's dependencies. ``python -m qosflow_trainer`` runs the reference job (see :mod:`qosflow_trainer.__main__`). The
helpers let any training loop behave the way qosflow needs:

* :func:`report_progress` — write ``N/M`` to ``$ARGO_PROGRESS_FILE`` (atomic, rate-limited);
* :func:`install_checkpoint_handler` — SIGTERM -> save a checkpoint -> exit 75
  (:data:`EXIT_CHECKPOINTED`);
* :func:`allowed_cpus` — the CPUs this process may use now (affinity and cgroup v2 quota), to size
  thread pools after an in-place resize.
"""

from __future__ import annotations

from qosflow_trainer.cpus import CpuFollower, allowed_cpus
from qosflow_trainer.preemption import (
    EXIT_CHECKPOINTED,
    CheckpointHandler,
    install_checkpoint_handler,
)
from qosflow_trainer.progress import report_progress

__version__ = "0.1.0"
"""Kept equal to ``qosflow.__version__`` (a test checks it)."""

__all__ = [
    "EXIT_CHECKPOINTED",
    "CheckpointHandler",
    "CpuFollower",
    "__version__",
    "allowed_cpus",
    "install_checkpoint_handler",
    "report_progress",
]
