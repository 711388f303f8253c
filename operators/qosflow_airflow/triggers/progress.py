"""``DeadlineProgressTrigger``: watch a training workflow from the triggerer.

All blocking work — HTTP to Argo and Kubernetes, the history store, the speed fit and the decision
— runs in ``asyncio.to_thread``, so the triggerer's event loop only ever awaits. The trigger's
kwargs are the whole state needed to resume: after a triggerer restart a new instance built from
:meth:`DeadlineProgressTrigger.serialize` watches the same workflow (earlier samples travel in
``samples``; samples of the interrupted watch are observed again as progress continues).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.triggers.base import BaseTrigger, TriggerEvent

from qosflow.core.cluster import Actuator, ClusterView, Phase, UsageView
from qosflow.core.errors import ClusterError, QosflowError
from qosflow_airflow import metrics
from qosflow_airflow.hooks.argo import DEFAULT_CONN_ID, config_from_connection
from qosflow_airflow.state import TrainingState, samples_from_rows

if TYPE_CHECKING:
    from qosflow.core.decide import JobSnapshot
    from qosflow.core.fit import Measured
    from qosflow.core.predict import Belief
    from qosflow.core.usage import UsageReport
    from qosflow_airflow.board import BoardAnswer
    from qosflow_airflow.watch import Allocator, EndWatch, Watcher, WatchEvent, WatchPurpose

ERROR = "error"
SETTLE_S = 10.0
"""How long a trigger waits at least before it fires, unless told (``settle_seconds``)."""


class DeadlineProgressTrigger(BaseTrigger):
    """Poll one workflow, fit, predict and decide; fire once (done, failed or a held decision).

    Args:
        state: The :class:`~qosflow_airflow.state.TrainingState` as a dict.
        conn_id: The ``qosflow_argo`` connection.
        samples: Earlier progress rows ``[time, steps, units]`` (previous rounds).
        poll_interval: Seconds between polls.
        hold_seconds: How long an actionable decision must hold; ``None`` = the job's dwell time.
        purpose: ``steer`` (decide for one round) or ``await_end`` (the finish step's wait).
        max_errors: Consecutive retryable cluster errors tolerated before giving up.
        settle_seconds: Never fire sooner than this after the trigger started. Airflow 3.3
            (apache/airflow#72716) fails a task whose trigger fired so fast that the resumed try
            is already running when the scheduler drains the executor's stale "success" of the
            deferring try. ``None``: :data:`SETTLE_S`, read when the trigger runs.
    """

    def __init__(
        self,
        *,
        state: Mapping[str, Any],
        conn_id: str = DEFAULT_CONN_ID,
        samples: Sequence[Sequence[float]] = (),
        poll_interval: float = 5.0,
        hold_seconds: float | None = None,
        purpose: WatchPurpose = "steer",
        max_errors: int = 5,
        settle_seconds: float | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.state = dict(state)
        self.conn_id = conn_id
        self.samples = [list(row) for row in samples]
        self.poll_interval = float(poll_interval)
        self.hold_seconds = hold_seconds
        self.purpose: WatchPurpose = purpose
        self.max_errors = max_errors
        self.settle_seconds = settle_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Literal classpath and JSON-safe kwargs."""
        return (
            "qosflow_airflow.triggers.progress.DeadlineProgressTrigger",
            {
                "state": self.state,
                "conn_id": self.conn_id,
                "samples": self.samples,
                "poll_interval": self.poll_interval,
                "hold_seconds": self.hold_seconds,
                "purpose": self.purpose,
                "max_errors": self.max_errors,
                "settle_seconds": self.settle_seconds,
            },
        )

    async def cluster(self) -> tuple[ClusterView, str]:
        """The cluster client and history URL of the connection (resolved asynchronously)."""
        from qosflow_airflow.hooks.argo import cluster_from_config

        conn = await BaseHook.aget_connection(self.conn_id)
        config = config_from_connection(host=conn.host, password=conn.password, extra=conn.extra)
        return await asyncio.to_thread(cluster_from_config, config), config.history_url

    def watcher(self, history_url: str, cluster: Any = None) -> EndWatch:
        """A fresh watcher for the state, with the history store's prior (blocking: run in a thread).

        ``history_url`` comes from the connection, never from the state (XCom holds no secret).
        """
        state = TrainingState.from_dict(self.state)
        spec = state.spec
        return new_watcher(
            state,
            history_url=history_url,
            samples=samples_from_rows(self.samples),
            hold_s=spec.dwell_seconds if self.hold_seconds is None else float(self.hold_seconds),
            purpose=self.purpose,
            cluster=cluster,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the watch ends; yield exactly one event."""
        workflow = str(self.state.get("workflow", ""))
        started = asyncio.get_running_loop().time()
        try:
            cluster, history_url = await self.cluster()
            watcher = await asyncio.to_thread(self.watcher, history_url, cluster)
        except QosflowError as exc:
            payload = {"status": ERROR, "workflow": workflow, "message": str(exc)}
            yield TriggerEvent(payload)  # type: ignore[no-untyped-call]
            return
        errors = 0
        while True:
            try:
                event = await asyncio.to_thread(poll_once, cluster, watcher)
                errors = 0
            except ClusterError as exc:
                errors += 1
                if not exc.retryable or errors >= self.max_errors:
                    message = f"cannot watch {workflow}: {exc}"
                    payload = {"status": ERROR, "workflow": workflow, "message": message}
                    yield TriggerEvent(payload)  # type: ignore[no-untyped-call]
                    return
                self.log.warning("watch of %s: %s (retrying)", workflow, exc)
                event = None
            if event is not None:
                settle = SETTLE_S if self.settle_seconds is None else self.settle_seconds
                early = settle - (asyncio.get_running_loop().time() - started)
                if early > 0:  # see settle_seconds: the scheduler must see the deferral first
                    await asyncio.sleep(early)
                yield TriggerEvent(event.to_dict())  # type: ignore[no-untyped-call]
                return
            await asyncio.sleep(self.poll_interval)


def new_watcher(
    state: TrainingState,
    *,
    history_url: str,
    samples: Sequence[Any] = (),
    hold_s: float,
    purpose: WatchPurpose = "steer",
    cluster: Actuator | None = None,
) -> EndWatch:
    """A watch of the current segment, primed with history (blocking).

    ``await_end`` gives an :class:`~qosflow_airflow.watch.EndWatch` (no history, no decisions);
    ``steer`` a :class:`~qosflow_airflow.watch.Watcher`, told with ``cluster`` what a rescale
    costs there (in-place resize or checkpoint-restart).
    """
    from qosflow_airflow.watch import EndWatch, Watcher, rescale_overhead

    spec = state.spec
    if purpose == "await_end":
        return EndWatch(spec=spec, workflow=state.workflow, history=tuple(samples))
    prior, calibration = None, None
    known: tuple[Measured, ...] = ()
    timings: tuple[Measured, ...] = ()
    if history_url:
        from qosflow.core.prior import fit_of
        from qosflow.store.history import HistoryStore

        store = HistoryStore(history_url)
        try:
            history = store.history(spec.key, spec.resources.unit)
            calibration = store.calibration(spec.key)
            timings = tuple(store.timings(spec.key, spec.resources.unit))
        finally:
            store.close()
        now = cluster.now() if isinstance(cluster, ClusterView) else None
        fitted = fit_of(history, spec.resources.per_node, now=now)  # the prior and its sizes
        if fitted is not None:
            prior, known = fitted.model, fitted.measured
    watcher = Watcher(
        spec=spec,
        workflow=state.workflow,
        last_rescale_at=state.last_rescale_at,
        history=tuple(samples),
        prior=prior,
        known=known,
        timings=timings,
        hold_s=hold_s,
        priority_class=state.priority_class,
        paused=state.paused,
    )
    if calibration is not None:
        watcher.calibration = calibration
    if cluster is not None:
        watcher.rescale_overhead_s = rescale_overhead(cluster, spec.resources.unit)
    if history_url and isinstance(cluster, ClusterView):
        watcher.allocator = board_allocator(state, history_url, cluster)
    return watcher


def board_allocator(state: TrainingState, history_url: str, cluster: ClusterView) -> Allocator:
    """The watch's way to the cluster allocator: its job's row on the namespace's job board."""
    from qosflow.store.board import BoardEntry, JobBoard
    from qosflow.store.history import HistoryStore
    from qosflow_airflow.admitted import admitted_jobs
    from qosflow_airflow.board import allocate_on_board, cluster_side, publish

    namespace = str(getattr(cluster, "namespace", "qosflow"))
    unit = state.spec.resources.unit

    def run(watcher: Watcher, belief: Belief, snap: JobSnapshot) -> BoardAnswer:
        holds = 0 if watcher.paused or snap.queued else snap.units
        entry = BoardEntry(
            job_id=state.name,
            unit=unit,
            spec=state.job,
            done=float(snap.steps_done),
            units=holds,
            klass=watcher.priority_class,
            guaranteed=state.guaranteed,
            overhead_s=watcher.rescale_overhead_s,
        )
        factor = watcher.calibration.factor
        active = admitted_jobs(cluster, unit=unit, exclude=state.name, pending={})
        side = cluster_side(cluster, state.spec.resources, active)
        store = HistoryStore(history_url)
        try:
            answer = allocate_on_board(
                JobBoard(store, namespace),
                publish(entry, belief, factor),
                now=snap.now,
                plan_factor=None,
                **side,
            )
            if answer.profiled:  # its key's later jobs plan on the sizes it climbed through
                samples = [*watcher.history, *watcher.observed()]
                store.record_samples(state.spec.key, unit, samples)
            return answer
        finally:
            store.close()

    return run


def poll_once(cluster: ClusterView, watcher: EndWatch) -> WatchEvent | None:
    """One blocking poll: status, the pod's usage reports, capacity, clock → the watcher."""
    status = cluster.status(watcher.workflow)
    usage: list[UsageReport] = []
    running = status.phase is Phase.RUNNING and status.pod_name
    if running and isinstance(cluster, UsageView):  # the finish step's samples need it too
        usage = cluster.usage(str(status.pod_name))
    from qosflow_airflow.board import job_capacity

    free = job_capacity(cluster, watcher.spec.resources)[0].free
    event = watcher.observe(status, now=cluster.now(), free_units=free, usage=usage)
    metrics.polled(watcher, status, event)
    return event
