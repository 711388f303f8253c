"""A fresh AIRFLOW_HOME per pytest session, set before anything imports airflow."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"

if "QOSFLOW_TEST_AIRFLOW_HOME" not in os.environ:
    os.environ["QOSFLOW_TEST_AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="qosflow-airflow-")
os.environ["AIRFLOW_HOME"] = os.environ["QOSFLOW_TEST_AIRFLOW_HOME"]
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
