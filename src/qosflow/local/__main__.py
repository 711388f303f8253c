"""The local-cluster daemon: ``python -m qosflow.local --nodes N --cpus C --port P --state-dir D``.

Also ``--gpus G`` and ``--gpu-resource R`` (GPUs per node and their resource name),
``--preemption`` and ``--kubernetes-version 1.N`` (:class:`~qosflow.local.LocalCluster`'s
``gpus``, ``gpu_resource``, ``preemption`` and ``kubernetes_version``), recorded in
``cluster.json`` with the node names.

Started by ``qosflow local up``; writes ``<state-dir>/cluster.json`` once serving and stops cleanly
on SIGTERM or SIGINT, removing ``cluster.json`` however the shutdown goes. One daemon per state
directory (a lock on ``<state-dir>/.lock``; a second one exits with an error). The bearer token is
``--token`` (or ``QOSFLOW_LOCAL_TOKEN``) when given, else the one stored in ``<state-dir>/token``
by an earlier start (a new random one the first time), so clients keep working across restarts.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from qosflow.local.cli import (
    INFO_FILE,
    count,
    gpu_resource,
    kubernetes_version,
    stored_token,
    write_info,
)
from qosflow.local.cluster import LocalCluster
from qosflow.local.kube_version import DEFAULT_KUBERNETES_VERSION
from qosflow.local.supervisor import process_start_ticks
from qosflow.local.topology import GPU_RESOURCE, MAX_NODES

TOKEN_ENV = "QOSFLOW_LOCAL_TOKEN"
LOCK_FILE = ".lock"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m qosflow.local")
    parser.add_argument("--cpus", type=count(1), default=2)
    parser.add_argument("--nodes", type=count(1, MAX_NODES), default=1)
    parser.add_argument("--gpus", type=count(0), default=0)
    parser.add_argument("--gpu-resource", type=gpu_resource, default=GPU_RESOURCE)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", default=".qosflow/local")
    parser.add_argument("--token", default="", help=f"bearer token (default: ${TOKEN_ENV})")
    parser.add_argument("--progress-tick", type=float, default=1.0)
    parser.add_argument("--preemption", action="store_true")
    parser.add_argument(
        "--kubernetes-version", type=kubernetes_version, default=DEFAULT_KUBERNETES_VERSION
    )
    return parser


def _info(cluster: LocalCluster, args: argparse.Namespace, token: str) -> dict[str, Any]:
    """What ``cluster.json`` says of the running cluster."""
    return {
        "pid": os.getpid(),
        "start_ticks": process_start_ticks(os.getpid()),
        "argo_url": cluster.argo_url,
        "kube_url": cluster.kube_url,
        "namespace": cluster.namespace,
        "token": token,
        "state_dir": str(cluster.state_dir),
        "cpus": args.cpus,
        "nodes": args.nodes,
        "node_names": [n.name for n in cluster.nodes.nodes],
        "gpus": args.gpus,
        "gpu_resource": args.gpu_resource,
        "preemption": args.preemption,
        "kubernetes_version": args.kubernetes_version,
        "isolation": cluster.isolation,
    }


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    state_dir = Path(args.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open(state_dir / LOCK_FILE, "a")  # noqa: SIM115 - held (locked) until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"error: another local cluster serves {state_dir}", file=sys.stderr, flush=True)
        return 1
    from_env = os.environ.pop(TOKEN_ENV, "")  # the server's environment never reaches a pod anyway
    token = stored_token(state_dir, args.token or from_env)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = LocalCluster(
        cpus=args.cpus,
        nodes=args.nodes,
        gpus=args.gpus,
        gpu_resource=args.gpu_resource,
        state_dir=state_dir,
        token=token,
        port=args.port,
        progress_tick_s=args.progress_tick,
        preemption=args.preemption,
        kubernetes_version=args.kubernetes_version,
    )
    try:
        cluster.start()
        write_info(state_dir, _info(cluster, args, token))
        print(f"serving argo={cluster.argo_url} kube={cluster.kube_url}", flush=True)
        done.wait()
        cluster.stop()
    finally:
        (state_dir / INFO_FILE).unlink(missing_ok=True)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
