"""``QosflowViewLink``: the "qosflow" button of a qosflow task, to its run's view.

Airflow 3 computes a task's extra links in the worker when the task ends and keeps them as
XComs (``_link_QosflowViewLink``), so the link needs no registration in the api-server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

PREFIX = "/qosflow"


def view_path(dag_id: str, run_id: str, task_id: str | None = None) -> str:
    """The view's path for a run (and the job of ``task_id``), under the api-server."""
    path = f"{PREFIX}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"
    return path + (f"?task={quote(task_id, safe='')}" if task_id else "")


class QosflowViewLink(BaseOperatorLink):
    """Opens the qosflow view of the task's run, at the task's job."""

    name = "qosflow"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """``<api base_url>/qosflow/runs/<dag>/<run>?task=<task>``."""
        from airflow.sdk.configuration import conf

        base = str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
        return base + view_path(ti_key.dag_id, ti_key.run_id, ti_key.task_id)
