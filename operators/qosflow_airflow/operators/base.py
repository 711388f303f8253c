"""What every qosflow step shares: the connection, the hook, and the mapping of errors.

``QosflowError``s map to Airflow's exceptions: invalid input and refusals
(:class:`~qosflow.core.errors.SpecError`, non-retryable
:class:`~qosflow.core.errors.ClusterError`) fail the task **without retry**; a retryable cluster error
and a transient history-store error (:func:`transient_store_error`: ``database is locked`` after
the busy timeout, a dropped or refused database connection) are ordinary failures that the task's
retries may cure.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, TypeVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from qosflow.core.errors import ClusterError, QosflowError
from qosflow_airflow.hooks.argo import DEFAULT_CONN_ID, QosflowArgoHook
from qosflow_airflow.state import STATE_KEY, TrainingState, latest_state

T = TypeVar("T")


_TRANSIENT_DB = frozenset(
    {"OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError"}
)
"""SQLAlchemy (and DB-API) errors of a database that is busy or out of reach, not of bad input."""
_LOCKED = ("database is locked", "database table is locked")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``'s causes and contexts (``raise … from None`` keeps the context), nearest first."""
    out: list[BaseException] = []
    nxt: BaseException | None = exc.__cause__ or exc.__context__
    while nxt is not None and nxt not in out and len(out) < 8:
        out.append(nxt)
        nxt = nxt.__cause__ or nxt.__context__
    return out


def transient_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a history-store failure that may pass: a lock, a lost connection.

    A :class:`~qosflow.store.history.HistoryError` caused by a SQLAlchemy or DB-API
    ``OperationalError`` (``database is locked`` after the busy timeout, connection refused),
    ``InterfaceError``, ``DisconnectionError``, a pool ``TimeoutError`` or a network error, or
    saying ``database is locked``. A missing driver, a corrupt file, a permission or a schema
    error is not.
    """
    history = sys.modules.get("qosflow.store.history")  # not loaded: no store error possible
    if history is None or not isinstance(exc, history.HistoryError):
        return False
    if any(word in str(exc) for word in _LOCKED):
        return True
    for cause in _chain(exc):
        network = isinstance(cause, ConnectionError | TimeoutError)
        if network or {c.__name__ for c in type(cause).__mro__} & _TRANSIENT_DB:
            return True
    return False


def airflow_error(exc: QosflowError) -> AirflowException:
    """The Airflow exception a qosflow error becomes (no retry unless it may pass)."""
    if isinstance(exc, ClusterError) and exc.retryable:
        return AirflowException(str(exc))
    if transient_store_error(exc):
        return AirflowException(f"{exc} (transient: the task's retries may cure it)")
    return AirflowFailException(str(exc))


def guarded(call: Callable[[], T]) -> T:
    """Run ``call``, re-raising qosflow errors as the matching Airflow exception."""
    try:
        return call()
    except QosflowError as exc:
        raise airflow_error(exc) from exc


class QosflowOperator(BaseOperator):
    """Base of the qosflow steps: a connection id and a lazily built hook.

    Args:
        conn_id: The ``qosflow_argo`` connection (default ``qosflow_default``).
        state_task_ids: Tasks whose ``state`` XCom carries the job's current segment, newest
            first; the first that pushed one wins (the task-group factory fills this in).
    """

    template_fields: Sequence[str] = ("conn_id",)

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        state_task_ids: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.state_task_ids = list(state_task_ids)

    @cached_property
    def hook(self) -> QosflowArgoHook:
        """The hook of ``conn_id`` (built on first use, never in ``__init__``)."""
        return QosflowArgoHook(self.conn_id)

    def current_state(self, context: Any) -> TrainingState:
        """The newest training state among ``state_task_ids``."""
        state = latest_state(context["ti"], self.state_task_ids)
        if state is None:
            raise AirflowFailException(
                f"no training state found in XCom of {self.state_task_ids}: was the job submitted?"
            )
        return state

    @staticmethod
    def push_state(context: Any, state: TrainingState) -> None:
        """Publish the new state for the steps downstream."""
        context["ti"].xcom_push(key=STATE_KEY, value=state.to_dict())
