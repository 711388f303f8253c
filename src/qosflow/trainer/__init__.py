"""The qosflow reference trainer and a tiny helper API for users' own training loops.

``python -m qosflow.trainer`` runs the reference job (see :mod:`qosflow.trainer.__main__`). The
helpers let any training loop behave the way qosflow needs:

* :func:`report_progress` — write ``N/M`` to ``$ARGO_PROGRESS_FILE`` (atomic, rate-limited);
* :func:`install_checkpoint_handler` — SIGTERM -> save a checkpoint -> exit 75
  (:data:`EXIT_CHECKPOINTED`);
* :func:`allowed_cpus` — the CPUs this process may use now (affinity and cgroup v2 quota), to size
  thread pools after an in-place resize.
"""

from __future__ import annotations

from qosflow.trainer.cpus import CpuFollower, allowed_cpus
from qosflow.trainer.preemption import (
    EXIT_CHECKPOINTED,
    CheckpointHandler,
    install_checkpoint_handler,
)
from qosflow.trainer.progress import report_progress

__all__ = [
    "EXIT_CHECKPOINTED",
    "CheckpointHandler",
    "CpuFollower",
    "allowed_cpus",
    "install_checkpoint_handler",
    "report_progress",
]
