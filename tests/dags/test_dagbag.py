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


def test_multi_tenant_sizes_three_jobs_at_the_start_and_lets_them_arrive_in_turn(dagbag):
    dag = dagbag.dags["qosflow_multi_tenant"]
    plans = {t.task_id: t for t in dag.tasks if t.task_id.endswith(".plan")}
    assert sorted(plans) == ["embeddings.plan", "forecast.plan", "ranking.plan"]
    assert {t.conn_id for t in dag.tasks if hasattr(t, "conn_id")} == {"qosflow_default"}
    for plan in plans.values():
        assert "xcom_pull(task_ids='measure')" in plan.deadline
        assert "xcom_pull(task_ids='measure')" in plan.job["total_steps"]
        assert plan.deadline_anchor == "plan"
    assert dag.get_task("forecast.plan").upstream_task_ids == {"measure"}
    assert dag.get_task("ranking_arrives").upstream_task_ids == {"forecast.submit"}
    assert dag.get_task("ranking.plan").upstream_task_ids == {"ranking_arrives"}
    assert dag.get_task("embeddings_arrives").upstream_task_ids == {"ranking.submit"}
    assert dag.get_task("embeddings.plan").upstream_task_ids == {"embeddings_arrives"}
    assert {t.task_id for t in dag.roots} == {"measure"}


@pytest.mark.slow  # starts interpreters
@pytest.mark.beside
def test_parsing_a_dag_imports_no_scipy_and_no_watch():
    """The dag-processor parses every file often: the heavy core stays out until a task runs."""
    import subprocess
    import sys

    code = (
        "import sys, runpy; runpy.run_path(sys.argv[1]); "
        "print(sorted(m for m in ('scipy', 'qosflow_airflow.watch') if m in sys.modules))"
    )
    for name in ("qosflow_nightly_retrain.py", "qosflow_multi_tenant.py"):
        path = DAGS / name
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip().splitlines()[-1] == "[]", (name, out.stdout, out.stderr[-2000:])
