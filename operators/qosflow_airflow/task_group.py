"""``deadline_training``: the deadline control loop as K unrolled rounds of ordinary tasks.

::

    plan → submit → round_1 → … → round_K → finish
    round_k = watch → decide ─┬→ rescale  ─┐
                              ├→ bump     ─┼→ (round_k+1.watch)
                              ├→ continue ─┘
                              └→ done ─────────→ finish

Airflow DAGs have no loops, so each round is a watch (deferrable sensor), a branch on its decision
and the three ways to act. ``done`` (the watch saw the job end) skips every later round: their
watches need one successful act (``none_failed_min_one_success``) and all three were skipped.
``finish`` has ``all_done``: it always runs; a job still running after the last round is steered
by it until it ends (the same watch on the job board and the same actions, taken by the finish
step itself: the loop never runs out); then it records and reports, and fails unless the
training succeeded — or, by default, when it ended after its deadline (``on_miss``). A round's
branch fires only on an action that changes something; its ``decide`` step's XCom says what was
decided and why. Every task of the group links to the run's qosflow view (the UI plugin,
:mod:`qosflow_airflow.plugin`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import TaskGroup, TriggerRule

from qosflow_airflow.hooks.argo import DEFAULT_CONN_ID
from qosflow_airflow.operators.branch import DeadlineBranchOperator
from qosflow_airflow.operators.finish import FinishTrainingOperator, OnMiss
from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator
from qosflow_airflow.operators.rescale import PriorityBumpOperator, RescaleOperator
from qosflow_airflow.plugin.links import QosflowViewLink
from qosflow_airflow.run import DeadlineAnchor
from qosflow_airflow.sensors.progress import DeadlineProgressSensor


class _Rounds:
    """The unrolled control loop: each round a watch, a branch and its actions."""

    def __init__(
        self,
        prefix: str,
        conn_id: str,
        poll_interval: float,
        hold_seconds: float | None,
        deferrable: bool,
        previous: list[Any],
    ) -> None:
        self.prefix, self.conn_id = prefix, conn_id
        self.poll_interval, self.hold_seconds, self.deferrable = (
            poll_interval,
            hold_seconds,
            deferrable,
        )
        self.state_ids = [f"{prefix}submit"]
        self.watch_ids: list[str] = []
        self.act_ids: list[str] = []
        self.previous = previous
        self.dones: list[Any] = []

    def add(self, k: int) -> None:
        """Round ``k``: watch → decide → rescale | bump | continue | done."""
        r = f"{self.prefix}round_{k}."
        with TaskGroup(group_id=f"round_{k}"):
            watch = DeadlineProgressSensor(
                task_id="watch",
                state_task_ids=list(self.state_ids),
                watch_task_ids=list(self.watch_ids),
                conn_id=self.conn_id,
                poll_interval=self.poll_interval,
                hold_seconds=self.hold_seconds,
                deferrable=self.deferrable,
                trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            )
            acts = {
                "rescale": RescaleOperator(
                    task_id="rescale",
                    watch_task_id=f"{r}watch",
                    state_task_ids=list(self.state_ids),
                    conn_id=self.conn_id,
                ),
                "bump": PriorityBumpOperator(
                    task_id="bump",
                    watch_task_id=f"{r}watch",
                    state_task_ids=list(self.state_ids),
                    conn_id=self.conn_id,
                ),
                "continue": EmptyOperator(task_id="continue"),
                "done": EmptyOperator(task_id="done"),
            }
            branch = DeadlineBranchOperator(
                task_id="decide",
                watch_task_id=f"{r}watch",
                branches={
                    "done": f"{r}done",
                    "on_track": f"{r}continue",
                    "scale_up": f"{r}rescale",
                    "scale_down": f"{r}rescale",
                    "bump": f"{r}bump",
                    "at_risk": f"{r}bump",
                },
            )
            self.previous >> watch >> branch >> list(acts.values())
        self.watch_ids.append(f"{r}watch")
        self.act_ids += [f"{r}rescale", f"{r}bump"]
        self.state_ids = [f"{r}rescale", f"{r}bump", *self.state_ids]
        self.previous = [acts["rescale"], acts["bump"], acts["continue"]]
        self.dones.append(acts["done"])


def deadline_training(
    job: Mapping[str, Any] | str,
    *,
    rounds: int = 3,
    conn_id: str = DEFAULT_CONN_ID,
    group_id: str = "training",
    deadline: str | None = None,
    initial_units: int | str | None = None,
    poll_interval: float = 5.0,
    hold_seconds: float | None = None,
    report_dir: str | None = None,
    deferrable: bool = True,
    deadline_anchor: DeadlineAnchor = "queued",
    finish_retries: int = 2,
    on_miss: OnMiss = "fail",
) -> TaskGroup:
    """Build the deadline-training task group (call inside a ``DAG`` context).

    Args:
        job: Job spec mapping or YAML/JSON path (templated).
        rounds: Watch/decide/act rounds K (≥ 1).
        conn_id: The ``qosflow_argo`` connection.
        group_id: Task-group id (unique within the DAG).
        deadline: Deadline override (``HH:MM`` in the DAG's timezone, ISO instant or duration).
        initial_units: Start size override (templated), ``None`` = the planned size.
        poll_interval: Seconds between progress polls.
        hold_seconds: How long a decision must hold (default: the job's ``dwell_seconds``).
        report_dir: Where the reports go (templated; a folder under ``AIRFLOW_HOME`` or a URL),
            overriding the connection's ``report_url`` (default ``$AIRFLOW_HOME/qosflow/reports``).
        deferrable: Watch from the triggerer (default) or poke from a worker.
        deadline_anchor: What a relative deadline counts from: ``queued`` (when the DAG run was
            queued: every re-run of it gets the same deadline), ``logical`` (its logical date)
            or ``plan`` (when the plan step runs).
        finish_retries: Retries of the finish step (2 by default: a retried finish re-attaches
            to the job's newest segment, and Airflow 3.3 can fail a task whose trigger fired
            while the scheduler was behind, apache/airflow#72716).
        on_miss: A job that trained but ended late: ``"fail"`` (default: finish fails without
            retry once history and report are written), ``"warn"``, or a callable that gets the
            finish XCom dict (``met``, ``lateness_s``, ``margin_s``...) and may raise.

    Returns:
        The task group: ``plan`` is its root, ``finish`` its leaf.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    with TaskGroup(group_id=group_id) as group:
        prefix = f"{group_id}."
        plan = PlanTrainingOperator(
            task_id="plan",
            job=job,
            conn_id=conn_id,
            deadline=deadline,
            initial_units=initial_units,
            deadline_anchor=deadline_anchor,
            retries=0,
        )
        submit = SubmitTrainingOperator(
            task_id="submit", plan_task_id=f"{prefix}plan", conn_id=conn_id
        )
        loop = _Rounds(prefix, conn_id, poll_interval, hold_seconds, deferrable, [plan >> submit])
        for k in range(1, rounds + 1):
            loop.add(k)
        finish = FinishTrainingOperator(
            task_id="finish",
            plan_task_id=f"{prefix}plan",
            watch_task_ids=loop.watch_ids,
            act_task_ids=loop.act_ids,
            state_task_ids=loop.state_ids,
            conn_id=conn_id,
            report_dir=report_dir,
            on_miss=on_miss,
            poll_interval=poll_interval,
            hold_seconds=hold_seconds,
            deferrable=deferrable,
            retries=finish_retries,
            retry_delay=timedelta(seconds=15),  # the job runs on: steer it again soon
            trigger_rule=TriggerRule.ALL_DONE,
        )
        [*loop.previous, *loop.dones] >> finish
    return _linked(group)


def _linked(group: TaskGroup) -> TaskGroup:
    """Every task of the group with a link to its run's qosflow view (the UI plugin)."""
    link = QosflowViewLink()
    for task in group.iter_tasks():
        task.operator_extra_links = (link,)
    return group
