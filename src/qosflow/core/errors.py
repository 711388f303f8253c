"""The one small error hierarchy of qosflow.

Every error a user can cause carries the field path and the rule it broke, so the CLI prints one
line (``error: resources.min: must be >= 1 (got 0)``) and the Airflow layer maps it to a
non-retryable failure.
"""

from __future__ import annotations


class QosflowError(Exception):
    """Base class of every error qosflow raises on purpose."""


class SpecError(QosflowError):
    """An invalid job, cluster or trace specification.

    Attributes:
        field: Dotted path of the offending field (``resources.min``), or ``""`` for the whole input.
        rule: The rule it broke, in words (``must be >= 1 (got 0)``).
    """

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}" if field else rule)


class TraceError(SpecError):
    """A bad row in a trace file; the message names the file, line and column."""

    def __init__(self, path: str, line: int, column: str, rule: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        super().__init__(f"{path}:{line}:{column}", rule)


class ClusterError(QosflowError):
    """The cluster (Argo, Kubernetes, the local cluster or the simulator) refused or failed.

    Attributes:
        status: HTTP status code when the error came from an API, else ``None``.
        retryable: Whether retrying the same call may succeed.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(message)


class NotFoundError(ClusterError):
    """The named workflow, pod or object does not exist."""
