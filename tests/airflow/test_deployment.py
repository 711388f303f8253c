"""The multi-tenant DAG under a real Airflow deployment (tests/airflow/deployment.py).

The deployment is the one the session shares (``shared_deployment`` in ``conftest.py``; the
plugin's tests run their DAG on it after this module); its run here is this module's alone.

Scheduler, triggerer, dag-processor and api-server run as separate processes with LocalExecutor
and a PostgreSQL metadata database; the history store (and the job board in it) is a PostgreSQL
database too; the jobs train as real processes on the embedded local cluster (2 CPUs). The DAG
sizes its jobs from what the trainer does on this machine at the start of the run, so the checks
hold on a busy machine as on an idle one.

Every job-board allocation of the run is recorded (the rows the step read, the time, the
capacity, the answer) and replayed here: the cluster allocator the simulator's ``qosflow``
policy calls (``qosflow.core.allocator.allocate``) over the board's rows
(``qosflow_airflow.board.job_input``) must give the answer the step wrote; every row's
target must be one an allocation gave its job, and a job admitted in any job's step stays
guaranteed.

The DAG's sizing (``size_jobs``) is also checked without a cluster, at several measured speeds:
the story holds whatever this machine measures at the start.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from deployment import DAGS, RunResult, log

DAG_ID = "qosflow_multi_tenant"
DAG_FILE = DAGS[DAG_ID]
TEAMS = ("forecast", "ranking", "embeddings")


@pytest.fixture(scope="module")
def run(shared_deployment: dict[str, Any]) -> dict[str, Any]:
    """Run the DAG once on the shared deployment (``conftest.py``); its board allocations."""
    from qosflow.store.board import JobBoard
    from qosflow.store.history import HistoryStore

    dep, local = shared_deployment["dep"], shared_deployment["local"]
    started = time.monotonic()
    result = dep.run(DAG_ID, timeout_s=600)
    ids = _job_ids(result)
    # the deployment's other runs (another module's DAG) allocate on the board too: not this story
    records = [r for r in dep.board_log() if r["mine"] in ids.values()]
    store = HistoryStore(dep.history_url)
    try:
        with JobBoard(store, local.namespace).session(time.time()) as session:
            rows = session.entries("cpu")
    finally:
        store.close()
    pods = _pods_cpu_s(shared_deployment["root"] / "local")
    log(f"the training pods used {pods:.0f} CPU-s (the trainer's own usage reports)")
    out = {"result": result, "records": records, "rows": rows, "ids": ids}
    print(_story(out))
    log(f"the run and its checks' data: {time.monotonic() - started:.0f} s")
    return out


def _pods_cpu_s(state_dir: Path) -> float:
    """CPU seconds every pod's trainer reported using (``usage`` lines of its log)."""
    total = 0.0
    for path in state_dir.glob("pods/*/*/main.log"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"usage"' in line:
                total += float(json.loads(line).get("cpu_s", 0.0))
    return total


def _job_ids(result: RunResult) -> dict[str, str]:
    """Team → its run's job id (the board's key), from the plan XComs."""
    return {t: (result.xcom(f"{t}.plan") or {}).get("job_id", f"<{t}>") for t in TEAMS}


def _team(run: dict[str, Any], job_id: str) -> str:
    return next((t for t, j in run["ids"].items() if j == job_id), job_id)


def _acts(result: RunResult, team: str) -> list[dict[str, Any]]:
    """The team's rescale and bump records of its rounds, in time order."""
    acts = [
        result.xcom(t)
        for t, ti in result.tasks.items()
        if t.startswith(f"{team}.") and t.endswith((".rescale", ".bump")) and ti.state == "success"
    ]
    return sorted((a for a in acts if a), key=lambda a: float(a["time"]))


def _story(run: dict[str, Any]) -> str:
    """What happened, in words (printed; it is the first thing to read when a check fails)."""
    result: RunResult = run["result"]
    lines = [f"run {result.state} in {result.wall_s:.0f} s; sizes {result.xcom('measure')}"]
    for team in TEAMS:
        plan = result.xcom(f"{team}.plan") or {}
        lines.append(f"{team}: {plan.get('verdict')} at {plan.get('units')}: {plan.get('reason')}")
        for act in _acts(result, team):
            lines.append(f"  {act['how']}: {act['reason']}")
        report = result.xcom(f"{team}.finish") or result.xcom(f"{team}.finish", "report") or {}
        lines.append(f"  {report.get('verdict')} ({report.get('acts_after_rounds')} acts after)")
    t0 = run["records"][0]["now"] if run["records"] else 0.0
    lines.append(f"{len(run['records'])} board allocations (t in s from the first):")
    for rec in run["records"]:
        jobs = " ".join(
            f"{_team(run, e['job_id'])}:{e['units']}→{rec['out'][e['job_id']]['units']}"
            f"{'G' if rec['out'][e['job_id']]['guaranteed'] else ''}"
            for e in rec["entries"]
        )
        lines.append(
            f"  {rec['now'] - t0:6.1f} {_team(run, rec['mine'])}: cap {rec['capacity']} {jobs}"
        )
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_run_succeeds_and_every_guaranteed_deadline_is_met(run):
    result: RunResult = run["result"]
    assert result.state == "success", result.states()
    for team in TEAMS:
        plan, report = result.xcom(f"{team}.plan"), result.xcom(f"{team}.finish")
        assert report is not None, team
        if plan["verdict"] == "guaranteed":
            assert report["met"] is True, report["verdict"]
            assert report["margin_s"] >= 0, report["verdict"]
    print(f"the run took {result.wall_s:.0f} s")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_guarantees_and_a_late_arrival_told_best_effort_with_a_counter_offer(run):
    result: RunResult = run["result"]
    plans = {team: result.xcom(f"{team}.plan") for team in TEAMS}
    assert plans["forecast"]["verdict"] == "guaranteed", plans["forecast"]["reason"]
    assert plans["ranking"]["verdict"] == "guaranteed", plans["ranking"]["reason"]
    late = plans["embeddings"]
    assert late["verdict"] == "best_effort", late["reason"]
    assert late["counter_offer"] is not None, late["reason"]
    deadline = datetime.fromisoformat(late["job"]["deadline"]).timestamp()
    assert late["counter_offer"] > deadline  # the earliest deadline that would pass
    assert "earliest deadline that passes" in late["reason"]
    assert "even alone" in late["reason"]  # its own work, not the others, rules it out
    assert plans["forecast"]["units"] == 2  # its team starts it on both (initial_units)


def _give_back(run: dict[str, Any]) -> dict[str, Any]:
    """The allocation in which ``forecast``'s target first fell below what it held for ranking."""
    forecast, ranking = run["ids"]["forecast"], run["ids"]["ranking"]
    for rec in run["records"]:
        held = {e["job_id"]: e["units"] for e in rec["entries"]}
        ahead = rec["out"].get(forecast)
        if ranking in rec["out"] and ahead and ahead["units"] < held.get(forecast, 0):
            return rec
    raise AssertionError("forecast's target never fell below what it held")


def _held(run: dict[str, Any], team: str) -> list[tuple[float, int]]:
    """``(time, units)`` a job's own steps published on the board, in time order."""
    job = run["ids"][team]
    return [
        (rec["now"], e["units"])
        for rec in run["records"]
        for e in rec["entries"]
        if e["job_id"] == job and rec["mine"] == job
    ]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_ahead_job_gives_a_cpu_back_to_the_behind_one(run):
    rec = _give_back(run)
    ranking = run["ids"]["ranking"]
    assert rec["out"][ranking]["guaranteed"], rec["out"]
    assert rec["out"][ranking]["units"] >= 1, rec["out"]
    after = [(t, n) for t, n in _held(run, "forecast") if t > rec["now"]]
    assert any(n < 2 for _, n in after), after  # forecast's own watch then held less
    ran = [(t, n) for t, n in _held(run, "ranking") if t > rec["now"] and n >= 1]
    assert ran, _held(run, "ranking")  # and ranking trained on what it gave back
    acts = [a for a in _acts(run["result"], "forecast") if a["how"] != "none"]
    print(f"forecast's acts: {[(a['how'], a['from'], a['to']) for a in acts]}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_deciding_per_job_would_have_missed_ranking(run):
    """At the give-back, forecast alone keeps both CPUs; waiting for it, ranking ends late."""
    from qosflow.core.decide import Action, JobSnapshot, decide
    from qosflow.core.predict import predict
    from qosflow.store.board import BoardEntry
    from qosflow_airflow.board import job_input

    rec = _give_back(run)
    jobs = {e["job_id"]: job_input(BoardEntry(**e)) for e in rec["entries"]}
    forecast, ranking = jobs[run["ids"]["forecast"]], jobs[run["ids"]["ranking"]]
    now = float(rec["now"])
    snap = JobSnapshot(
        forecast.spec,
        now,
        int(forecast.done),
        forecast.units,
        False,
        forecast.state.rescaled_at,
        forecast.rescale_overhead_s,
    )
    alone = decide(snap, forecast.belief, free_units=0)
    assert alone.action is not Action.SCALE_DOWN, alone.reason
    assert alone.units == 2, alone.reason
    # at the speeds measured at the start (what the DAG sized the jobs with) ...
    two = run["result"].xcom("measure")["speeds"]["two_cpus"]
    left_f = forecast.spec.total_steps - forecast.done
    left_r = ranking.spec.total_steps - ranking.done
    late = now + (left_f + left_r) / two - ranking.spec.deadline
    # ... and at the speeds the board believed then (the load of this machine moves them)
    ends = predict(
        forecast.belief,
        now=now,
        steps_done=int(forecast.done),
        total_steps=forecast.spec.total_steps,
        units=2,
        current_units=2,
    ).median_finish
    believed = ends + left_r * ranking.belief.median.step_time(2) - ranking.spec.deadline
    print(
        f"waiting for forecast, ranking would have ended {late:.0f} s after its deadline at "
        f"the measured speeds, {believed:.0f} s at the board's beliefs then"
    )
    assert late > 0


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_board_allocation_is_the_allocators_answer_to_the_board(run):
    from qosflow.core.allocator import ClusterInput, allocate
    from qosflow.store.board import BoardEntry
    from qosflow_airflow.board import job_input

    records = run["records"]
    assert len(records) > 20
    targets: dict[str, set[int]] = {}  # job → every target an allocation gave it so far
    admitted_at: dict[str, float] = {}  # job → when an allocation (any job's step) admitted it
    mismatches, stale, forgotten = [], [], []
    for rec in records:
        entries = [BoardEntry(**e) for e in rec["entries"]]
        out = allocate(
            ClusterInput(
                now=rec["now"],
                capacity=rec["capacity"],
                slot_s=rec["slot_s"],
                jobs=tuple(job_input(e, rec["now"]) for e in entries),
                freed=rec["freed"],
                plan_factor=rec["plan_factor"],
                max_utilisation=rec["max_utilisation"],
            )
        )
        got = {
            k: {"units": a.units, "klass": a.klass, "guaranteed": a.guaranteed, "reason": a.reason}
            for k, a in out.jobs.items()
        }
        if got != rec["out"]:
            mismatches.append(
                {"now": rec["now"], "mine": rec["mine"], "got": got, "was": rec["out"]}
            )
        for e in entries:  # another job's row carries what an allocation gave it
            if e.job_id == rec["mine"]:
                continue
            if e.job_id in targets and e.target not in targets[e.job_id]:
                stale.append((rec["now"], e.job_id, e.target, sorted(targets[e.job_id])))
            # admitted in some step (5 s of grace: steps take their time before the lock)
            if admitted_at.get(e.job_id, rec["now"]) < rec["now"] - 5 and not e.guaranteed:
                forgotten.append((rec["now"], e.job_id, admitted_at[e.job_id]))
        for k, a in rec["out"].items():
            targets.setdefault(k, {0}).add(a["units"])
            if a["guaranteed"]:
                admitted_at.setdefault(k, rec["now"])
    assert not mismatches, json.dumps(mismatches[:2], indent=1)
    assert not stale, stale[:5]
    assert not forgotten, forgotten[:5]  # a guarantee given in any job's step is kept
    assert len({r["mine"] for r in records}) == len(TEAMS)  # every job's steps allocated


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_job_left_the_board(run):
    rows = {row.job_id: row for row in run["rows"]}
    for team, job_id in run["ids"].items():
        assert job_id in rows, team
        assert rows[job_id].finished_at is not None, team
        assert rows[job_id].units == 0, team


def _dag_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("qosflow_multi_tenant_dag", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("rate1", "rate2"), [(5.5, 10.0), (5.0, 7.5), (3.0, 3.6), (8.0, 15.5), (1.0, 1.9)]
)
def test_the_sizing_keeps_its_promises_at_any_measured_speed(rate1, rate2):
    """The story holds at the measured speeds, whatever this machine measures (no cluster)."""
    m = _dag_module()
    sizes = m.size_jobs(rate1, rate2)
    s = sizes["speeds"]["speedup"]
    f, r, e = sizes["forecast"], sizes["ranking"], sizes["embeddings"]
    work, work_r = f["steps"] / rate1, r["steps"] / rate1  # one-CPU seconds
    # forecast alone: a smaller size must end by deadline - 2 margins, which one CPU never does
    assert f["deadline_s"] - 2 * f["margin_s"] < work / s
    # ... while lending ranking a CPU until ranking's deadline fits its plan (deadline - margin)
    left = work - s * m.ARRIVAL_S
    lent = r["deadline_s"] - r["margin_s"]
    lending = m.ARRIVAL_S + lent + max(left * m.SLACK - lent, 0.0) / s
    assert lending + m.SAFETY_S <= f["deadline_s"] - f["margin_s"] + 1
    # ranking on one CPU at SLACK times its speed, after one give-back, meets its deadline
    assert m.LATENCY_S + work_r * m.SLACK <= r["deadline_s"] - r["margin_s"]
    # deciding per job, ranking waits for forecast's end on two CPUs and ends GAP_S late
    assert (work + work_r) / s - (m.ARRIVAL_S + r["deadline_s"]) >= m.GAP_S - 1
    # embeddings wants its result sooner than both CPUs could deliver it, even at its median
    assert e["steps"] / rate1 / s > e["deadline_s"] - e["margin_s"]
    # every job writes a checkpoint before its end, so the plan step takes its spec
    assert 1 <= sizes["checkpoint_every_steps"] < min(f["steps"], r["steps"], e["steps"])
