"""``PlanTrainingOperator`` and ``SubmitTrainingOperator``: admit and size a job, then launch it.

Planning is :func:`qosflow.core.planning.plan_job` on live data: the history store's samples (what
earlier runs of the key measured), prior and calibration for the job's key, the cluster's
capacity, and the jobs already guaranteed on it (read back from their workflows' plan
annotations, :mod:`qosflow_airflow.admitted`). The plan goes to XCom as JSON with its reason in
words, the run-unique job id that names the workflows, and the admission block the workflows'
plan annotation carries for later plans. ``rejected`` fails the task without retry and names the
counter-offer deadline; nothing is submitted. ``best_effort`` continues with a warning naming the counter-offer.

The job id and a relative deadline's anchor come from the DAG run (:mod:`qosflow_airflow.run`), so
planning the same run again (a retry, or the task group cleared) finds the same job: one promise
in the ledger, and a submit that re-attaches to the workflows already running. The plan XCom
names the connection (``conn_id``), never the history store's URL (it may hold a password).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from airflow.sdk.exceptions import AirflowFailException

from qosflow.core.cluster import JobStatus
from qosflow.core.errors import SpecError
from qosflow.core.spec import JobSpec, load_job
from qosflow_airflow.admitted import (
    ADMISSION_KEY,
    admission_block,
    admitted_jobs,
    job_id,
)
from qosflow_airflow.operators.base import QosflowOperator, guarded
from qosflow_airflow.restart import submit_request
from qosflow_airflow.run import (
    DeadlineAnchor,
    RunIdentity,
    check_anchor,
    deadline_anchor,
    run_identity,
)
from qosflow_airflow.state import TrainingState, job_from_dict, job_to_dict, json_safe
from qosflow_argo.adopt import RUN_KEY

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


_NO_UNITS = {
    "cpu": "no node of this cluster offers allocatable CPU",
    "gpu": "no node of this cluster offers a GPU (allocatable {gpu} is 0 or absent): run the "
    "job on a cluster with GPU nodes and their device plugin, set the connection's gpu_resource "
    "if your GPUs are another vendor's resource, or set resources.unit: cpu",
    "worker": "no node of this cluster can run a worker pod",
}
"""What the plan step says when the cluster has none of a job's unit (nothing is submitted)."""


class PlanTrainingOperator(QosflowOperator):
    """Admit and size a deadline job; push the plan.

    Args:
        job: The job spec: a mapping or a YAML/JSON path (validated by ``qosflow.core.spec.load_job``).
        deadline: Overrides the spec's deadline: ``HH:MM`` (next such time in the DAG's timezone),
            an ISO instant or an ISO duration.
        initial_units: Start at this size instead of the planned one (it must be an allowed level).
        deadline_anchor: What a relative deadline (``PT…``, and ``HH:MM``'s "next") counts from:
            ``queued`` (default: when the DAG run was queued, so every re-run of it gets the same
            deadline), ``logical`` (its logical date) or ``plan`` (when this step runs).
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
        deadline_anchor: DeadlineAnchor = "queued",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = _job_mapping(job)
        self.deadline = deadline
        self.initial_units = initial_units
        self.deadline_anchor: DeadlineAnchor = check_anchor(deadline_anchor)
        self._guaranteed_others: tuple[str, ...] = ()

    def load(self, now: datetime, tz: tzinfo) -> JobSpec:
        """The validated spec, with the deadline override applied.

        Args:
            now: The anchor: relative deadlines count from it, and it is the submission time.
            tz: The timezone ``HH:MM`` is read in.
        """
        data: Any = self.job
        if self.deadline:
            if isinstance(data, str):
                data = _read_mapping(data)
            data = {**data, "deadline": resolve_deadline(str(self.deadline), now=now, tz=tz)}
        return load_job(data, now=now, defaults=self.hook.config.defaults)

    def execute(self, context: Any) -> dict[str, Any]:
        """Plan; raise ``AirflowFailException`` on bad input or rejection."""
        return guarded(lambda: self._plan(context))

    def _plan(self, context: Any) -> dict[str, Any]:
        cluster = self.hook.get_cluster()
        now = cluster.now()
        dag = context.get("dag")
        tz: tzinfo = getattr(dag, "timezone", None) or UTC
        anchor = min(deadline_anchor(context, self.deadline_anchor, now), now)
        spec = self.load(datetime.fromtimestamp(anchor, UTC), tz)
        res = spec.resources
        forced = _optional_int(self.initial_units, "initial_units")
        if forced is not None and forced not in res.levels:
            raise SpecError("initial_units", f"must be one of {list(res.levels)} (got {forced})")
        run = run_identity(context)
        ident = plan_job_id(spec, run)
        cluster.check_job(spec, ident)  # an image, a checkpoint volume, valid pod settings
        plan, _active = self._admit(cluster, spec, now, ident)
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
        if run is not None:
            annotation[RUN_KEY] = run.to_dict()
        return cast(
            "dict[str, Any]",
            json_safe(
                {
                    "job": job_to_dict(spec),
                    "job_id": ident,
                    "admitted": list(self._guaranteed_others),
                    "plan": annotation,
                    "units": units,
                    "verdict": verdict.kind,
                    "reason": verdict.reason,
                    "counter_offer": verdict.counter_offer,
                    "priority_class": plan.priority_class,
                    "priority": plan.priority,
                    "conn_id": self.conn_id,
                    "planned_at": now,
                }
            ),
        )

    def _admit(self, cluster: Any, spec: JobSpec, now: float, ident: str) -> tuple[Plan, Any]:
        """Plan against the history and the jobs already guaranteed; record a new promise."""
        from qosflow.core.planning import estimate_of, plan_job
        from qosflow.core.prior import prior_of
        from qosflow_airflow.board import job_capacity

        res = spec.resources
        store = self.hook.get_history()
        try:
            history = store.history(spec.key, res.unit)
            prior = prior_of(history, res.per_node, now=now)
            calibration = store.calibration(spec.key)
            _, timed_here = estimate_of(spec) or (None, ())
            for m in timed_here:  # timed past one node: every later job of the key counts it
                store.record_timing(
                    spec.key, res.unit, units=m.units, step_seconds=m.step_time, at=now
                )
            timings = store.timings(spec.key, res.unit)
            active = admitted_jobs(cluster, unit=res.unit, exclude=ident, pending={})
            capacity, fits = job_capacity(cluster, res)
            if capacity.total < 1:
                gpu = str(getattr(cluster, "gpu_resource", "nvidia.com/gpu"))
                raise SpecError("resources.unit", _NO_UNITS[res.unit].format(gpu=gpu))
            free = capacity.free + active.held_units + active.own_units  # a re-plan's own
            if fits < min(capacity.free, res.max):  # free units the job's pods cannot use
                free = fits + active.own_units
            plan = plan_job(  # the job's own numbers: prediction, schedule, class, offer
                spec,
                capacity=max(1, min(free, capacity.total)),  # 0: nothing fits now
                now=now,
                admitted=active.guaranteed,
                prior=prior,
                calibration=calibration,
                history=history,
                timings=timings,
            )
            # the verdict is the cluster allocator's on the job board: one plan step at a time
            # sees every job of the namespace, also those whose workflow is not submitted yet
            plan = self._on_board(store, cluster, spec, plan, ident, now, calibration, active)
        finally:
            store.close()
        return plan, active

    def _on_board(
        self,
        store: Any,
        cluster: Any,
        spec: JobSpec,
        plan: Plan,
        ident: str,
        now: float,
        calibration: Any,
        active: Any,
    ) -> Plan:
        """Put the job on the board and take the allocator's verdict, size and class."""
        from dataclasses import replace

        from qosflow.core.admission import Kind, Verdict
        from qosflow.store.board import BoardEntry, JobBoard
        from qosflow_airflow.board import allocate_on_board, cluster_side, publish

        res = spec.resources
        factor = calibration.factor if calibration is not None else None
        entry = BoardEntry(job_id=ident, unit=res.unit, spec=job_to_dict(spec))
        answer = allocate_on_board(
            JobBoard(store, str(getattr(cluster, "namespace", "qosflow"))),
            publish(entry, plan.belief, factor),
            now=now,
            plan_factor=None,
            **cluster_side(cluster, res, active),
        )
        told = answer.allocation.verdicts.get(ident)
        mine = answer.mine
        self._guaranteed_others = tuple(
            n for n, a in answer.allocation.jobs.items() if a.guaranteed and n != ident
        )
        if mine is None:  # its spec says reject, and admission could not guarantee it
            verdict = told or Verdict("rejected", 0, plan.verdict.reason, None)
            return replace(plan, verdict=replace(verdict, kind="rejected", units=0))
        kind: Kind = "guaranteed" if mine.guaranteed else "best_effort"
        units = mine.units or res.levels[0]  # nothing free now: it waits, queued at its minimum
        base = told or plan.verdict
        reason = base.reason if told is not None else f"{mine.reason} (planned again)"
        verdict = replace(base, kind=kind, units=units, reason=reason)
        return replace(plan, verdict=verdict, priority_class=mine.klass)

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


def plan_job_id(spec: JobSpec, run: RunIdentity | None) -> str:
    """The job id: from the DAG run and the job's name and key, whatever its deadline's form.

    Outside a DAG run (no run id) the resolved deadline stands in for the run.
    """
    if run is None:
        return job_id(spec.name, spec.key, spec.deadline)
    return job_id(spec.name, spec.key, run.dag_id, run.run_id, run.map_index)


def attached(state: TrainingState, status: JobStatus, before: JobStatus | None) -> TrainingState:
    """The state of the segment ``status`` reports (created now, or adopted as it runs).

    ``before``: the segment before it, whose last step the segment resumed from.
    """
    return state.evolve(
        workflow=status.name,
        segment=status.segment,
        units=status.units or state.units,
        priority_class=status.priority_class or state.priority_class,
        priority=status.priority if status.priority_class else state.priority,
        last_rescale_at=status.started_at if status.segment > 0 else None,
        resumed_from=None if before is None else before.steps_done,
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
    """Launch segment 0 of a planned job; a retried or re-planned run re-attaches to its job.

    The job id comes from the DAG run, so a second try, or the plan and submit steps of the same
    run cleared and run again, find the job's workflows: ``ArgoCluster.submit`` adopts segment 0
    (the same run, :mod:`qosflow_argo.adopt`), and when the job has been checkpoint-restarted
    since, the state points at its newest segment, at the size and priority it runs with.

    Args:
        plan_task_id: The plan step's task id.
        checkpoint_dir: Where the segments keep checkpoints, on the job's checkpoint volume;
            default ``<checkpoint.path>/<job id>`` (the plan's run-unique id).
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
        if spec.checkpoint is None:  # the plan step refuses such a job; a hand-made XCom
            raise SpecError("checkpoint", "is required (see the plan step's check)")
        ckpt = self.checkpoint_dir or spec.checkpoint.folder(ident)
        state = TrainingState(
            job=plan["job"],
            workflow=f"{ident}-s0",
            segment=0,
            units=int(plan["units"]),
            priority_class=str(plan["priority_class"]),
            priority=int(plan["priority"]),
            guaranteed=plan["verdict"] == "guaranteed",
            checkpoint_dir=ckpt,
            job_id=ident,
            plan=json.dumps(plan["plan"]),
        )
        cluster = self.hook.get_cluster()
        segments = sorted(cluster.list_jobs(ident), key=lambda s: s.segment)
        if segments and segments[-1].segment > 0:  # re-planned after a checkpoint-restart
            status, before = segments[-1], segments[-2] if len(segments) > 1 else None
            self.log.info("%s: the job runs already, re-attaching to %s", ident, status.name)
        else:
            status, before = cluster.submit(submit_request(state, segment=0, resume=False)), None
        state = attached(state, status, before)
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
