"""The qosflow view under a real api-server, in a real browser; a missed deadline is loud.

The real deployment the session shares (``shared_deployment`` in ``conftest.py``, started by
``tests/airflow/deployment.py``: scheduler, triggerer, dag-processor and api-server, PostgreSQL;
``test_deployment.py`` runs its DAG there too) with users who log in (the simple auth manager's ``admin`` and its
generated password, not "everyone is an admin"), and one run of
``deployment_dags/qosflow_deadline_alert.py`` against a 2-CPU local cluster: a job sized from
this machine's trainer speed so that even both CPUs miss its 20 s deadline. The tests then check,
on that one run:

* misses are loud: the finish step records, writes the report (to the connection's
  ``report_url``) and fails without retry, so the run is ``failed``; its XCom says ``met``,
  ``lateness_s`` and ``margin_s``; the DAG's Deadline Alert fired from the triggerer and its
  callback recorded the miss;
* the view: plugin routes need a logged-in user (401 without, 403 with a forged token) and
  serve the page, its data and the report image to one; headless Chromium, with the cookie the
  UI's login leaves, shows the plan, each decision with its reason and the action taken, the
  verdict and the loaded image, inside the Airflow UI's run page too; the screenshots are kept
  in ``.qosflow/artefacts/``;
* the ``decide`` step's XCom carries the decision and its reason; the tasks link to the view;
* an XCom edited to point the report elsewhere gets a 404, never the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from browser import binary, chromium
from deployment import DAGS, Deployment, RunResult, log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "qosflow_deadline_alert"
assert DAG_ID in DAGS  # the shared deployment serves it
ARTEFACTS = ROOT / ".qosflow" / "artefacts"
WIDTH = 512
ONE_CPU_S = 90.0
"""The job's work on one CPU: even two (at best twice as fast) miss the DAG's 20 s deadline."""


@pytest.fixture(scope="module")
def deployed(shared_deployment: dict[str, Any]) -> Any:
    """One missed run of the DAG on the shared deployment (``conftest.py``: users log in)."""
    binary()  # skip (fail under CI) without a browser before the run
    from qosflow_airflow.demo import trainer_rate

    dep = shared_deployment["dep"]
    assert dep.auth  # users log in: not "everyone is an admin"
    rate = trainer_rate(WIDTH, seconds=6.0)
    conf = {"total_steps": int(rate * ONE_CPU_S), "width": WIDTH, "step_s": 1.0 / rate}
    log(f"trainer: {rate:.1f} steps/s on one CPU; run conf {conf}")
    result = dep.run(DAG_ID, conf, timeout_s=600)
    root = shared_deployment["root"] / "plugin"
    root.mkdir(exist_ok=True)
    return {"dep": dep, "result": result, "store": shared_deployment["store"], "root": root}


def _result(deployed: Any) -> RunResult:
    return deployed["result"]


def _finish(result: RunResult) -> dict[str, Any]:
    return result.xcom("training.finish") or result.xcom("training.finish", "report") or {}


def _view_url(dep: Deployment, result: RunResult, tail: str = "") -> str:
    return f"{dep.api_url}/qosflow/runs/{DAG_ID}/{quote(result.run_id, safe='')}{tail}"


def _image_url(dep: Deployment, result: RunResult) -> str:
    return _view_url(dep, result, "/report.png?group=training")


# -- misses are loud -------------------------------------------------------------------------------
def test_a_missed_deadline_fails_the_run_after_recording_and_reporting(deployed):
    from qosflow_airflow.report_store import safe_part

    result = _result(deployed)
    report = _finish(result)
    print(json.dumps({k: report.get(k) for k in ("verdict", "lateness_s", "png")}, indent=1))
    assert result.state == "failed", result.states()
    assert result.tasks["training.finish"].state == "failed"
    assert result.tasks["training.finish"].try_number == 1  # no retry of a miss
    assert report["outcome"] == "missed" and report["met"] is False, report["verdict"]
    assert report["lateness_s"] > 0 and report["margin_s"] == -report["lateness_s"]
    png = Path(report["png"])
    assert png.is_relative_to(deployed["store"]), png  # the connection's report_url
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert png.parent.name == safe_part(result.run_id)  # <root>/<dag>/<run>/<job>.png
    from qosflow.store.history import HistoryStore

    history = HistoryStore(deployed["dep"].history_url)
    try:
        assert history.count_samples("deadline-alert-check") > 0  # recorded before it failed
    finally:
        history.close()


def _alert_rows(dep: Deployment, run_id: str) -> list[tuple[Any, ...]]:
    return dep.sql(
        "SELECT d.missed, c.state, c.output, c.data FROM deadline d"
        " JOIN dag_run r ON r.id = d.dagrun_id LEFT JOIN callback c ON c.id = d.callback_id"
        " WHERE r.dag_id = %s AND r.run_id = %s",
        (DAG_ID, run_id),
    )


def test_the_dags_deadline_alert_fires_from_the_triggerer(deployed):
    dep, result = deployed["dep"], _result(deployed)
    give_up, rows = time.monotonic() + 90, []
    while time.monotonic() < give_up:
        rows = _alert_rows(dep, result.run_id)
        if rows and all(r[0] and r[1] in ("success", "failed") for r in rows):
            break
        time.sleep(2)
    print(rows)
    assert rows, "the run has no deadline row: the DAG's deadline= was not applied"
    missed, state, output, data = rows[0]
    assert missed is True
    assert state == "success", (state, output)
    assert "late-retrain" in json.dumps(data)  # our callback, with the job's name
    assert json.loads(output)["job"] == "late-retrain"  # and its record of the miss
    triggerer = dep.logfile("triggerer").read_text(encoding="utf-8", errors="replace")
    assert "qosflow deadline missed: late-retrain" in triggerer


# -- the decide step and the links ------------------------------------------------------------------
def test_decide_publishes_the_decision_its_reason_and_the_branch(deployed):
    result = _result(deployed)
    decided = [
        result.xcom(f"training.round_{k}.decide")
        for k in (1, 2)
        if result.tasks.get(f"training.round_{k}.decide")
        and result.tasks[f"training.round_{k}.decide"].state == "success"
    ]
    assert decided, result.states()
    for k, record in enumerate(decided, 1):
        watch = result.xcom(f"training.round_{k}.watch")
        assert record["action"] == watch["decision"]["action"]
        assert record["reason"] == watch["decision"]["reason"] and record["reason"]
        assert record["taken"] in ("rescale", "bump", "continue", "done")
        assert record["branch"] == f"training.round_{k}.{record['taken']}"


def test_qosflow_tasks_link_to_the_view(deployed):
    dep, result = deployed["dep"], _result(deployed)
    links = dep.rest(
        "GET",
        f"/dags/{DAG_ID}/dagRuns/{quote(result.run_id, safe='')}/taskInstances/training.plan/links",
    )
    assert links["extra_links"]["qosflow"].endswith(
        f"/qosflow/runs/{DAG_ID}/{quote(result.run_id, safe='')}?task=training.plan"
    ), links


# -- the view ---------------------------------------------------------------------------------------
def test_the_view_needs_a_logged_in_user(deployed):
    dep, result = deployed["dep"], _result(deployed)
    for url in (_view_url(dep, result), _view_url(dep, result, "/data"), _image_url(dep, result)):
        assert requests.get(url, timeout=30).status_code == 401, url
        forged = {"Authorization": "Bearer not.a.token"}
        assert requests.get(url, headers=forged, timeout=30).status_code in (401, 403), url
        assert requests.get(url, headers=dep.headers(), timeout=30).status_code == 200, url
    missing = _view_url(dep, result).replace(quote(result.run_id, safe=""), "no-such-run")
    assert requests.get(missing, headers=dep.headers(), timeout=30).status_code == 404


def test_the_views_data_has_the_plan_decisions_and_verdict(deployed):
    dep, result = deployed["dep"], _result(deployed)
    data = requests.get(_view_url(dep, result, "/data"), headers=dep.headers(), timeout=30).json()
    (job,) = data["jobs"]
    assert job["group"] == "training" and job["verdict"] == "missed"
    assert job["plan"]["verdict"] in ("best_effort", "guaranteed") and job["plan"]["reason"]
    assert job["decisions"] and all(d["reason"] for d in job["decisions"])
    assert job["progress"] and job["progress"][0]["planned"] is not None
    assert job["finish"]["lateness_s"] > 0


def _page_facts(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """(() => {
          const text = s => [...document.querySelectorAll(s)].map(e => e.textContent.trim());
          const img = document.querySelector('img.report');
          return {
            verdict: text('[data-verdict]'), verdictText: text('#verdict'),
            plan: text('#plan dd'), reasons: text('#decisions td.reason'),
            actions: text('#decisions td.action'), taken: text('#decisions td.taken'),
            progress: text('#progress tr').length - 1,
            image: img ? {src: img.src, width: img.naturalWidth, done: img.complete} : null,
            height: document.documentElement.scrollHeight,
          };
        })()"""
    )


def test_a_browser_shows_the_view_to_a_logged_in_user_and_not_to_others(deployed):
    dep, result = deployed["dep"], _result(deployed)
    view, image = _view_url(dep, result), _image_url(dep, result)
    token = dep.login()  # what the UI's login page does, then it keeps the JWT as a cookie
    with chromium() as page:
        page.size(1280, 900)
        assert page.goto(view) == 401  # nobody logged in yet
        assert page.goto(image) == 401
        page.set_cookie(dep.api_url + "/", "_token", token)
        assert page.goto(view) == 200
        facts = page.wait_for(
            "(() => { const i = document.querySelector('img.report');"
            " return i && i.complete && i.naturalWidth > 0; })()"
        ) and _page_facts(page)
        page.size(1280, max(900, int(facts["height"]) + 20))
        shot = page.screenshot(ARTEFACTS / "plugin-view.png")
        dom = page.dom()
        statuses = dict(page.statuses)
    print(f"screenshot of the qosflow view: {shot}")
    print(json.dumps(facts, indent=1))
    (ARTEFACTS / "plugin-view.html").write_text(dom, encoding="utf-8")
    assert facts["verdict"] == ["missed"]
    assert "deadline missed" in facts["verdictText"][0] and "late" in facts["verdictText"][0]
    assert any(v in facts["plan"] for v in ("best_effort", "guaranteed")), facts["plan"]
    assert facts["reasons"] and all(facts["reasons"]), facts
    assert facts["taken"] and all(facts["taken"]), facts
    assert facts["progress"] >= 1
    assert facts["image"]["width"] > 500, facts["image"]
    served = [s for u, s in statuses.items() if "/report.png" in u]
    assert served == [200], statuses


def test_the_view_is_a_tab_of_the_airflow_ui_run_page(deployed):
    dep, result = deployed["dep"], _result(deployed)
    ui = f"{dep.api_url}/dags/{DAG_ID}/runs/{quote(result.run_id, safe='')}/plugin/qosflow-run"
    with chromium() as page:
        page.size(1400, 1100)
        page.set_cookie(dep.api_url + "/", "_token", dep.login())
        assert page.goto(ui) == 200
        src = page.wait_for(
            "(() => { const f = document.querySelector('iframe[title=\"qosflow\"]');"
            " return f && f.contentDocument && f.contentDocument.querySelector('#verdict')"
            " && f.src; })()",
            timeout_s=90,
        )
        time.sleep(1.0)  # let the frame's image paint
        shot = page.screenshot(ARTEFACTS / "plugin-in-airflow-ui.png")
    print(f"screenshot of the view in the Airflow UI: {shot}")
    assert f"/qosflow/runs/{DAG_ID}/" in src, src


def test_a_report_url_edited_in_xcom_is_never_served(deployed):
    """An XCom pointing the report outside the report roots: 404, even for a real PNG."""
    dep, result = deployed["dep"], _result(deployed)
    report = _finish(result)
    outside = deployed["root"] / "elsewhere" / "stolen.png"
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_bytes(Path(report["png"]).read_bytes())
    run = quote(result.run_id, safe="")
    entry = f"/dags/{DAG_ID}/dagRuns/{run}/taskInstances/training.finish/xcomEntries/report"
    forged = {**report, "report_url": f"file://{outside}"}
    dep.rest("PATCH", entry, {"value": forged, "map_index": -1})
    try:
        got = requests.get(_image_url(dep, result), headers=dep.headers(), timeout=30)
        assert got.status_code == 404, got.text[:200]
    finally:
        with contextlib.suppress(AssertionError):
            dep.rest("PATCH", entry, {"value": report, "map_index": -1})
    assert os.path.exists(outside)  # it was there to be stolen
