"""``FinishTrainingOperator``: steer to the end, record history, write the report.

Runs whatever happened before it (the task group gives it ``all_done``). While the job still runs
it keeps steering it: the rounds before it are the visible, branch-by-branch part of the control
loop; once they are used up the finish step's own wait is the same watch on the job board (the
cluster allocator, :func:`qosflow.core.steer.steer`), and it takes the same actions
(:mod:`qosflow_airflow.act`: give units back, take free ones, pause, resume, re-prioritise) and
waits again, until the job ends. Its actions are in its log, in its ``acts`` XCom and on the
report. Then it takes the job off the board (its units are free for the others), records the
observed progress in the history store so the next run starts from a fitted model, and writes
the report — a table (logged and pushed) and a PNG, stored where the api-server can read it
(:mod:`qosflow_airflow.report_store`). It fails when the job was never submitted or did not
succeed, so the DAG run fails with the reason.

**A missed deadline is loud.** A job that trained but ended after its deadline is handled by
``on_miss``, *after* the history is recorded and the report written (the next run learns from
it either way): ``"fail"`` (the default) fails the task without retry, so the DAG run is red and
its downstream tasks do not run; ``"warn"`` logs a warning and succeeds; a callable gets the
finish XCom dict (``met``, ``lateness_s``, ``margin_s``, ``verdict``, ``png``...) and may raise,
which fails the task without retry. A failed task pushes the dict under the XCom key ``report``.

A busy history store does not fail a job whose training succeeded: a transient store error
(``database is locked`` after the busy timeout, a lost connection) is retried in the task for
``store_retry_s`` seconds, then fails the try as retryable (:func:`~qosflow_airflow.operators.base.
transient_store_error`). A retried finish is safe: the predictions and samples it records again are
stored once, the report is rewritten, nothing is resubmitted (the tail of an interrupted wait is
not seen again, so it is not recorded).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from qosflow.core.cluster import JobStatus
from qosflow.core.errors import QosflowError
from qosflow_airflow import act, metrics, report_store
from qosflow_airflow.operators.base import QosflowOperator, guarded, transient_store_error
from qosflow_airflow.report import Report, build_report
from qosflow_airflow.restart import newest_segment
from qosflow_airflow.run import run_identity
from qosflow_airflow.state import (
    DECISION,
    FAILED,
    TrainingState,
    job_from_dict,
    latest_state,
    samples_from_rows,
    samples_to_rows,
    watch_rows,
)
from qosflow_airflow.triggers.progress import (
    DeadlineProgressTrigger,
    new_watcher,
    poll_once,
)

if TYPE_CHECKING:
    from qosflow.core.speed import ProgressSample
    from qosflow_airflow.watch import WatchEvent

OnMiss = Literal["fail", "warn"] | Callable[[dict[str, Any]], Any]
"""What a missed deadline does: fail the task (default), warn, or call a function with the
finish XCom dict (it may raise)."""
ON_MISS: tuple[str, ...] = ("fail", "warn")


class FinishTrainingOperator(QosflowOperator):
    """Wait for the end, then record and report.

    Args:
        plan_task_id: The plan step.
        watch_task_ids: All watch steps, in round order.
        act_task_ids: All rescale/bump steps, in round order.
        report_dir: Where the PNG goes, overriding the connection's ``report_url`` (a folder,
            relative ones under ``AIRFLOW_HOME``, or an object-storage URL): the report is
            ``<report_dir>/<dag_id>/<run_id>/<job>.png``.
        on_miss: What a missed deadline does: ``"fail"`` (default: the task fails without retry
            once the history is recorded and the report written), ``"warn"``, or a callable that
            gets the finish XCom dict (and may raise: the task then fails without retry).
        poll_interval: Seconds between polls while waiting for the end.
        deferrable: Wait in the triggerer (default).
        steer: Keep steering the job until it ends (default); ``False``: only wait for the end.
        hold_seconds: How long a decision must hold before the step acts on it (default: the
            job's ``dwell_seconds``).
        store_retry_s: How long a transient history-store error is retried in the task.
        settle_seconds: The trigger's least wait before it fires (see
            :class:`~qosflow_airflow.triggers.progress.DeadlineProgressTrigger`).
        **kwargs: ``conn_id``, ``state_task_ids`` and the usual operator arguments.
    """

    clock = staticmethod(time.monotonic)
    """Clock of the store retries (tests replace it)."""
    sleep = staticmethod(time.sleep)
    """Wait between store retries (tests replace it)."""

    template_fields: Sequence[str] = (
        "conn_id",
        "plan_task_id",
        "watch_task_ids",
        "act_task_ids",
        "report_dir",
        "state_task_ids",
    )

    def __init__(
        self,
        *,
        plan_task_id: str,
        watch_task_ids: Sequence[str] = (),
        act_task_ids: Sequence[str] = (),
        report_dir: str | None = None,
        on_miss: OnMiss = "fail",
        poll_interval: float = 5.0,
        deferrable: bool = True,
        steer: bool = True,
        hold_seconds: float | None = None,
        store_retry_s: float = 60.0,
        settle_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.watch_task_ids = list(watch_task_ids)
        self.act_task_ids = list(act_task_ids)
        if not callable(on_miss) and on_miss not in ON_MISS:
            raise ValueError(f"on_miss: must be 'fail', 'warn' or a callable (got {on_miss!r})")
        self.report_dir = report_dir
        self.on_miss = on_miss
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.steer = steer
        self.hold_seconds = hold_seconds
        self.store_retry_s = store_retry_s
        self.settle_seconds = settle_seconds

    def _state(self, context: Any) -> tuple[Mapping[str, Any], TrainingState]:
        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise AirflowFailException("nothing to finish: the plan step did not produce a plan")
        return plan, self.current_state(context)

    def current_state(self, context: Any) -> TrainingState:
        """The newest state: this step's own (it may have acted), else the rounds'."""
        own = latest_state(context["ti"], [self.task_id])
        return own if own is not None else super().current_state(context)

    def _history(self, context: Any) -> list[list[Any]]:
        """The rounds' progress rows (the watch's fit starts from them)."""
        return watch_rows(context["ti"], self.watch_task_ids)

    def _running(self, status: JobStatus, state: TrainingState) -> bool:
        """Whether there is still something to wait for (a paused job waits for its units)."""
        return not status.phase.finished or (self.steer and state.paused)

    def execute(self, context: Any) -> dict[str, Any]:
        """Report now if the job ended, else steer it (or wait) until it does."""
        plan, state = self._state(context)
        cluster = guarded(self.hook.get_cluster)
        state = guarded(partial(newest_segment, cluster, state))  # a retried try: see there
        status = guarded(lambda: cluster.status(state.workflow))
        if self._running(status, state) and self.deferrable:
            self._defer(context, state, [], [])
        tail: list[list[Any]] = []
        acts: list[dict[str, Any]] = []
        while self._running(status, state):  # poke mode: the same loop in this worker
            event = guarded(partial(self._poke_until_event, context, cluster, state, tail))
            tail += samples_to_rows(event.samples)
            if event.status != DECISION:
                break
            state = self._act(context, cluster, state, event.to_dict(), acts)
            status = guarded(partial(cluster.status, state.workflow))
        status = guarded(lambda: cluster.status(state.workflow))
        return guarded(
            lambda: self.finish(context, plan, state, status, samples_from_rows(tail), acts)
        )

    def _poke_until_event(
        self, context: Any, cluster: Any, state: TrainingState, tail: list[list[Any]]
    ) -> WatchEvent:
        """Poll in this worker until the watch reports (a decision that held, or the end)."""
        watcher = new_watcher(
            state,
            history_url=self.hook.config.history_url,
            samples=samples_from_rows(self._history(context) + tail),
            hold_s=self._hold(state),
            purpose="steer" if self.steer else "await_end",
            cluster=cluster,
        )
        while (event := poll_once(cluster, watcher)) is None:
            time.sleep(self.poll_interval)
        return event

    def _hold(self, state: TrainingState) -> float:
        return state.spec.dwell_seconds if self.hold_seconds is None else float(self.hold_seconds)

    def _defer(
        self,
        context: Any,
        state: TrainingState,
        tail: list[list[Any]],
        acts: list[dict[str, Any]],
    ) -> None:
        """Wait in the triggerer: the watch on the board, with everything seen so far."""
        trigger = DeadlineProgressTrigger(
            state=state.to_dict(),
            conn_id=self.conn_id,
            samples=self._history(context) + tail,
            poll_interval=self.poll_interval,
            hold_seconds=self._hold(state),
            purpose="steer" if self.steer else "await_end",
            settle_seconds=self.settle_seconds,
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"state": state.to_dict(), "tail": tail, "acts": acts},
        )

    def _act(
        self,
        context: Any,
        cluster: Any,
        state: TrainingState,
        event: dict[str, Any],
        acts: list[dict[str, Any]],
    ) -> TrainingState:
        """Take the watch's decision (the same actions as a round's); the state after it."""
        from qosflow.core.decide import Action, Decision

        decision = Decision.from_dict(event["decision"])
        how = act.bump if decision.action in (Action.BUMP, Action.AT_RISK) else act.rescale
        record, new = guarded(lambda: how(cluster, state, decision))
        acts.append(record)
        self.log.info("after the rounds: %s", record["reason"])
        if new is None:
            return state
        self.push_state(context, new)
        return new

    def execute_complete(
        self,
        context: Any,
        event: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        tail: list[list[Any]] | None = None,
        acts: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """After a wait: act on a decision and wait again, or record and report the end."""
        plan, current = self._state(context)
        st = TrainingState.from_dict(state) if state else current
        event = event or {}
        rows = [*(tail or []), *(list(r) for r in event.get("samples", []))]
        done_acts = list(acts or [])
        if event.get("status") == "error":
            raise AirflowException(event.get("message") or "the watch failed")
        cluster = guarded(self.hook.get_cluster)
        if event.get("status") == DECISION:
            st = self._act(context, cluster, st, event, done_acts)
            status = guarded(lambda: cluster.status(st.workflow))
            if self._running(status, st):
                self._defer(context, st, rows, done_acts)
        elif event.get("status") == FAILED:
            self.log.warning("%s", event.get("message"))
        status = guarded(lambda: cluster.status(st.workflow))
        return guarded(
            lambda: self.finish(context, plan, st, status, samples_from_rows(rows), done_acts)
        )

    def leave_board(self, state: TrainingState) -> None:
        """The job ended: off the namespace's job board, its units free for the others."""
        from qosflow.store.board import JobBoard
        from qosflow_airflow.board import finish_on_board

        cluster = self.hook.get_cluster()
        namespace = str(getattr(cluster, "namespace", "qosflow"))
        try:
            store = self.hook.get_history()
            try:
                finish_on_board(JobBoard(store, namespace), state.name, now=cluster.now())
            finally:
                store.close()
        except QosflowError as exc:  # its row times out (HEARTBEAT_TTL_S) and frees the units
            self.log.warning("could not take %s off the job board: %s", state.name, exc)

    def record(
        self,
        spec_key: str,
        unit: str,
        samples: Sequence[ProgressSample],
        pairs: Sequence[tuple[float, float]],
    ) -> None:
        """Store the samples and prediction pairs, retrying a transient store error a while.

        Predictions go first, then the samples in one transaction, so a retried finish stores
        neither twice (both are deduplicated) and never half the samples.

        Raises:
            HistoryError: The store failed for good, or stayed busy for ``store_retry_s``.
        """
        give_up = self.clock() + self.store_retry_s
        pause = 1.0
        while True:
            try:
                store = self.hook.get_history()
                try:
                    for pred, real in pairs:
                        store.record_prediction(spec_key, pred, real)
                    store.record_samples(spec_key, unit, samples)
                finally:
                    store.close()
                return
            except QosflowError as exc:
                if not transient_store_error(exc) or self.clock() + pause > give_up:
                    raise
                self.log.warning("history store busy (%s); retrying in %.0f s", exc, pause)
            self.sleep(pause)
            pause = min(2 * pause, 15.0)

    def finish(
        self,
        context: Any,
        plan: Mapping[str, Any],
        state: TrainingState,
        status: JobStatus,
        tail: Sequence[ProgressSample],
        own_acts: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """Free the job's units on the board, record history, report; fail unless it succeeded."""
        ti = context["ti"]
        self.leave_board(state)
        events = [ti.xcom_pull(task_ids=t) for t in self.watch_task_ids]
        events = [e for e in events if e]
        acts = [a for a in (ti.xcom_pull(task_ids=t) for t in self.act_task_ids) if a]
        acts += list(own_acts)
        samples = sorted(
            {(s.time, s.steps_done, s.units): s for s in _samples(events, tail)}.values(),
            key=lambda s: s.time,
        )
        report = build_report(plan, events, acts, samples, status)
        spec = job_from_dict(plan["job"])
        if report.succeeded and samples:
            pairs = _prediction_pairs(events, report.finished_at, status.units)
            self.record(spec.key, spec.resources.unit, samples, pairs)
        result = self._report(context, report, spec.name)
        result.update(workflow=state.workflow, acts_after_rounds=len(own_acts), acts=list(own_acts))
        late = report.lateness_s if report.succeeded else None
        metrics.job_finished(
            spec.key,
            met=report.met,
            lateness_s=math.nan if late is None else late,
            guaranteed=plan.get("verdict") == "guaranteed",
        )
        if not report.succeeded:
            ti.xcom_push(key="report", value=result)
            raise AirflowFailException(report.verdict())
        if report.missed:
            self._missed(ti, result)
        return result

    def _report(self, context: Any, report: Report, job: str) -> dict[str, Any]:
        """Write the PNG where the api-server reads it, log the table; the finish XCom dict."""
        root = report_store.report_root(self.report_dir, self.hook.config.report_url)
        run = run_identity(context)
        url = report_store.report_url(
            root, job, run.dag_id if run else "", run.run_id if run else ""
        )
        png = report_store.write(url, report.png())
        table = report.table()
        self.log.info("report for %s:\n%s\nplot: %s", job, table, png)
        return {
            "job": job,
            "verdict": report.verdict(),
            "outcome": "met" if report.met else ("missed" if report.succeeded else "failed"),
            "met": report.met,
            "lateness_s": report.lateness_s,
            "margin_s": report.margin_s,
            "deadline": None if math.isinf(report.deadline) else report.deadline,
            "finished_at": report.finished_at,
            "png": png,
            "report_url": url,
            "table": table,
        }

    def _missed(self, ti: Any, result: dict[str, Any]) -> None:
        """A missed deadline: fail without retry, warn, or hand the result to ``on_miss``."""
        verdict = str(result["verdict"])
        if self.on_miss == "warn":
            self.log.warning("%s (on_miss='warn': the task succeeds)", verdict)
            return
        if self.on_miss == "fail" or not callable(self.on_miss):
            ti.xcom_push(key="report", value=result)
            raise AirflowFailException(
                f"{verdict}: the history is recorded and the report written ({result['png']}); "
                "on_miss='warn' lets a missed deadline pass"
            )
        try:
            self.on_miss(dict(result))
        except Exception as exc:
            ti.xcom_push(key="report", value=result)
            if isinstance(exc, AirflowFailException):
                raise
            raise AirflowFailException(f"{verdict}: on_miss raised {exc!r}") from exc


def _samples(
    events: Sequence[Mapping[str, Any]], tail: Sequence[ProgressSample]
) -> list[ProgressSample]:
    out: list[ProgressSample] = []
    for event in events:
        out.extend(samples_from_rows(event.get("samples", [])))
    out.extend(tail)
    return out


def _prediction_pairs(
    events: Sequence[Mapping[str, Any]], finished: float | None, final_units: int
) -> list[tuple[float, float]]:
    """(predicted, realised) remaining seconds of decisions whose size held to the end."""
    pairs: list[tuple[float, float]] = []
    for event in events:
        decision, at = event.get("decision") or {}, event.get("time")
        median = decision.get("median_finish")
        if finished is None or at is None or median is None or decision.get("action") == "done":
            continue
        if int(decision.get("units", -1)) == final_units and finished > at:
            pairs.append((float(median) - float(at), finished - float(at)))
    return pairs
