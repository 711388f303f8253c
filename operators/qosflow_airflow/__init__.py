"""qosflow's Apache Airflow provider: hooks, operators, sensors, triggers and a task-group factory."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Return the provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "qosflow",
        "name": "qosflow",
        "description": "Deadline-driven training on Argo Workflows.",
        "versions": [__version__],
        "connection-types": [
            {
                "connection-type": "qosflow_argo",
                "hook-class-name": "qosflow_airflow.hooks.argo.QosflowArgoHook",
            }
        ],
    }
