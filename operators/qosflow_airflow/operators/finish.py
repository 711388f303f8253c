"""``FinishTrainingOperator``: confirm completion, record history, write the report.

Runs whatever happened before it (the task group gives it ``all_done``): it waits (deferred) for a
still-running job to end, records the observed progress in the history store so the next run starts
from a fitted model, and writes the report — a table (logged and pushed) and a PNG. It fails when
the job was never submitted or did not succeed, so the DAG run fails with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from qosflow.core.cluster import JobStatus, Phase
from qosflow_airflow.operators.base import QosflowOperator, guarded
from qosflow_airflow.report import Mark, Report
from qosflow_airflow.state import TrainingState, job_from_dict, samples_from_rows
from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

if TYPE_CHECKING:
    from qosflow.core.speed import ProgressSample


class FinishTrainingOperator(QosflowOperator):
    """Wait for the end, then record and report.

    Args:
        plan_task_id: The plan step.
        watch_task_ids: All watch steps, in round order.
        act_task_ids: All rescale/bump steps, in round order.
        report_dir: Where the PNG goes (``<report_dir>/<job>.png``).
        poll_interval: Seconds between polls while waiting for the end.
        deferrable: Wait in the triggerer (default).
        **kwargs: ``conn_id``, ``state_task_ids`` and the usual operator arguments.
    """

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
        report_dir: str = ".qosflow/reports",
        poll_interval: float = 5.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.watch_task_ids = list(watch_task_ids)
        self.act_task_ids = list(act_task_ids)
        self.report_dir = report_dir
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def _state(self, context: Any) -> tuple[Mapping[str, Any], TrainingState]:
        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise AirflowFailException("nothing to finish: the plan step did not produce a plan")
        return plan, self.current_state(context)

    def execute(self, context: Any) -> dict[str, Any]:
        """Report now if the job ended, else wait for it."""
        plan, state = self._state(context)
        cluster = guarded(self.hook.get_cluster)
        status = guarded(lambda: cluster.status(state.workflow))
        if not status.phase.finished and self.deferrable:
            trigger = DeadlineProgressTrigger(
                state=state.to_dict(),
                conn_id=self.conn_id,
                poll_interval=self.poll_interval,
                purpose="await_end",
            )
            self.defer(trigger=trigger, method_name="execute_complete")
        while not status.phase.finished:
            time.sleep(self.poll_interval)
            status = guarded(lambda: cluster.status(state.workflow))
        return self.finish(context, plan, state, status, [])

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """After the wait: the final status, then record and report."""
        plan, state = self._state(context)
        status = guarded(lambda: self.hook.get_cluster().status(state.workflow))
        rows = (event or {}).get("samples", [])
        return self.finish(context, plan, state, status, samples_from_rows(rows))

    def finish(
        self,
        context: Any,
        plan: Mapping[str, Any],
        state: TrainingState,
        status: JobStatus,
        tail: Sequence[ProgressSample],
    ) -> dict[str, Any]:
        """Record history, write the report, fail unless the job succeeded."""
        ti = context["ti"]
        events = [ti.xcom_pull(task_ids=t) for t in self.watch_task_ids]
        events = [e for e in events if e]
        acts = [a for a in (ti.xcom_pull(task_ids=t) for t in self.act_task_ids) if a]
        samples = sorted(
            {(s.time, s.steps_done, s.units): s for s in _samples(events, tail)}.values(),
            key=lambda s: s.time,
        )
        report = build_report(plan, events, acts, samples, status)
        spec = job_from_dict(plan["job"])
        if report.succeeded and samples:
            store = self.hook.get_history()
            try:
                store.record_samples(spec.key, spec.resources.unit, samples)
                for pred, real in _prediction_pairs(events, report.finished_at, status.units):
                    store.record_prediction(spec.key, pred, real)
            finally:
                store.close()
        png = report.plot(Path(self.report_dir) / f"{spec.name}.png").resolve()
        table = report.table()
        self.log.info("report for %s:\n%s\nplot: %s", spec.name, table, png)
        result = {
            "job": spec.name,
            "verdict": report.verdict(),
            "met": report.met,
            "margin_s": report.margin_s,
            "finished_at": report.finished_at,
            "png": str(png),
            "table": table,
            "workflow": state.workflow,
        }
        if not report.succeeded:
            ti.xcom_push(key="report", value=result)
            raise AirflowFailException(report.verdict())
        return result


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


def build_report(
    plan: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    acts: Sequence[Mapping[str, Any]],
    samples: Sequence[ProgressSample],
    status: JobStatus,
) -> Report:
    """Assemble the report from XCom payloads and the final status."""
    spec = job_from_dict(plan["job"])
    marks = [
        Mark(
            float(e["time"]),
            str(e["decision"]["action"]),
            int(e["decision"]["units"]),
            str(e["decision"]["reason"]),
        )
        for e in events
        if e.get("decision") and e["decision"].get("action") != "done"
    ]
    marks += [
        Mark(float(a["time"]), str(a["how"]), int(a["units"]), str(a["reason"]))
        for a in acts
        if a.get("how") not in (None, "none")
    ]
    succeeded = status.phase is Phase.SUCCEEDED
    finished = status.finished_at if status.phase.finished else None
    if succeeded and finished is None and samples:
        finished = samples[-1].time
    schedule = [(float(t), int(s)) for t, s in (plan.get("plan") or {}).get("schedule", [])]
    return Report(
        job=spec.name,
        total_steps=spec.total_steps,
        start=float(plan.get("planned_at", spec.submitted_at)),
        deadline=spec.deadline,
        finished_at=finished,
        succeeded=succeeded,
        schedule=schedule,
        samples=list(samples),
        marks=sorted(marks, key=lambda m: m.time),
        message=status.message,
    )
