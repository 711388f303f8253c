"""The qosflow view without a deployment: the plugin's registration, the view built from a run's
XComs, the page (escaped, no script), the routes' authentication, and the report store.

``tests/airflow/test_plugin.py`` checks the same under a real api-server, in a real browser.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest

T0 = 1_800_000_000.0
RUN = "manual__2026-01-01T00:00:00+00:00"


def _plan(prefix: str = "training.") -> dict[str, Any]:
    return {
        "job": {
            "name": "retrain",
            "total_steps": 600,
            "deadline": "2027-01-15T08:10:00+00:00",
            "resources": {"unit": "cpu"},
        },
        "plan": {"schedule": [[T0, 0], [T0 + 300, 600]]},
        "verdict": "guaranteed",
        "units": 1,
        "priority_class": "qosflow-normal",
        "priority": 10,
        "reason": "fits at 1 cpu <with> margin",
        "counter_offer": None,
        "conn_id": "qosflow_default",
        "planned_at": T0,
    }


def _watch(t: float, steps: int, units: int, action: str, target: int, reason: str) -> dict:
    return {
        "status": "decision",
        "time": T0 + t,
        "units": units,
        "samples": [[T0 + t - 5, steps - 5, units], [T0 + t, steps, units]],
        "decision": {"action": action, "units": target, "reason": reason},
        "message": reason,
    }


def _xcoms(prefix: str = "training.", *, old_decide: bool = False) -> dict[tuple[str, str], Any]:
    p = prefix
    x: dict[tuple[str, str], Any] = {(f"{p}plan", "return_value"): _plan(p)}
    x[(f"{p}round_1.watch", "return_value")] = _watch(60, 90, 1, "scale_up", 2, "behind: <b>go</b>")
    x[(f"{p}round_1.rescale", "return_value")] = {
        "time": T0 + 61,
        "from": 1,
        "to": 2,
        "units": 2,
        "how": "in_place",
        "reason": "resized in place from 1 to 2 cpu",
    }
    if not old_decide:
        x[(f"{p}round_1.decide", "return_value")] = {
            "action": "scale_up",
            "units": 2,
            "current_units": 1,
            "reason": "behind: <b>go</b>",
            "branch": f"{p}round_1.rescale",
            "taken": "rescale",
        }
    x[(f"{p}round_2.watch", "return_value")] = _watch(200, 500, 2, "done", 2, "all steps done")
    x[(f"{p}finish", "report")] = {
        "job": "retrain",
        "outcome": "missed",
        "met": False,
        "lateness_s": 44.0,
        "margin_s": -44.0,
        "deadline": T0 + 300,
        "finished_at": T0 + 344,
        "verdict": "retrain: deadline MISSED, 44 s late",
        "report_url": "file:///reports/d/r/retrain.png",
        "acts": [
            {"time": T0 + 250, "how": "restart", "from": 2, "units": 2, "reason": "restarted"}
        ],
    }
    return x


def _states(prefix: str = "training.") -> dict[str, str | None]:
    p = prefix
    return {
        f"{p}plan": "success",
        f"{p}submit": "success",
        f"{p}round_1.watch": "success",
        f"{p}round_1.decide": "success",
        f"{p}round_1.rescale": "success",
        f"{p}round_1.bump": "skipped",
        f"{p}round_2.watch": "success",
        f"{p}round_2.decide": "success",
        f"{p}round_2.done": "success",
        f"{p}finish": "failed",
        "publish": "upstream_failed",
    }


# ------------------------------------------------------------------ registration


def test_the_plugin_is_registered_by_its_entry_point():
    from qosflow_airflow.plugin import QosflowPlugin

    (entry,) = [
        e for e in importlib.metadata.entry_points(group="airflow.plugins") if e.name == "qosflow"
    ]
    assert entry.load() is QosflowPlugin
    plugin = QosflowPlugin()
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/qosflow" and app["name"] == "qosflow"
    assert not any(
        app["url_prefix"].startswith(p) for p in ("/api/v2", "/ui", "/execution", "/auth")
    )
    views = {v["destination"]: v for v in plugin.external_views}
    assert views["dag_run"]["href"] == "qosflow/runs/{DAG_ID}/{RUN_ID}"  # relative: base URL
    assert views["task_instance"]["href"].endswith("?task={TASK_ID}")
    assert len({v["url_route"] for v in views.values()}) == 2


def test_importing_the_plugin_builds_no_app_and_imports_no_fastapi_app_module():
    import subprocess
    import sys

    code = (
        "import sys; import qosflow_airflow.plugin as p; "
        "print('qosflow_airflow.plugin.app' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "False"], out


# ------------------------------------------------------------------ the view


def test_the_view_has_the_plan_progress_every_decision_and_the_verdict():
    from qosflow_airflow.plugin.view import run_views

    (job,) = run_views(_xcoms(), _states())
    assert (job.group, job.job, job.verdict, job.unit, job.total_steps) == (
        "training",
        "retrain",
        "missed",
        "cpu",
        600,
    )
    first, done, after = job.decisions
    assert (first.round, first.action, first.before, first.units, first.taken) == (
        1,
        "scale_up",
        1,
        2,
        "rescale",
    )
    assert first.reason == "behind: <b>go</b>" and first.outcome.startswith("resized in place")
    assert (done.round, done.action, done.taken) == (2, "done", "done")  # the branch that ran
    assert (after.round, after.action, after.taken) == (0, "restart", "finish")
    p1, p2 = job.progress
    assert (p1.t, p1.steps, p1.planned, p1.delta) == (60.0, 90, 120, -30)  # behind the plan
    assert (p2.steps, p2.planned, p2.delta) == (500, 400, 100)


def test_a_decide_step_without_a_record_still_shows_the_branch_that_ran():
    from qosflow_airflow.plugin.view import run_views

    (job,) = run_views(_xcoms(old_decide=True), _states())
    assert job.decisions[0].taken == "rescale" and job.decisions[0].before == 1


def test_each_group_of_a_run_is_one_job_and_a_task_picks_its_own():
    from qosflow_airflow.plugin.view import run_views

    xcoms = {**_xcoms("forecast."), **_xcoms("team.ranking.")}
    states = {**_states("forecast."), **_states("team.ranking.")}
    assert [j.group for j in run_views(xcoms, states)] == ["forecast", "team.ranking"]
    (only,) = run_views(xcoms, states, only="team.ranking.round_1.decide")
    assert only.group == "team.ranking"
    assert run_views({}, {"a": "success"}) == []


def test_a_running_job_and_a_failed_plan_say_so():
    from qosflow_airflow.plugin.view import run_views

    xcoms = {k: v for k, v in _xcoms().items() if k[0] != "training.finish"}
    states = {**_states(), "training.finish": "deferred"}
    assert run_views(xcoms, states)[0].verdict == "running"
    failed = {"training.plan": "failed", "training.finish": "failed"}
    (job,) = run_views({}, failed)
    assert job.verdict == "failed" and not job.plan


# ------------------------------------------------------------------ the page


def test_the_page_escapes_every_xcom_value_and_runs_no_script():
    from qosflow_airflow.plugin.page import CSP, page
    from qosflow_airflow.plugin.view import run_views

    xcoms = _xcoms()
    xcoms[("training.plan", "return_value")]["reason"] = "<script>alert(1)</script>"
    html = page("d", RUN, "failed", run_views(xcoms, _states()))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "behind: &lt;b&gt;go&lt;/b&gt;" in html
    assert "script-src" not in CSP and "default-src 'none'" in CSP
    assert "data-verdict='missed'" in html and "deadline missed, 44 s late" in html
    assert "behind by 30 steps" in html and "ahead by 100 steps" in html
    src = "manual__2026-01-01T00%3A00%3A00%2B00%3A00/report.png?group=training"
    assert f"src='{src}'" in html  # relative to the page: behind any base URL


def test_a_run_without_qosflow_jobs_says_so():
    from qosflow_airflow.plugin.page import page

    assert "has no qosflow training job" in page("d", "r", "success", [])


# ------------------------------------------------------------------ the routes


def _dependency_names(dependant: Any) -> set[str]:
    names = {getattr(dependant.call, "__qualname__", "")}
    for sub in dependant.dependencies:
        names |= _dependency_names(sub)
    return names


def test_every_route_needs_a_user_and_the_run_routes_the_dags_xcom_permission():
    from fastapi.routing import APIRoute

    from qosflow_airflow.plugin.app import create_app

    app = create_app()
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} == {
        "/runs/{dag_id}/{run_id}",
        "/runs/{dag_id}/{run_id}/data",
        "/runs/{dag_id}/{run_id}/report.png",
    }
    for route in routes:
        names = _dependency_names(route.dependant)
        assert "get_user" in names, route.path
        assert "requires_access_dag.<locals>.inner" in names, route.path


@pytest.mark.parametrize("path", ["/runs/d/r", "/runs/d/r/data", "/runs/d/r/report.png"])
def test_without_credentials_every_route_answers_401(path):
    from fastapi.testclient import TestClient

    from qosflow_airflow.plugin.app import create_app

    response = TestClient(create_app()).get(path)
    assert response.status_code == 401, response.text


# ------------------------------------------------------------------ the report store


def test_report_locations(monkeypatch, tmp_path):
    from qosflow_airflow import report_store as rs

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert rs.report_root(None, None) == f"file://{tmp_path}/qosflow/reports"
    assert rs.report_root("rel/dir", "s3://b/x") == f"file://{tmp_path}/rel/dir"
    assert (
        rs.report_root(None, "s3://aws_default@bucket/qosflow/")
        == "s3://aws_default@bucket/qosflow"
    )
    assert rs.report_root(None, "/abs/../abs/r") == "file:///abs/r"
    url = rs.report_url("s3://b/r", "job", "dag", RUN)
    assert url == "s3://b/r/dag/manual__2026-01-01T00_00_00_00_00/job.png"
    assert rs.report_url("file:///x", "../../etc", "..", "") == "file:///x/_/.._.._etc.png"
    assert rs.shown("file:///a/b.png") == "/a/b.png" and rs.shown(url) == url


@pytest.mark.parametrize(
    ("url", "inside"),
    [
        ("file:///r/d/run/job.png", True),
        ("file:///r/../etc/x.png", False),
        ("file:///r/d/../../etc/x.png", False),
        ("file:///r-evil/x.png", False),
        ("file:///r/d/job.txt", False),
        ("s3://b/r/x.png", False),
        ("file:///r//x.png", False),
        ("file:///r/./x.png", False),
    ],
)
def test_only_pngs_below_a_root_are_served(url, inside):
    from qosflow_airflow.report_store import within

    assert within(url, "file:///r") is inside


def test_reports_round_trip_through_object_storage(tmp_path):
    from qosflow_airflow import report_store as rs

    url = rs.report_url(f"file://{tmp_path}/store", "job", "dag", RUN)
    assert rs.write(url, b"\x89PNG data") == url.removeprefix("file://")  # folders made
    assert rs.read(url) == b"\x89PNG data"
    with pytest.raises(FileNotFoundError):
        rs.read(f"file://{tmp_path}/missing.png")


# ------------------------------------------------------------------ the decide step's XCom


def test_decide_publishes_the_decision_and_the_branch():
    from unittest import mock

    from qosflow_airflow.operators.branch import DeadlineBranchOperator

    op = DeadlineBranchOperator(
        task_id="decide",
        watch_task_id="w",
        branches={"scale_up": "g.rescale", "done": "g.done", "at_risk": "g.bump"},
    )
    event = _watch(60, 90, 1, "scale_up", 2, "behind the schedule")
    ti = mock.Mock()
    ti.xcom_pull.return_value = event
    skipping = RuntimeError("skip")  # Airflow 3 skips by raising out of do_branch ...
    with (
        mock.patch.object(op, "do_branch", side_effect=skipping) as branched,
        pytest.raises(RuntimeError),
    ):
        op.execute({"ti": ti})
    ti.xcom_push.assert_called_once()  # ... so the record is pushed before it
    assert ti.xcom_push.call_args.kwargs["key"] == "return_value"
    record = ti.xcom_push.call_args.kwargs["value"]
    assert branched.call_args.args[1] == "g.rescale"
    assert record["action"] == "scale_up" and record["reason"] == "behind the schedule"
    assert (record["current_units"], record["units"], record["taken"]) == (1, 2, "rescale")
    json.dumps(record)  # an XCom
