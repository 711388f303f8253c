"""qosflow and the trainer helpers are released together: one version."""

from __future__ import annotations

import qosflow
import qosflow_trainer


def test_the_trainer_distribution_has_qosflows_version() -> None:
    assert qosflow_trainer.__version__ == qosflow.__version__
