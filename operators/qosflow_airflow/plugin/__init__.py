"""qosflow's Airflow UI plugin: a view of each run's deadline training, and links to it.

Registered through the ``airflow.plugins`` entry point (``pyproject.toml``). The api-server
mounts the FastAPI app (:mod:`qosflow_airflow.plugin.app`) under ``/qosflow``; two external
views put it on the DAG run page (all the run's jobs) and on the task instance page (the job of
that task's group), shown in the UI's own frame. The qosflow tasks also carry a link to it
(:class:`~qosflow_airflow.plugin.links.QosflowViewLink`).

Importing this module is cheap (the FastAPI app is built the first time the api-server asks for
it): every Airflow process that loads plugins imports it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/qosflow"
"""Where the api-server mounts the view (``qosflow_airflow.plugin.app.URL_PREFIX``)."""
RUN_HREF = "qosflow/runs/{DAG_ID}/{RUN_ID}"
"""The view of a run, relative to the UI's base URL (the UI fills in the ids)."""


@cache
def _apps() -> list[dict[str, Any]]:
    from qosflow_airflow.plugin.app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "qosflow"}]


class QosflowPlugin(AirflowPlugin):
    """The qosflow view in the Airflow UI (DAG run and task instance pages)."""

    name = "qosflow"
    external_views = [  # noqa: RUF012 - Airflow's plugin attributes are plain lists
        {
            "name": "qosflow",
            "href": RUN_HREF,
            "destination": "dag_run",
            "url_route": "qosflow-run",
        },
        {
            "name": "qosflow",
            "href": RUN_HREF + "?task={TASK_ID}",
            "destination": "task_instance",
            "url_route": "qosflow-task",
        },
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The view's app, built on first use (only the api-server mounts it)."""
        return _apps()
