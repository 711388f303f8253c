"""``python -m qosflow_trainer``: the qosflow reference training job.

Options come from flags or, for an Argo template, from environment variables (``--help`` lists
both): ``QOSFLOW_TOTAL_STEPS``, ``QOSFLOW_BATCH_SIZE``, ``QOSFLOW_SEED``,
``QOSFLOW_CHECKPOINT_DIR``, ``QOSFLOW_CHECKPOINT_EVERY``, ``QOSFLOW_RESUME`` (auto|true|false),
the size knobs
``QOSFLOW_WIDTH`` / ``QOSFLOW_DEPTH`` / ``QOSFLOW_INPUT_DIM``, and ``ARGO_PROGRESS_FILE``.

Exit codes:

* ``0`` — all steps done; the final ``{"event": "done", ...}`` line is on stdout and in
  ``<checkpoint_dir>/result.json``;
* ``1`` — unexpected error;
* ``2`` — bad configuration (also: ``QOSFLOW_RESUME=true`` without a valid checkpoint, or a
  checkpoint directory holding another run's checkpoints);
* ``75`` — stopped by SIGTERM (or Ctrl-C) after writing a checkpoint (``{"event": "stopped",
  ...}`` on stdout); rerun with resume to continue.

``python -m qosflow_trainer --ddp`` trains the same model data-parallel with PyTorch DDP, one
process per rank under torchrun (:mod:`qosflow_trainer.ddp`, :mod:`qosflow_trainer.launch`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from qosflow_trainer.cpus import BLAS_THREAD_VARIABLES

# One BLAS thread per worker thread (qosflow_trainer.workers): set before numpy loads its BLAS, so
# the limit holds without threadpoolctl too. A value the caller set wins.
for _variable in BLAS_THREAD_VARIABLES:
    os.environ.setdefault(_variable, "1")

from qosflow_trainer.config import parse_config  # noqa: E402 - after the BLAS variables
from qosflow_trainer.errors import TrainerError  # noqa: E402
from qosflow_trainer.job import TrainingJob  # noqa: E402
from qosflow_trainer.preemption import EXIT_USAGE  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options, run the job, return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--ddp" in args:  # the PyTorch DDP mode, run under torchrun (qosflow_trainer.launch)
        from qosflow_trainer.ddp import main as ddp_main

        return ddp_main([a for a in args if a != "--ddp"])
    try:
        config = parse_config(args, os.environ)
        return TrainingJob(config).run()
    except TrainerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
