"""Session-wide test set-up: a fresh AIRFLOW_HOME (and the DAG bundles) set before anything imports airflow."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

DAGS = Path(__file__).resolve().parents[1] / "dags"

# Every exchange qosflow's client makes with the Argo Server and the Kubernetes API is recorded and
# checked against the published schemas (tests/contract_recorder; QOSFLOW_CONTRACT=off to skip).
pytest_plugins = ["contract_recorder.plugin"]

# One Hypothesis profile for the whole suite: derandomized (every run tries the same examples, so a
# failure reproduces), no per-example deadline (CI machines are shared), and the blob to replay.
settings.register_profile(
    "qosflow",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("qosflow")

if "QOSFLOW_TEST_AIRFLOW_HOME" not in os.environ:
    os.environ["QOSFLOW_TEST_AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="qosflow-airflow-")
os.environ["AIRFLOW_HOME"] = os.environ["QOSFLOW_TEST_AIRFLOW_HOME"]
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
# a second DAG bundle with the scenario DAGs the Airflow tests run (dag.test() needs bundle DAGs)
_LOCAL = "airflow.dag_processing.bundles.local.LocalDagBundle"
_SCENARIOS = Path(__file__).resolve().parent / "airflow" / "dag_files"
os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
    [
        {"name": "dags-folder", "classpath": _LOCAL, "kwargs": {}},
        {"name": "qosflow-tests", "classpath": _LOCAL, "kwargs": {"path": str(_SCENARIOS)}},
    ]
)
