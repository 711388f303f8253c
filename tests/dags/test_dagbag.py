from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_file_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    files = sorted(p.name for p in DAGS.glob("qosflow_*.py"))
    assert files == ["qosflow_multi_tenant.py", "qosflow_nightly_retrain.py"]
    assert set(dagbag.dag_ids) == {"qosflow_nightly_retrain", "qosflow_multi_tenant"}


def test_nightly_is_scheduled_at_one_with_a_six_oclock_deadline(dagbag):
    dag = dagbag.dags["qosflow_nightly_retrain"]
    assert dag.timetable.expression == "0 1 * * *"
    assert str(dag.timezone) == "Europe/Amsterdam"
    assert dag.params["deadline"] == "06:00"
    plan = dag.get_task("training.plan")
    assert plan.deadline == "{{ params.deadline }}"
    roots = {t.task_id for t in dag.roots}
    leaves = {t.task_id for t in dag.leaves}
    assert roots == {"prepare_data"}
    assert leaves == {"publish_model"}
    assert dag.get_task("publish_model").upstream_task_ids == {"training.finish"}


def test_multi_tenant_has_three_independent_jobs_on_one_connection(dagbag):
    dag = dagbag.dags["qosflow_multi_tenant"]
    plans = [t for t in dag.tasks if t.task_id.endswith(".plan")]
    assert sorted(t.task_id for t in plans) == [
        "embeddings.plan",
        "forecast.plan",
        "ranking.plan",
    ]
    assert {t.conn_id for t in dag.tasks if hasattr(t, "conn_id")} == {"qosflow_default"}
    deadlines = {t.task_id: t.job["deadline"] for t in plans}
    assert len(set(deadlines.values())) == 3
    # planned one after the other, so each admission sees the jobs already guaranteed
    assert "ranking.submit" in dag.get_task("embeddings.plan").upstream_task_ids
    assert "embeddings.submit" in dag.get_task("forecast.plan").upstream_task_ids
    assert not dag.get_task("ranking.plan").upstream_task_ids
