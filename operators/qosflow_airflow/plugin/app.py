"""The qosflow view's FastAPI app, mounted by the api-server under :data:`URL_PREFIX`.

**Authentication.** Airflow mounts a plugin's app with ``app.mount()``, which inherits none of the
core API's dependencies: an unprotected route would be open to anyone who can reach the
api-server. So the app depends on :func:`airflow.api_fastapi.core_api.security.get_user` for
every route (a JWT in the ``Authorization`` header, or the ``_token`` cookie the UI sets at
login: 401 without one, 403 for an invalid one), and every route that shows a run also depends
on ``requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM)`` — the very check
Airflow's own XCom endpoint makes — so a user sees the view of a DAG only where the auth manager
lets them read its XComs.

**Reading XComs.** The routes run in the api-server process, next to Airflow's own API: they
read the run's XComs and task states with the api-server's database session
(``SessionDep``) through Airflow's models (``XComModel``, ``TaskInstance``, ``DagRun``), the way
``GET /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}/taskInstances/{task_id}/xcomEntries`` does,
and decode values with ``XComModel.deserialize_value``.

**The report image** is read with ``ObjectStoragePath`` from the URL the finish step stored in
its XCom, and only when that URL lies below a report root this server knows: the connection's
``report_url`` (or ``$AIRFLOW_HOME/qosflow/reports``) or the ``report_dir`` the finish task was
rendered with (its rendered template fields, written by the worker, not by XCom): an XCom edited
to point elsewhere gets a 404, never a file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from qosflow_airflow import report_store
from qosflow_airflow.plugin.page import CSP, page
from qosflow_airflow.plugin.view import XComKey, job_view, run_views

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

URL_PREFIX = "/qosflow"
"""Where the api-server mounts the app."""
KEYS = ("return_value", "report")
"""The XCom keys the view reads (a failed finish step pushes its result under ``report``)."""
PNG = b"\x89PNG\r\n\x1a\n"
READ_XCOMS = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))]
"""Who may read a run's XComs may see its view (the check of Airflow's own XCom endpoint)."""
NO_STORE = {"Cache-Control": "no-store"}


def run_state(session: Session, dag_id: str, run_id: str) -> str:
    """The run's state.

    Raises:
        HTTPException: 404 when the run does not exist.
    """
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    state = session.scalar(
        select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    )
    if state is None:
        raise HTTPException(404, f"no run {run_id!r} of DAG {dag_id!r}")
    return str(state)


def run_xcoms(session: Session, dag_id: str, run_id: str) -> dict[XComKey, Any]:
    """The run's XComs the view needs, ``(task_id, key)`` → value (unmapped tasks only)."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    rows = session.scalars(
        select(XComModel).where(
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.map_index == -1,
            XComModel.key.in_(KEYS),
        )
    )
    return {(row.task_id, row.key): XComModel.deserialize_value(row) for row in rows}


def run_states(session: Session, dag_id: str, run_id: str) -> dict[str, str | None]:
    """Task id → state of the run's (unmapped) task instances."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    rows = session.execute(
        select(TaskInstance.task_id, TaskInstance.state).where(
            TaskInstance.dag_id == dag_id,
            TaskInstance.run_id == run_id,
            TaskInstance.map_index == -1,
        )
    )
    return {str(task): None if state is None else str(state) for task, state in rows}


def connection_report_url(conn_id: str) -> str | None:
    """The ``report_url`` extra of a ``qosflow_argo`` connection (``None``: unset or unknown)."""
    from airflow.models.connection import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        return None
    value = conn.extra_dejson.get("report_url")
    return str(value) if value else None


def rendered_report_dir(session: Session, dag_id: str, run_id: str, task_id: str) -> str | None:
    """The ``report_dir`` the finish task ran with (its rendered template fields)."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from sqlalchemy import select

    fields = session.scalar(
        select(RTIF.rendered_fields).where(
            RTIF.dag_id == dag_id,
            RTIF.run_id == run_id,
            RTIF.task_id == task_id,
            RTIF.map_index == -1,
        )
    )
    value = (fields or {}).get("report_dir") if isinstance(fields, Mapping) else None
    return value if isinstance(value, str) and value.strip() else None


def report_roots(session: Session, dag_id: str, run_id: str, group: str, conn_id: str) -> list[str]:
    """The report roots a run's report may be served from (see the module docstring)."""
    roots = [report_store.report_root(None, connection_report_url(conn_id))]
    finish = f"{group}.finish" if group else "finish"
    rendered = rendered_report_dir(session, dag_id, run_id, finish)
    if rendered is not None:
        roots.append(report_store.report_root(rendered, None))
    return roots


def create_app() -> FastAPI:
    """The app: the run page, its data as JSON, and the report image."""
    app = FastAPI(
        title="qosflow",
        description="Deadline training: plan, decisions and verdict of a DAG run.",
        dependencies=[Depends(get_user)],  # every route needs a logged-in user
    )

    @app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=READ_XCOMS)
    def run_page(
        dag_id: str, run_id: str, session: SessionDep, task: str | None = None
    ) -> HTMLResponse:
        """The run's qosflow jobs (``task``: only the job whose group holds that task)."""
        state = run_state(session, dag_id, run_id)
        jobs = run_views(
            run_xcoms(session, dag_id, run_id), run_states(session, dag_id, run_id), task
        )
        headers = {"Content-Security-Policy": CSP, **NO_STORE}
        return HTMLResponse(page(dag_id, run_id, state, jobs), headers=headers)

    @app.get("/runs/{dag_id}/{run_id}/data", dependencies=READ_XCOMS)
    def run_data(
        dag_id: str, run_id: str, session: SessionDep, task: str | None = None
    ) -> dict[str, Any]:
        """What the page shows, as JSON."""
        state = run_state(session, dag_id, run_id)
        jobs = run_views(
            run_xcoms(session, dag_id, run_id), run_states(session, dag_id, run_id), task
        )
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "state": state,
            "jobs": [{**dataclasses.asdict(j), "verdict": j.verdict} for j in jobs],
        }

    @app.get("/runs/{dag_id}/{run_id}/report.png", dependencies=READ_XCOMS)
    def report_png(
        dag_id: str, run_id: str, session: SessionDep, group: str = Query("training")
    ) -> Response:
        """The job's report PNG, from where the finish step stored it."""
        run_state(session, dag_id, run_id)
        job = job_view(group, run_xcoms(session, dag_id, run_id), {})
        url = str(job.finish.get("report_url") or "")
        if not url:
            raise HTTPException(404, f"no report for {group!r} in this run (yet)")
        conn_id = str(job.plan.get("conn_id") or "qosflow_default")
        if not any(
            report_store.within(url, r)
            for r in report_roots(session, dag_id, run_id, group, conn_id)
        ):
            raise HTTPException(404, "the report is stored outside this server's report locations")
        try:
            data = report_store.read(url)
        except FileNotFoundError:
            raise HTTPException(404, f"the report is not at {report_store.shown(url)}") from None
        if not data.startswith(PNG):
            raise HTTPException(404, "the stored report is not a PNG")
        return Response(data, media_type="image/png", headers=NO_STORE)

    return app
