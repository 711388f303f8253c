"""The local cluster's own error: it refused or failed (it depends on nothing else of qosflow).

The local cluster is a stand-in for a real Argo Server and Kubernetes API: clients see its
answers over HTTP, exactly as they see a real cluster's. In-process callers (tests, the daemon)
get this exception, with the HTTP status where it came from an API answer.
"""

from __future__ import annotations


class LocalClusterError(Exception):
    """The local cluster refused or failed.

    Attributes:
        status: HTTP status code when the error is an API answer, else ``None``.
        retryable: Whether the same call may succeed later.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(message)
