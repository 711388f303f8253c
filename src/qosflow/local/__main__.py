"""The local-cluster daemon: ``python -m qosflow.local --cpus N --port P --state-dir D``.

Also ``--preemption`` and ``--kubernetes-version 1.N`` (:class:`~qosflow.local.LocalCluster`'s
``preemption`` and ``kubernetes_version``), recorded in ``cluster.json``.

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

from qosflow.local.cli import INFO_FILE, kubernetes_version, stored_token, write_info
from qosflow.local.cluster import LocalCluster
from qosflow.local.kube_version import DEFAULT_KUBERNETES_VERSION
from qosflow.local.supervisor import process_start_ticks

TOKEN_ENV = "QOSFLOW_LOCAL_TOKEN"
LOCK_FILE = ".lock"


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m qosflow.local")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", default=".qosflow/local")
    parser.add_argument("--token", default="", help=f"bearer token (default: ${TOKEN_ENV})")
    parser.add_argument("--progress-tick", type=float, default=1.0)
    parser.add_argument("--preemption", action="store_true")
    parser.add_argument(
        "--kubernetes-version", type=kubernetes_version, default=DEFAULT_KUBERNETES_VERSION
    )
    args = parser.parse_args(argv)
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
        state_dir=state_dir,
        token=token,
        port=args.port,
        progress_tick_s=args.progress_tick,
        preemption=args.preemption,
        kubernetes_version=args.kubernetes_version,
    )
    try:
        cluster.start()
        write_info(
            state_dir,
            {
                "pid": os.getpid(),
                "start_ticks": process_start_ticks(os.getpid()),
                "argo_url": cluster.argo_url,
                "kube_url": cluster.kube_url,
                "namespace": cluster.namespace,
                "token": token,
                "state_dir": str(state_dir),
                "cpus": args.cpus,
                "preemption": args.preemption,
                "kubernetes_version": args.kubernetes_version,
                "isolation": cluster.isolation,
            },
        )
        print(f"serving argo={cluster.argo_url} kube={cluster.kube_url}", flush=True)
        done.wait()
        cluster.stop()
    finally:
        (state_dir / INFO_FILE).unlink(missing_ok=True)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
