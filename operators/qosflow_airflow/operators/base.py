"""What every qosflow step shares: the connection, the hook, and the mapping of errors.

``QosflowError``s map to Airflow's exceptions: invalid input and refusals
(:class:`~qosflow.core.errors.SpecError`, non-retryable
:class:`~qosflow.core.errors.ClusterError`) fail the task **without retry**; a retryable cluster error
is an ordinary failure that the task's retries may cure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, TypeVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from qosflow.core.errors import ClusterError, QosflowError
from qosflow_airflow.hooks.argo import DEFAULT_CONN_ID, QosflowArgoHook
from qosflow_airflow.state import STATE_KEY, TrainingState, latest_state

T = TypeVar("T")


def airflow_error(exc: QosflowError) -> AirflowException:
    """The Airflow exception a qosflow error becomes (no retry unless the cluster says so)."""
    if isinstance(exc, ClusterError) and exc.retryable:
        return AirflowException(str(exc))
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
