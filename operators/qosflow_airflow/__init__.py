"""qosflow's Apache Airflow provider: hooks, operators, sensors, triggers and a task-group factory.

Registered through the ``apache_airflow_provider`` entry point (``get_provider_info``), with a UI
plugin through ``airflow.plugins`` (:mod:`qosflow_airflow.plugin`). Importing this package is
cheap: the operators, hera and kubernetes load only when used; so does :func:`deadline_alert`
(``from qosflow_airflow import deadline_alert``, :mod:`qosflow_airflow.alerts`).
"""

from __future__ import annotations

from typing import Any

from qosflow import __version__ as __version__  # one version: src/qosflow/__init__.py


def _conn_fields() -> dict[str, Any]:
    def field(label: str, kind: list[str], description: str, default: Any = None) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": kind}
        if default is not None:
            schema["default"] = default
        return {"label": label, "description": description, "schema": schema}

    return {
        "namespace": field(
            "Namespace", ["string", "null"], "Namespace of the workflows", "qosflow"
        ),
        "kube_url": field(
            "Kubernetes API URL", ["string", "null"], "Kubernetes API server (or use kubeconfig)"
        ),
        "kubeconfig": field("Kubeconfig path", ["string", "null"], "Path of a kubeconfig file"),
        "verify_ssl": field("Verify TLS", ["boolean", "null"], "Verify certificates", True),
        "ca_cert": field("CA bundle", ["string", "null"], "Path of a CA bundle for TLS"),
        "history_url": field(
            "History store URL",
            ["string", "null"],
            "SQLAlchemy URL: SQLite on one machine, PostgreSQL when tasks run on several workers",
            "sqlite:///.qosflow/history.db",
        ),
        "image": field(
            "Default image", ["string", "null"], "Training image of jobs that name none"
        ),
        "checkpoint_claim": field(
            "Checkpoint claim",
            ["string", "null"],
            "PersistentVolumeClaim for the checkpoints of jobs without checkpoint:",
        ),
        "checkpoint_path": field(
            "Checkpoint path",
            ["string", "null"],
            "Where that claim is mounted in the pods",
            "/var/lib/qosflow/checkpoints",
        ),
        "tolerations": field(
            "Default tolerations", ["string", "null"], "JSON list, for jobs that set none"
        ),
        "gpu_resource": field(
            "GPU resource", ["string", "null"], "Extended resource of a GPU", "nvidia.com/gpu"
        ),
        "report_url": field(
            "Report storage",
            ["string", "null"],
            "Folder or object-storage URL of the reports, read by the api-server's qosflow view "
            "(default: $AIRFLOW_HOME/qosflow/reports)",
        ),
    }


def __getattr__(name: str) -> Any:
    """``deadline_alert``, imported on first use (:mod:`qosflow_airflow.alerts`)."""
    if name == "deadline_alert":
        from qosflow_airflow.alerts import deadline_alert

        return deadline_alert
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_provider_info() -> dict[str, Any]:
    """Return the provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "qosflow",
        "name": "qosflow",
        "description": "Deadline-driven training on Argo Workflows.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "qosflow",
                "external-doc-url": "https://github.com/qosflow/qosflow",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": "qosflow", "python-modules": ["qosflow_airflow.hooks.argo"]}
        ],
        "operators": [
            {
                "integration-name": "qosflow",
                "python-modules": [
                    "qosflow_airflow.operators.plan",
                    "qosflow_airflow.operators.branch",
                    "qosflow_airflow.operators.rescale",
                    "qosflow_airflow.operators.finish",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "qosflow", "python-modules": ["qosflow_airflow.sensors.progress"]}
        ],
        "triggers": [
            {
                "integration-name": "qosflow",
                "python-modules": ["qosflow_airflow.triggers.progress"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "qosflow_argo",
                "hook-class-name": "qosflow_airflow.hooks.argo.QosflowArgoHook",
                "hook-name": "qosflow (Argo Workflows + Kubernetes)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port"],
                    "relabeling": {"host": "Argo Server URL", "password": "Bearer token"},
                    "placeholders": {
                        "host": "https://argo-server.argo:2746",
                        "extra": '{"namespace": "qosflow", "kube_url": "https://kubernetes.default"}',
                    },
                },
                "conn-fields": _conn_fields(),
            }
        ],
    }
