"""Issue 17's acceptance: a DAG run rescales by checkpoint-restart and resumes where it stopped.

The local cluster says it is Kubernetes 1.32 (no ``pods/resize``), so every rescale is a
checkpoint-restart: stop (the trainer checkpoints on SIGTERM) → a new segment, a new pod, resumed
from the checkpoint. The checkpoints live on the connection's claim; each pod's own file system,
its working directory included, is private to it, as on Kubernetes. The same job on a connection
without a checkpoint claim is refused at plan, and nothing is submitted.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCENARIOS = Path(__file__).parent / "dag_files" / "qosflow_test_scenarios.py"
WIDTH = 256
PROBE = (
    'echo "probe: pod=$HOSTNAME cwd=$(pwd) saw=$(ls -A | tr "\\n" " ")" >&2; '
    "echo $HOSTNAME > left-by-a-pod; "
    f"exec python -m qosflow_trainer --width={WIDTH}"
)
"""Says what the pod's working directory holds, leaves a file there, then trains."""


@pytest.fixture(scope="module")
def old_cluster(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A 2-CPU local cluster that is Kubernetes 1.32, qosflow installed, a connection to it."""
    from qosflow.local.cluster import LocalCluster
    from qosflow_airflow.hooks.argo import LOCAL_CHECKPOINT_CLAIM, local_connection
    from qosflow_argo import ArgoCluster

    root = tmp_path_factory.mktemp("restart")
    saved = os.environ.get("AIRFLOW_CONN_QOSFLOW_DEFAULT")
    with LocalCluster(
        cpus=2, state_dir=root / "local", token="restart-token", kubernetes_version="1.32"
    ) as local:
        with ArgoCluster.from_local(local) as cluster:
            cluster.ensure_installed(checkpoint_claim=LOCAL_CHECKPOINT_CLAIM)
            assert not cluster.supports_in_place_resize("cpu")
        conn = local_connection(local, history_url=f"sqlite:///{root / 'history.db'}")
        os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = json.dumps(conn)
        try:
            yield local, conn
        finally:
            if saved is None:
                os.environ.pop("AIRFLOW_CONN_QOSFLOW_DEFAULT", None)
            else:
                os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = saved


def _run(name: str, steps: int, tmp_path: Path, **conf: Any) -> tuple[Any, dict[str, Any]]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(SCENARIOS))
    assert bag.import_errors == {}
    base = {"name": name, "steps": steps, "deadline": "PT300S", "width": WIDTH}
    run = bag.dags["qosflow_test_scenarios"].test(
        run_conf={**base, "report_dir": str(tmp_path), "command": ["sh", "-c", PROBE], **conf}
    )
    return run, {ti.task_id: ti for ti in run.get_task_instances()}


def _logs(cluster: Any, workflow: str) -> str:
    pods = cluster.kube.list_pods(f"workflows.argoproj.io/workflow={workflow}")
    return "".join(cluster.kube.pod_log(p["metadata"]["name"], tail_lines=100000) for p in pods)


def _events(log: str, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if line.startswith("{") and f'"event": "{event}"' in line:
            out.append(json.loads(line))
    return out


def test_a_rescale_is_a_checkpoint_restart_that_resumes_where_the_job_stopped(
    old_cluster: Any, tmp_path: Path
) -> None:
    from qosflow_airflow.demo import trainer_rate
    from qosflow_argo import ArgoCluster

    local, _conn = old_cluster
    steps = int(trainer_rate(WIDTH, seconds=6.0) * 45)  # ~45 s on one CPU, due in 300 s
    name = f"restart-{uuid.uuid4().hex[:6]}"
    run, tis = _run(name, steps, tmp_path, initial_units=2)
    acts = [
        tis[t].xcom_pull(task_ids=t)
        for t in sorted(tis)
        if t.endswith(".rescale") and tis[t].state == "success"
    ]
    report = tis["training.finish"].xcom_pull(task_ids="training.finish")
    assert run.state == "success", report
    restarts = [a for a in acts if a.get("how") == "restart"]
    assert restarts, acts  # 2 -> 1 CPU, and no in-place resize on this cluster
    with ArgoCluster.from_local(local) as cluster:
        segments = sorted(
            (w for w in cluster.list_jobs() if w.job.rsplit("-", 1)[0] == name),
            key=lambda w: w.segment,
        )
        assert len(segments) == 1 + len(restarts)
        assert (segments[-1].steps_done, segments[-1].total_steps) == (steps, steps)
        logs = [_logs(cluster, s.name) for s in segments]
    for before, after, act in zip(logs[:-1], logs[1:], restarts, strict=True):
        (stopped,) = _events(before, "stopped")  # the SIGTERM checkpoint
        (resumed,) = _events(after, "resume")
        assert resumed["step"] >= stopped["steps"] == act["resumed_from"], (stopped, resumed)
        print(f"{act['workflow']}: stopped at {stopped['steps']}, resumed at {resumed['step']}")
        # a private working directory: the file the last pod left there is not in the next
        saw = [line for line in after.splitlines() if line.startswith("probe: ")]
        assert saw and "left-by-a-pod" not in saw[0], saw
    assert "left-by-a-pod" not in "".join(
        line for line in logs[0].splitlines() if line.startswith("probe: ")
    )


def test_the_same_job_without_a_checkpoint_volume_is_refused_at_plan(
    old_cluster: Any, tmp_path: Path
) -> None:
    from qosflow_argo import ArgoCluster

    local, conn = old_cluster
    bare = {**conn, "extra": {k: v for k, v in conn["extra"].items() if k != "checkpoint_claim"}}
    os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = json.dumps(bare)
    try:
        name = f"nodisk-{uuid.uuid4().hex[:6]}"
        run, tis = _run(name, 100, tmp_path, initial_units=1)
    finally:
        os.environ["AIRFLOW_CONN_QOSFLOW_DEFAULT"] = json.dumps(conn)
    assert run.state == "failed"
    assert tis["training.plan"].state == "failed"
    assert tis["training.submit"].state == "upstream_failed"
    with ArgoCluster.from_local(local) as cluster:
        assert [w for w in cluster.list_jobs() if w.job.startswith(name)] == []
