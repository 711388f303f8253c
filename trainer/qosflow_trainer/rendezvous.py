"""``python -m qosflow_trainer.rendezvous``: the rendezvous store of one multi-pod segment.

Argo runs it as a *daemon step* beside the worker pods (``{{steps.NAME.ip}}`` is its address). It
hosts a c10d ``TCPStore`` — the server torchrun's c10d rendezvous keeps its state in — and nothing
else: every worker's torchrun agent is a client (``--rdzv-conf=is_host=false``, what
:mod:`qosflow_trainer.launch` passes), so no worker is special, and any of them may leave or join
while the store lives on. One store serves any number of rendezvous ids.

Variables:

* ``POD_IP`` — this pod's address (default ``0.0.0.0``). The store's server listens on every
  interface of the pod at the port; ``POD_IP`` is the address its own client connects to and the
  one it reports.
* ``QOSFLOW_RDZV_PORT`` — the port (default 29400, torchrun's).

When the server listens it writes one line to stderr, ``{"event": "listening", "host": ...,
"port": ...}`` (a TCP readiness probe on the port passes from then on). SIGTERM or SIGINT ends it
with exit code 0 (``{"event": "stopping", ...}``). Exit codes: ``0`` stopped by a signal, ``1``
the store could not start (e.g. the port is taken), ``2`` a bad variable or PyTorch missing.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from qosflow_trainer.errors import TrainerError, missing_torch
from qosflow_trainer.job import emit
from qosflow_trainer.preemption import EXIT_ERROR, EXIT_OK, EXIT_USAGE

PORT_ENV = "QOSFLOW_RDZV_PORT"
POD_IP_ENV = "POD_IP"
DEFAULT_PORT = 29400
DEFAULT_HOST = "0.0.0.0"  # a pod's store serves the other pods
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def address(environ: Mapping[str, str]) -> tuple[str, int]:
    """The ``(host, port)`` to serve on, from ``POD_IP`` and ``QOSFLOW_RDZV_PORT``.

    Raises:
        TrainerError: Naming the variable, when it is not an IP address or a port.
    """
    host = environ.get(POD_IP_ENV, "").strip() or DEFAULT_HOST
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        raise TrainerError(POD_IP_ENV, f"must be an IP address (got {host!r})") from None
    text = environ.get(PORT_ENV, "").strip() or str(DEFAULT_PORT)
    try:
        port = int(text)
    except ValueError:
        raise TrainerError(PORT_ENV, f"must be an integer (got {text!r})") from None
    if not 1 <= port <= 65535:
        raise TrainerError(PORT_ENV, f"must be in 1..65535 (got {port})")
    return host, port


def serve(host: str, port: int, *, stderr: TextIO = sys.stderr) -> int:
    """Host the store until SIGTERM or SIGINT; the exit code.

    The stop signals are blocked first and then awaited with ``sigwait``: one that arrives while
    PyTorch loads is not lost, and the store's server thread never runs a Python handler.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise missing_torch("python -m qosflow_trainer.rendezvous") from None
    try:
        store: Any = TCPStore(host, port, is_master=True, wait_for_workers=False)
    except RuntimeError as exc:  # DistNetworkError and friends: the port is taken, ...
        emit(stderr, "error", host=host, port=port, error=str(exc).splitlines()[0])
        return EXIT_ERROR
    emit(stderr, "listening", host=host, port=port, pid=os.getpid())
    signum = signal.sigwait(STOP_SIGNALS)
    emit(stderr, "stopping", signal=signal.Signals(signum).name)
    del store
    return EXIT_OK


def main(environ: Mapping[str, str] | None = None) -> int:
    """Check the variables and serve; the exit code."""
    try:
        host, port = address(os.environ if environ is None else environ)
        return serve(host, port)
    except TrainerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
