"""DAG parse time per example DAG file, as Airflow's DagBag measures it.

Each file is parsed in a fresh interpreter (airflow already imported, the qosflow provider not),
so the figure includes the provider import a DAG processor pays once per file process. Prints
``dag_parse_s_<module>: seconds`` (median of 3 runs) and the task count per file.

    .venv/bin/python bench/dag_bench.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DAGS = Path(__file__).resolve().parents[1] / "dags"
RUNS = 3

_CHILD = """
import json, sys
import airflow.sdk  # noqa: F401  (airflow itself is not what we measure)
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
stat = bag.dagbag_stats[0]
duration = stat.duration.total_seconds() if hasattr(stat.duration, "total_seconds") else stat.duration
print(json.dumps({"s": duration, "tasks": stat.task_num, "errors": len(bag.import_errors)}))
"""


def parse_once(path: Path, home: str) -> dict[str, float]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    }
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="qosflow-dagbench-") as home:
        for path in sorted(DAGS.glob("qosflow_*.py")):
            runs = [parse_once(path, home) for _ in range(RUNS)]
            if any(r["errors"] for r in runs):
                print(f"dag_import_errors_{path.stem}: {runs[0]['errors']}")
                return 1
            print(f"dag_parse_s_{path.stem}: {statistics.median(r['s'] for r in runs):.4f}")
            print(f"dag_tasks_{path.stem}: {int(runs[0]['tasks'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
