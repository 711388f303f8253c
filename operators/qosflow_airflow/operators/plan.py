"""``PlanTrainingOperator`` and ``SubmitTrainingOperator``: admit and size a job, then launch it.

Planning is :func:`qosflow.core.planning.plan_job` on live data: the history store's samples (what
earlier runs of the key measured), prior and calibration for the job's key, the cluster's
capacity, and the jobs already guaranteed on it (read back from their workflows' plan
annotations, :mod:`qosflow_airflow.admitted`). The plan goes to XCom as JSON with its reason in
words, the run-unique job id that names the workflows, and the admission block the workflows'
plan annotation carries for later plans. ``rejected`` fails the task without retry and names the
counter-offer deadline; nothing is submitted. ``best_effort`` continues with a warning naming the counter-offer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from airflow.sdk.exceptions import AirflowFailException

from qosflow.core.errors import SpecError
from qosflow.core.spec import JobSpec, load_job
from qosflow_airflow.admitted import ADMISSION_KEY, admission_block, admitted_jobs, job_id
from qosflow_airflow.operators.base import QosflowOperator, guarded
from qosflow_airflow.restart import submit_request
from qosflow_airflow.state import TrainingState, job_from_dict, job_to_dict, json_safe

if TYPE_CHECKING:
    from qosflow.core.planning import Plan

_CLOCK = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)$")


def resolve_deadline(text: str, *, now: datetime, tz: tzinfo) -> str:
    """A deadline as ``load_job`` accepts it; ``HH:MM`` means the next such time in ``tz``.

    Args:
        text: ``HH:MM``, an ISO-8601 instant or an ISO-8601 duration (``PT3M``).
        now: The current instant (timezone-aware).
        tz: The timezone ``HH:MM`` is read in (the DAG's).
    """
    match = _CLOCK.match(text.strip())
    if match is None:
        return text.strip()
    local = now.astimezone(tz)
    due = local.replace(hour=int(match["h"]), minute=int(match["m"]), second=0, microsecond=0)
    if due <= local:
        due += timedelta(days=1)
    return due.astimezone(UTC).isoformat()


def _optional_int(value: Any, field: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "none")):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SpecError(field, f"must be an integer (got {value!r})") from None


def _job_mapping(job: Mapping[str, Any] | str) -> dict[str, Any] | str:
    return job if isinstance(job, str) else dict(job)


class PlanTrainingOperator(QosflowOperator):
    """Admit and size a deadline job; push the plan.

    Args:
        job: The job spec: a mapping or a YAML/JSON path (validated by ``qosflow.core.spec.load_job``).
        deadline: Overrides the spec's deadline: ``HH:MM`` (next such time in the DAG's timezone),
            an ISO instant or an ISO duration.
        initial_units: Start at this size instead of the planned one (it must be an allowed level).
        **kwargs: ``conn_id`` and the usual operator arguments.
    """

    template_fields: Sequence[str] = ("conn_id", "job", "deadline", "initial_units")
    template_fields_renderers = {"job": "json"}  # noqa: RUF012

    def __init__(
        self,
        *,
        job: Mapping[str, Any] | str,
        deadline: str | None = None,
        initial_units: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = _job_mapping(job)
        self.deadline = deadline
        self.initial_units = initial_units

    def load(self, now: datetime, tz: tzinfo) -> JobSpec:
        """The validated spec, with the deadline override applied."""
        data: Any = self.job
        if self.deadline:
            if isinstance(data, str):
                data = _read_mapping(data)
            data = {**data, "deadline": resolve_deadline(str(self.deadline), now=now, tz=tz)}
        return load_job(data, now=now)

    def execute(self, context: Any) -> dict[str, Any]:
        """Plan; raise ``AirflowFailException`` on bad input or rejection."""
        return guarded(lambda: self._plan(context))

    def _plan(self, context: Any) -> dict[str, Any]:
        cluster = self.hook.get_cluster()
        now = cluster.now()
        dag = context.get("dag")
        tz: tzinfo = getattr(dag, "timezone", None) or UTC
        spec = self.load(datetime.fromtimestamp(now, UTC), tz)
        res = spec.resources
        forced = _optional_int(self.initial_units, "initial_units")
        if forced is not None and forced not in res.levels:
            raise SpecError("initial_units", f"must be one of {list(res.levels)} (got {forced})")
        ident = job_id(spec.name, spec.key, spec.deadline, context.get("run_id") or "")
        plan, active = self._admit(cluster, spec, now, ident)
        verdict = plan.verdict
        self._tell(spec, plan)
        units = forced or verdict.units
        if forced is not None and forced != verdict.units:
            self.log.info(
                "%s: starting at %d %s as initial_units asks", spec.name, forced, res.unit
            )
        annotation = plan.to_dict()
        if plan.candidate is not None:
            annotation[ADMISSION_KEY] = admission_block(
                plan.candidate, verdict.kind, spec.total_steps, res.unit
            )
        return cast(
            "dict[str, Any]",
            json_safe(
                {
                    "job": job_to_dict(spec),
                    "job_id": ident,
                    "admitted": [a.name for a in active.guaranteed],
                    "plan": annotation,
                    "units": units,
                    "verdict": verdict.kind,
                    "reason": verdict.reason,
                    "counter_offer": verdict.counter_offer,
                    "priority_class": plan.priority_class,
                    "priority": plan.priority,
                    "history_url": self.hook.config.history_url,
                    "planned_at": now,
                }
            ),
        )

    def _admit(self, cluster: Any, spec: JobSpec, now: float, ident: str) -> tuple[Plan, Any]:
        """Plan against the history and the jobs already guaranteed; record a new promise."""
        from qosflow.core.planning import plan_job
        from qosflow.core.prior import prior_of

        res = spec.resources
        store = self.hook.get_history()
        try:
            history = store.history(spec.key, res.unit)
            prior = prior_of(history, res.per_node, now=now)
            calibration = store.calibration(spec.key)
            # one plan step at a time: a promise given a moment ago, whose workflow is not on
            # the cluster yet, still counts (two DAGs planning at the same instant)
            with store.promise_ledger(now) as ledger:
                active = admitted_jobs(
                    cluster, unit=res.unit, exclude=ident, pending=ledger.pending(res.unit)
                )
                capacity = cluster.capacity(res.unit)
                plan = plan_job(
                    spec,
                    capacity=min(capacity.free + active.held_units, capacity.total),
                    now=now,
                    admitted=active.guaranteed,
                    prior=prior,
                    calibration=calibration,
                    history=history,
                )
                if plan.verdict.kind == "guaranteed" and plan.candidate is not None:
                    block = admission_block(
                        plan.candidate, "guaranteed", spec.total_steps, res.unit
                    )
                    ledger.record(ident, res.unit, json_safe(block))
        finally:
            store.close()
        return plan, active

    def _tell(self, spec: JobSpec, plan: Plan) -> None:
        """Fail on a rejection (nothing submitted), warn on best effort, log the plan."""
        verdict = plan.verdict
        offer = _when(verdict.counter_offer)
        if verdict.kind == "rejected":
            raise AirflowFailException(
                f"{spec.name}: rejected at admission, nothing submitted: {verdict.reason}"
                + (f"; counter-offer: a deadline of {offer} would pass" if offer else "")
            )
        if verdict.kind == "best_effort":
            self.log.warning(
                "%s: deadline not guaranteed, running best effort: %s%s",
                spec.name,
                verdict.reason,
                f" (counter-offer: {offer})" if offer else "",
            )
        self.log.info(
            "plan for %s: %s at %d %s, priority %s; %s",
            spec.name,
            verdict.kind,
            verdict.units,
            spec.resources.unit,
            plan.priority_class,
            verdict.reason,
        )


def _read_mapping(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError("job", f"cannot read job spec file {path!r}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError("job", f"{path} must hold a mapping of fields")
    return data


def _when(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


class SubmitTrainingOperator(QosflowOperator):
    """Launch segment 0 of a planned job; a retried try re-attaches to the same workflow.

    Args:
        plan_task_id: The plan step's task id.
        checkpoint_dir: Where the segments keep checkpoints; default
            ``<connection checkpoint_root>/<job id>`` (the plan's run-unique id).
        **kwargs: ``conn_id`` and the usual operator arguments.
    """

    template_fields: Sequence[str] = ("conn_id", "plan_task_id", "checkpoint_dir")

    def __init__(
        self, *, plan_task_id: str, checkpoint_dir: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.checkpoint_dir = checkpoint_dir

    def execute(self, context: Any) -> dict[str, Any]:
        """Submit (idempotently) and push the training state."""
        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise AirflowFailException(f"no plan in XCom of {self.plan_task_id}")
        return guarded(lambda: self._submit(context, plan))

    def _submit(self, context: Any, plan: Mapping[str, Any]) -> dict[str, Any]:
        spec = job_from_dict(plan["job"])
        ident = str(plan.get("job_id") or spec.name)
        root = self.checkpoint_dir or os.path.join(self.hook.config.checkpoint_root, ident)
        ckpt = root if os.path.isabs(root) else str(Path(root).resolve())
        state = TrainingState(
            job=plan["job"],
            workflow=f"{ident}-s0",
            segment=0,
            units=int(plan["units"]),
            priority_class=str(plan["priority_class"]),
            priority=int(plan["priority"]),
            guaranteed=plan["verdict"] == "guaranteed",
            checkpoint_dir=ckpt,
            history_url=str(plan.get("history_url", "")),
            job_id=ident,
            plan=json.dumps(plan["plan"]),
        )
        cluster = self.hook.get_cluster()
        request = submit_request(state, segment=0, resume=False)
        status = cluster.submit(request)
        state = state.evolve(workflow=status.name)
        self.push_state(context, state)
        self.log.info(
            "submitted %s: %d %s, class %s, phase %s",
            status.name,
            state.units,
            spec.resources.unit,
            state.priority_class,
            status.phase.value,
        )
        return {"workflow": status.name, "phase": status.phase.value, "units": state.units}
