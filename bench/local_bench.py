"""Local-cluster figures as ``key: value`` lines.

1. ``local_get_status_p50_ms`` / ``local_get_status_p99_ms``: 20 concurrent clients (one
   keep-alive ``requests`` session each) doing ``GET /api/v1/workflows/{ns}/{name}`` on loopback,
   a bounded number of requests each, against the ``qosflow local up`` daemon (its own process)
   while its controller ticks a running workflow at the default period. Latency is per request,
   client side (the 20 client threads share this process).
2. ``stop_to_resume_s``: the reference trainer as a pod of the rendered ``qosflow-train``
   template; stop it (SIGTERM -> checkpoint), wait until the workflow is Failed, submit segment 1
   with resume, and time from the stop request to the first progress report of the new pod beyond
   the checkpointed step. Default controller period (1 s), polled every 20 ms.

Run: ``.venv/bin/python bench/local_bench.py`` (``--requests N`` per client, ``--clients C``).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from qosflow.local import LocalCluster
from qosflow.local.cli import read_info

NS = "qosflow"
TEMPLATES = Path(__file__).resolve().parents[1] / "argo_templates"


def _session(token: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def _container_workflow(name: str) -> dict[str, Any]:
    container = {
        "image": "x",
        "command": ["python", "-c", "pass"],
        "env": [{"name": "QOSFLOW_TOTAL_STEPS", "value": "100000"}],
        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
    }
    return {
        "workflow": {
            "metadata": {"name": name},
            "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": container}]},
        }
    }


def _daemon(state: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``python -m qosflow.local`` (the ``qosflow local up`` daemon) on free ports."""
    command = [sys.executable, "-m", "qosflow.local", "--port", "0", "--state-dir", str(state)]
    daemon = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = read_info(state)
        if info is not None and info["pid"] == daemon.pid:
            return daemon, info
        time.sleep(0.05)
    daemon.kill()
    raise RuntimeError("the local cluster daemon did not start")


def get_status_latency(clients: int, per_client: int) -> dict[str, float]:
    """Client-side latency of GET workflow under concurrent clients (server in its own process)."""
    with tempfile.TemporaryDirectory() as tmp:
        daemon, info = _daemon(Path(tmp))
        try:
            url = f"{info['argo_url']}/api/v1/workflows/{NS}"
            session = _session(info["token"])
            session.post(url, json=_container_workflow("bench"), timeout=10).raise_for_status()
            while (
                session.get(f"{url}/bench", timeout=10).json()["status"].get("phase") != "Running"
            ):
                time.sleep(0.05)
            latencies, wall = _hammer(f"{url}/bench", info["token"], clients, per_client)
            session.put(f"{url}/bench/terminate", timeout=10)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return {
        "local_get_status_p50_ms": statistics.median(latencies) * 1000,
        "local_get_status_p99_ms": p99 * 1000,
        "local_get_status_requests": float(len(latencies)),
        "local_get_status_rps": len(latencies) / wall,
    }


def _hammer(url: str, token: str, clients: int, per_client: int) -> tuple[list[float], float]:
    """``clients`` threads, each ``per_client`` GETs on its own keep-alive session."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client() -> None:
        session = _session(token)
        mine = []
        start.wait()
        for _ in range(per_client):
            began = time.perf_counter()
            response = session.get(url, timeout=10)
            mine.append(time.perf_counter() - began)
            response.raise_for_status()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - began


CLAIM = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "bench-checkpoints"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}
"""The checkpoints live on a claim both segments mount: a pod's own disk dies with it."""


def _segment(name: str, checkpoints: str, segment: int, steps: int) -> dict[str, Any]:
    params = {
        "job": "bench",
        "segment": str(segment),
        "steps": str(steps),
        "units": "1",
        "memory": "256Mi",
        "checkpoint_dir": checkpoints,
        "checkpoint_every": "1000",
        "resume": "auto",
    }
    return {
        "workflow": {
            "metadata": {"name": name},
            "spec": {
                "workflowTemplateRef": {"name": "qosflow-train"},
                "arguments": {"parameters": [{"name": k, "value": v} for k, v in params.items()]},
                "volumes": [
                    {"name": "ckpt", "persistentVolumeClaim": {"claimName": "bench-checkpoints"}}
                ],
                "templateDefaults": {
                    "container": {"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}
                },
            },
        }
    }


def _progress(cluster: LocalCluster, name: str) -> tuple[str, int]:
    status = (cluster.workflow(name) or {}).get("status", {})
    return str(status.get("phase") or ""), int((status.get("progress") or "0/1").split("/")[0])


def stop_to_resume(steps: int = 2000) -> dict[str, float]:
    """Seconds from a stop request to the first new progress of the resumed segment."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(cpus=2, state_dir=Path(tmp) / "state") as cluster,
    ):
        session = _session(cluster.token)
        for doc in yaml.safe_load_all((TEMPLATES / "priority-classes.yaml").read_text()):
            session.post(
                f"{cluster.kube_url}/apis/scheduling.k8s.io/v1/priorityclasses",
                json=doc,
                timeout=10,
            )
        template = yaml.safe_load((TEMPLATES / "workflow-template.yaml").read_text())
        session.post(
            f"{cluster.argo_url}/api/v1/workflow-templates/{NS}",
            json={"template": template},
            timeout=10,
        )
        session.post(
            f"{cluster.kube_url}/api/v1/namespaces/{NS}/persistentvolumeclaims",
            json=CLAIM,
            timeout=10,
        ).raise_for_status()
        checkpoints = "/ckpt/bench"
        base = f"{cluster.argo_url}/api/v1/workflows/{NS}"
        session.post(
            base, json=_segment("bench-s0", checkpoints, 0, steps), timeout=10
        ).raise_for_status()
        cluster.wait_until(
            lambda: _progress(cluster, "bench-s0")[1] >= 10, timeout_s=300, poll_s=0.02
        )
        stopped_at = time.perf_counter()
        session.put(f"{base}/bench-s0/stop", timeout=10).raise_for_status()
        cluster.wait_until(
            lambda: _progress(cluster, "bench-s0")[0] == "Failed", timeout_s=120, poll_s=0.02
        )
        ended_at = time.perf_counter()
        checkpointed = _progress(cluster, "bench-s0")[1]
        session.post(
            base, json=_segment("bench-s1", checkpoints, 1, steps), timeout=10
        ).raise_for_status()
        cluster.wait_until(
            lambda: _progress(cluster, "bench-s1")[1] > checkpointed, timeout_s=300, poll_s=0.02
        )
        resumed_at = time.perf_counter()
        session.put(f"{base}/bench-s1/terminate", timeout=10)
    return {
        "stop_to_resume_s": resumed_at - stopped_at,
        "stop_to_stopped_s": ended_at - stopped_at,
        "stop_checkpointed_step": float(checkpointed),
    }


def main() -> int:
    """Print every figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    args = parser.parse_args()
    figures = get_status_latency(args.clients, args.requests)
    figures["local_get_status_clients"] = float(args.clients)
    if (TEMPLATES / "workflow-template.yaml").exists():
        figures.update(stop_to_resume())
    for key, value in figures.items():
        print(f"{key}: {value:.3f}" if not float(value).is_integer() else f"{key}: {int(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
