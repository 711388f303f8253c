"""``DeadlineProgressSensor``: one round's watch of the training job.

Deferrable by default: the worker slot is released and
:class:`~qosflow_airflow.triggers.progress.DeadlineProgressTrigger` watches from the triggerer.
With ``deferrable=False`` it pokes with the same :class:`~qosflow_airflow.watch.Watcher` (poke
mode keeps the watcher between pokes; reschedule mode is not supported). Either way it ends with
one event: ``done``, a decision that held for the dwell time, or a failure — a failed training pod
fails the task with the pod's message, and nothing is resubmitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from qosflow.core.errors import QosflowError
from qosflow_airflow.hooks.argo import DEFAULT_CONN_ID, QosflowArgoHook
from qosflow_airflow.state import STATE_KEY, latest_state, samples_from_rows, watch_rows
from qosflow_airflow.triggers.progress import (
    ERROR,
    DeadlineProgressTrigger,
    new_watcher,
    poll_once,
)

if TYPE_CHECKING:
    from qosflow_airflow.watch import EndWatch, WatchPurpose

FAILED = "failed"  # qosflow_airflow.watch.FAILED

WATCH_KEYS = (
    "status",
    "workflow",
    "time",
    "decision",
    "message",
    "samples",
    "finished_at",
    "units",
)


class DeadlineProgressSensor(BaseSensorOperator):
    """Watch progress against the deadline until the job ends or a decision holds.

    Args:
        state_task_ids: Tasks whose ``state`` XCom holds the current segment, newest first.
        watch_task_ids: Earlier watch tasks whose samples feed the speed fit.
        conn_id: The ``qosflow_argo`` connection.
        poll_interval: Seconds between polls of the cluster.
        hold_seconds: How long an actionable decision must hold (default: the job's dwell time).
        purpose: ``steer`` (decide for one round) or ``await_end`` (wait for the end only).
        deferrable: Watch from the triggerer (default) instead of poking in a worker slot.
        settle_seconds: The trigger's least wait before it fires (see
            :class:`~qosflow_airflow.triggers.progress.DeadlineProgressTrigger`).
        **kwargs: Sensor arguments (``timeout``...).
    """

    template_fields: Sequence[str] = ("conn_id", "state_task_ids", "watch_task_ids")

    def __init__(
        self,
        *,
        state_task_ids: Sequence[str],
        watch_task_ids: Sequence[str] = (),
        conn_id: str = DEFAULT_CONN_ID,
        poll_interval: float = 5.0,
        hold_seconds: float | None = None,
        purpose: WatchPurpose = "steer",
        deferrable: bool = True,
        settle_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        kwargs.setdefault("mode", "poke")
        super().__init__(**kwargs)
        self.state_task_ids = list(state_task_ids)
        self.watch_task_ids = list(watch_task_ids)
        self.conn_id = conn_id
        self.poll_interval = poll_interval
        self.hold_seconds = hold_seconds
        self.purpose: WatchPurpose = purpose
        self.deferrable = deferrable
        self.settle_seconds = settle_seconds
        self._poking: tuple[Any, EndWatch] | None = None

    @cached_property
    def hook(self) -> QosflowArgoHook:
        """The connection's hook (built on first use)."""
        return QosflowArgoHook(self.conn_id)

    def _inputs(self, context: Any) -> tuple[dict[str, Any], list[list[float]]]:
        ti = context["ti"]
        state = latest_state(ti, self.state_task_ids)
        if state is None:
            raise AirflowFailException(f"no training state in XCom of {self.state_task_ids}")
        return state.to_dict(), watch_rows(ti, self.watch_task_ids)

    def trigger(self, context: Any) -> DeadlineProgressTrigger:
        """The trigger this sensor defers to."""
        state, rows = self._inputs(context)
        return DeadlineProgressTrigger(
            state=state,
            conn_id=self.conn_id,
            samples=rows,
            poll_interval=self.poll_interval,
            hold_seconds=self.hold_seconds,
            purpose=self.purpose,
            settle_seconds=self.settle_seconds,
        )

    def execute(self, context: Any) -> Any:
        """Defer to the trigger, or poke when not deferrable."""
        if not self.deferrable:
            return super().execute(context)
        timeout = None if self.timeout is None else timedelta(seconds=float(self.timeout))
        self.defer(trigger=self.trigger(context), method_name="execute_complete", timeout=timeout)
        return None  # pragma: no cover - defer raises

    def _poke_setup(self, context: Any) -> tuple[Any, EndWatch]:
        from qosflow_airflow.state import TrainingState

        state, rows = self._inputs(context)
        st = TrainingState.from_dict(state)
        hold = st.spec.dwell_seconds if self.hold_seconds is None else self.hold_seconds
        cluster = self.hook.get_cluster()
        watcher = new_watcher(
            st,
            history_url=self.hook.config.history_url,
            samples=samples_from_rows(rows),
            hold_s=float(hold),
            purpose=self.purpose,
            cluster=cluster,
        )
        return cluster, watcher

    def poke(self, context: Any) -> PokeReturnValue:
        """One poll with the sensor's own watcher (poke mode)."""
        try:
            if self._poking is None:
                self._poking = self._poke_setup(context)
            cluster, watcher = self._poking
            event = poll_once(cluster, watcher)
        except QosflowError as exc:
            raise AirflowException(str(exc)) from exc
        if event is None:
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=self._finish(event.to_dict()))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired: fail on a failed pod, else return the event (XCom)."""
        if not event:
            raise AirflowException("the progress trigger fired without an event")
        return self._finish(event)

    def _finish(self, event: dict[str, Any]) -> dict[str, Any]:
        status = event.get("status")
        if status == FAILED:
            raise AirflowFailException(event.get("message") or "training failed")
        if status == ERROR:
            raise AirflowException(event.get("message") or "watch failed")
        decision = event.get("decision") or {}
        self.log.info(
            "watch of %s: %s → %s units: %s",
            event.get("workflow"),
            decision.get("action", status),
            decision.get("units"),
            event.get("message"),
        )
        return {k: event.get(k) for k in WATCH_KEYS}


__all__ = ["STATE_KEY", "DeadlineProgressSensor"]
