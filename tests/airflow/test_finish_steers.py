"""After the last round the finish step keeps steering: the loop never runs out.

A job planned at 1 CPU that needs 2 to make its deadline reaches the finish step without a round
(``rounds`` used up): the finish step's wait is the same watch on the job board, the allocator
gives the job the free CPU and the finish step resizes it itself, then waits again until the end.
Deferred, each action is one trigger run and one ``execute_complete`` that defers again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

import pytest

from qosflow.core.cluster import Phase


def job(**over: Any) -> dict[str, Any]:
    data = {
        "name": "late-job",
        "total_steps": 300,
        "deadline": "PT4M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "dwell_seconds": 10,
        "margin_seconds": 5,
        "step_seconds_estimate": 1.0,
    }
    data.update(over)
    return data


class TI:
    """XCom store of one DAG run (pushes are visible to later pulls, like Airflow's)."""

    def __init__(self, task_id: str = "finish") -> None:
        self.task_id = task_id
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = value


def _planned_at_one_cpu(ti: TI) -> None:
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator

    ctx = {"ti": ti, "dag": None, "run_id": "r1"}
    plan = PlanTrainingOperator(task_id="plan", job=job(), initial_units=1).execute(ctx)
    ti.xcoms[("plan", "return_value")] = plan
    submit = SubmitTrainingOperator(task_id="submit", plan_task_id="plan")
    submit.execute({**ctx, "ti": _as(ti, "submit")})


def _as(ti: TI, task_id: str) -> Any:
    view = mock.Mock(wraps=ti)
    view.xcom_pull.side_effect = ti.xcom_pull
    view.xcom_push.side_effect = lambda key, value: ti.xcoms.__setitem__((task_id, key), value)
    return view


def _recording_resizes(cluster: Any) -> list[int]:
    sizes: list[int] = []
    resize = cluster.resize

    def recording(name: str, units: int) -> Any:
        sizes.append(units)
        return resize(name, units)

    cluster.resize = recording
    return sizes


def _finish(**kw: Any) -> Any:
    from qosflow_airflow.operators.finish import FinishTrainingOperator

    return FinishTrainingOperator(
        task_id="finish",
        plan_task_id="plan",
        state_task_ids=["submit"],
        poll_interval=0.0,
        hold_seconds=0.0,
        report_dir=kw.pop("report_dir"),
        **kw,
    )


def test_the_finish_step_resizes_a_late_job_itself_and_it_meets_its_deadline(
    fake_cluster: Any, tmp_path: Any
) -> None:
    fake_cluster.in_place = True
    resizes = _recording_resizes(fake_cluster)
    ti = TI()
    _planned_at_one_cpu(ti)
    assert fake_cluster.requests[0].units == 1
    result = _finish(deferrable=False, report_dir=str(tmp_path)).execute({"ti": ti})
    assert result["acts_after_rounds"] >= 1 and result["met"], result["table"]
    assert resizes[0] == 2  # it took the free CPU (and may give it back once far ahead)
    assert ti.xcoms[("finish", "state")]["units"] == resizes[-1]  # the new state is published


def test_waiting_only_never_acts(fake_cluster: Any, tmp_path: Any) -> None:
    fake_cluster.in_place = True
    ti = TI()
    _planned_at_one_cpu(ti)
    finish = _finish(deferrable=False, steer=False, report_dir=str(tmp_path), on_miss="warn")
    result = finish.execute({"ti": ti})  # it misses: "warn" lets the result through
    assert result["acts_after_rounds"] == 0 and not result["met"]


def test_deferred_the_finish_step_acts_and_defers_again_until_the_end(
    fake_cluster: Any, tmp_path: Any
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    fake_cluster.in_place = True
    resizes = _recording_resizes(fake_cluster)
    ti = TI()
    _planned_at_one_cpu(ti)
    op = _finish(report_dir=str(tmp_path))
    call, kwargs, deferrals = op.execute, {}, 0
    for _ in range(10):
        try:
            result = call({"ti": ti}, **kwargs)
            break
        except TaskDeferred as deferred:
            deferrals += 1
            _path, trigger_kwargs = deferred.trigger.serialize()
            trigger = DeadlineProgressTrigger(**json.loads(json.dumps(trigger_kwargs)))
            event = asyncio.run(trigger.run().asend(None)).payload
            call = op.execute_complete
            kwargs = {"event": event, **json.loads(json.dumps(deferred.kwargs or {}))}
    else:
        pytest.fail("the finish step never ended")
    assert deferrals >= 2  # waited, acted and waited again
    assert result["acts_after_rounds"] >= 1 and result["met"], result["table"]
    ended = [s for s in fake_cluster.jobs.values() if s.phase is Phase.SUCCEEDED]
    assert len(ended) == 1 and resizes[0] == 2
