"""A missed deadline is loud, and the report is stored where the api-server reads it (no cluster).

A job planned at 1 CPU that needs 2, whose finish step only waits (``steer=False``), ends 60 s
after its deadline on the fake cluster. The finish step records the history and writes the
report first, then: ``on_miss="fail"`` (the default) fails without retry with the result under
the XCom key ``report``; ``"warn"`` succeeds; a callable gets the result (and may raise). Its
XCom says ``met``, ``lateness_s`` and ``margin_s``, and it counts the end once in the metrics.
The report goes under the ``report_dir`` override, else the connection's ``report_url``, else
``$AIRFLOW_HOME/qosflow/reports`` — never the working directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowFailException


def job(**over: Any) -> dict[str, Any]:
    data = {
        "name": "late-job",
        "total_steps": 300,
        "deadline": "PT4M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "dwell_seconds": 10,
        "margin_seconds": 5,
        "step_seconds_estimate": 1.0,
    }
    data.update(over)
    return data


class TI:
    """The XComs of one DAG run, as the steps see them."""

    def __init__(self) -> None:
        self.task_id = "plan"
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = value


def _context(ti: TI, task_id: str, run: bool = False) -> dict[str, Any]:
    ti.task_id = task_id
    ctx: dict[str, Any] = {"ti": ti, "dag": None}
    if run:
        ctx.update(run_id="manual__2026-01-01T00:00:00+00:00", dag=SimpleNamespace(dag_id="d"))
    return ctx


def _planned(ti: TI, **over: Any) -> None:
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator

    plan = PlanTrainingOperator(task_id="plan", job=job(**over), initial_units=1)
    ti.xcoms[("plan", "return_value")] = plan.execute({**_context(ti, "plan"), "run_id": "r1"})
    submit = SubmitTrainingOperator(task_id="submit", plan_task_id="plan")
    submit.execute({**_context(ti, "submit"), "run_id": "r1"})


def _finish(**kw: Any) -> Any:
    from qosflow_airflow.operators.finish import FinishTrainingOperator

    kw.setdefault("steer", False)  # only wait: the job stays at 1 CPU and ends 60 s late
    return FinishTrainingOperator(
        task_id="finish",
        plan_task_id="plan",
        state_task_ids=["submit"],
        poll_interval=0.0,
        hold_seconds=0.0,
        deferrable=False,
        **kw,
    )


def _samples(fake_cluster: Any) -> int:
    from qosflow.store.history import HistoryStore

    conn = json.loads(os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"])
    store = HistoryStore(conn["extra"]["history_url"])
    try:
        return store.count_samples()
    finally:
        store.close()


def test_a_miss_fails_the_step_without_retry_after_recording_and_reporting(fake_cluster, tmp_path):
    ti = TI()
    _planned(ti)
    with pytest.raises(AirflowFailException, match=r"deadline MISSED, 1 min late") as failed:
        _finish(report_dir=str(tmp_path)).execute(_context(ti, "finish"))
    assert "on_miss='warn'" in str(failed.value)
    result = ti.xcoms[("finish", "report")]
    assert result["outcome"] == "missed" and result["met"] is False
    assert result["lateness_s"] == 60.0 and result["margin_s"] == -60.0
    assert Path(result["png"]).read_bytes()[:4] == b"\x89PNG"
    assert _samples(fake_cluster) > 0  # the next run learns from it anyway


def test_warn_lets_a_miss_pass_with_a_warning(fake_cluster, tmp_path, capsys):
    ti = TI()
    _planned(ti)
    result = _finish(report_dir=str(tmp_path), on_miss="warn").execute(_context(ti, "finish"))
    assert result["met"] is False and result["lateness_s"] == 60.0
    assert ("finish", "report") not in ti.xcoms
    assert "MISSED, 1 min late (on_miss='warn': the task succeeds)" in capsys.readouterr().out


def test_a_callable_gets_the_finish_xcom_and_may_raise(fake_cluster, tmp_path):
    seen: list[dict[str, Any]] = []
    ti = TI()
    _planned(ti)
    result = _finish(report_dir=str(tmp_path), on_miss=seen.append).execute(_context(ti, "finish"))
    assert seen == [result] and seen[0]["lateness_s"] == 60.0

    def page_someone(result: dict[str, Any]) -> None:
        raise RuntimeError(f"paged: {result['job']} {result['lateness_s']:.0f} s late")

    ti = TI()
    fake_cluster.jobs.clear()
    _planned(ti, name="late-job-2")
    with pytest.raises(AirflowFailException, match=r"on_miss raised.*paged: late-job-2 60 s late"):
        _finish(report_dir=str(tmp_path), on_miss=page_someone).execute(_context(ti, "finish"))
    assert ti.xcoms[("finish", "report")]["met"] is False


def test_a_met_deadline_calls_nothing_and_says_its_margin(fake_cluster, tmp_path):
    fake_cluster.rate = 3.0  # 300 steps at 3/s: done in 100 s of a 4 min deadline
    called = mock.Mock()
    ti = TI()
    _planned(ti)
    result = _finish(report_dir=str(tmp_path), on_miss=called).execute(_context(ti, "finish"))
    called.assert_not_called()
    assert result["outcome"] == "met" and result["met"] is True
    assert result["margin_s"] > 0 and result["lateness_s"] == -result["margin_s"]


def test_each_end_is_counted_once_in_the_metrics(fake_cluster, tmp_path):
    from qosflow_airflow import metrics

    ti = TI()
    _planned(ti)
    with mock.patch.object(metrics, "job_finished") as counted:
        _finish(report_dir=str(tmp_path), on_miss="warn").execute(_context(ti, "finish"))
    plan = ti.xcoms[("plan", "return_value")]
    counted.assert_called_once_with(
        plan["job"]["key"],
        met=False,
        lateness_s=60.0,
        guaranteed=plan["verdict"] == "guaranteed",
    )


def test_on_miss_must_be_fail_warn_or_a_callable():
    from qosflow_airflow.operators.finish import FinishTrainingOperator

    with pytest.raises(ValueError, match="on_miss"):
        FinishTrainingOperator(task_id="f", plan_task_id="p", on_miss="panic")


# ------------------------------------------------------------------ where the report goes


def test_reports_go_to_the_connections_report_url_by_run(fake_cluster, tmp_path, monkeypatch):
    conn = json.loads(os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"])
    conn["extra"]["report_url"] = f"file://{tmp_path}/store"
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_DEFAULT", json.dumps(conn))
    ti = TI()
    _planned(ti)
    result = _finish(on_miss="warn").execute(_context(ti, "finish", run=True))
    run = "manual__2026-01-01T00_00_00_00_00"
    assert result["png"] == f"{tmp_path}/store/d/{run}/late-job.png"
    assert result["report_url"] == f"file://{tmp_path}/store/d/{run}/late-job.png"
    assert Path(result["png"]).is_file()


def test_by_default_reports_go_under_airflow_home_never_the_working_directory(
    fake_cluster, tmp_path, monkeypatch
):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.chdir(cwd)
    ti = TI()
    _planned(ti)
    result = _finish(on_miss="warn").execute(_context(ti, "finish", run=True))
    assert Path(result["png"]).is_relative_to(home / "qosflow" / "reports" / "d")
    relative = _finish(on_miss="warn", report_dir="my/reports")
    ti2 = TI()
    fake_cluster.jobs.clear()
    _planned(ti2, name="late-job-2")
    got = relative.execute(_context(ti2, "finish", run=True))
    assert Path(got["png"]).is_relative_to(home / "my" / "reports")
    assert list(cwd.iterdir()) == []  # nothing written where the worker happened to start


# ------------------------------------------------------------------ the task group and the alert


def test_the_task_group_passes_on_miss_and_report_dir_and_links_every_task():
    from airflow.sdk import DAG

    from qosflow_airflow.plugin.links import QosflowViewLink
    from qosflow_airflow.task_group import deadline_training

    with DAG("tg", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        deadline_training(job(), rounds=1, group_id="t", on_miss="warn", report_dir="s3://b/r")
    finish = dag.get_task("t.finish")
    assert finish.on_miss == "warn" and finish.report_dir == "s3://b/r"
    for task in dag.tasks:
        assert [type(link) for link in task.operator_extra_links] == [QosflowViewLink], task
    with DAG("tg2", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag2:
        deadline_training(job(), rounds=1, group_id="t")
    assert dag2.get_task("t.finish").on_miss == "fail"  # the default
    assert dag2.get_task("t.finish").report_dir is None


def test_the_view_link_names_the_run_and_the_task(monkeypatch):
    from qosflow_airflow.plugin.links import QosflowViewLink

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/")
    key = SimpleNamespace(dag_id="d", run_id="manual__2026-01-01T00:00:00+00:00", task_id="t.plan")
    url = QosflowViewLink().get_link(None, ti_key=key)
    assert url == (
        "https://airflow.example/qosflow/runs/d/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
        "?task=t.plan"
    )


def test_a_deadline_alert_from_the_jobs_deadline():
    from airflow.sdk.definitions.deadline import (
        DagRunLogicalDateDeadline,
        DagRunQueuedAtDeadline,
        FixedDatetimeDeadline,
    )

    from qosflow_airflow import deadline_alert
    from qosflow_airflow.alerts import CALLBACK

    alert = deadline_alert(job(deadline="PT1H30M"))
    assert isinstance(alert.reference, DagRunQueuedAtDeadline)
    assert alert.interval.total_seconds() == 5400
    assert alert.callback.path == CALLBACK
    assert alert.callback.kwargs["job"] == "late-job"
    logical = deadline_alert("PT10M", anchor="logical")
    assert isinstance(logical.reference, DagRunLogicalDateDeadline)
    fixed = deadline_alert("2026-12-01T06:00:00Z")
    assert isinstance(fixed.reference, FixedDatetimeDeadline)
    for bad in ("{{ params.deadline }}", "06:00", "PT0S"):
        with pytest.raises(ValueError, match="deadline"):
            deadline_alert(bad)


def test_a_dag_with_the_alert_serialises_with_our_callback():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from qosflow_airflow import deadline_alert

    with DAG(
        "alerted",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1),
        deadline=deadline_alert("PT30S"),
    ) as dag:
        pass
    text = json.dumps(DagSerialization.to_dict(dag))
    assert "qosflow_airflow.alerts.deadline_missed" in text


def test_the_alerts_callback_logs_and_records_the_miss(caplog):
    import asyncio

    from qosflow_airflow.alerts import deadline_missed

    context = {
        "dag_run": {"dag_id": "d", "dag_run_id": "r"},
        "deadline": {"deadline_time": "2026-01-01T00:00:30+00:00"},
    }
    output = asyncio.run(deadline_missed("late-job", "PT30S", "queued", context=context))
    assert isinstance(output, str)  # the callback table's output is text (a dict breaks 3.3.2)
    record = json.loads(output)
    assert record["dag_id"] == "d" and record["run_id"] == "r" and record["job"] == "late-job"
    assert "qosflow deadline missed: late-job of d/r" in caplog.text
