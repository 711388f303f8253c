"""The local-cluster daemon: ``python -m qosflow.local --cpus N --port P --state-dir D``.

Started by ``qosflow local up``; writes ``<state-dir>/cluster.json`` once serving and stops cleanly
on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType

from qosflow.local.cli import INFO_FILE, write_info
from qosflow.local.cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m qosflow.local")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state-dir", default=".qosflow/local")
    parser.add_argument("--token", default=os.environ.get("QOSFLOW_LOCAL_TOKEN", ""))
    parser.add_argument("--progress-tick", type=float, default=1.0)
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir).resolve()
    token = args.token or secrets.token_urlsafe(24)
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
    )
    cluster.start()
    write_info(
        state_dir,
        {
            "pid": os.getpid(),
            "argo_url": cluster.argo_url,
            "kube_url": cluster.kube_url,
            "namespace": cluster.namespace,
            "token": token,
            "state_dir": str(state_dir),
            "cpus": args.cpus,
        },
    )
    print(f"serving argo={cluster.argo_url} kube={cluster.kube_url}", flush=True)
    done.wait()
    cluster.stop()
    (state_dir / INFO_FILE).unlink(missing_ok=True)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
