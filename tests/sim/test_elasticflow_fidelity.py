"""ElasticFlow's admission as its artifact simulates it: the whole set is re-checked at every event.

ElasticFlow re-plans every admitted unfinished job together with the newcomers of an event, from
scratch, with their *current* remaining iterations. If any job of that set cannot meet its
deadline any more (an admitted job that fell behind, e.g. through the overhead model), every
deadline newcomer of the event is refused, whatever its own feasibility ("collateral" refusals),
best-effort newcomers are queued, and the admitted job is never revoked: it keeps running and
keeps blocking later events until it finishes (``ALGORITHM.md`` §4.2 and §5.2).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from qosflow.cli.simulate import load_workload, run_policy
from qosflow.sim.policies.elasticflow import ElasticFlow
from qosflow.sim.policy import JobView, SlotDecision, SlotSnapshot
from qosflow.sim.trace import ThroughputTable, elasticflow_dir

SPEEDS = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}  # iterations/s on 1..8 GPUs of an 8-GPU cluster
TABLE = ThroughputTable("A100", {("m", 64): SPEEDS})


def _view(job_id: str, deadline: float, total: int, done: float = 0.0, **kw: bool) -> JobView:
    return JobView(job_id, 0.0, deadline, total, done, 0, 1, SPEEDS, 8, "m", 64, **kw)


def _decide(
    policy: ElasticFlow, now: int, n: int, arrivals: tuple[str, ...], *jobs: JobView
) -> SlotDecision:
    return policy.decide(SlotSnapshot(now, 60, 8, 8, n, arrivals, (), jobs))


def _admit_tight_job() -> ElasticFlow:
    """``old`` needs all 8 GPUs for its whole window: admitted with zero slack."""
    policy = ElasticFlow(TABLE, slot=60)
    first = _decide(policy, 0, 0, ("old",), _view("old", 100.0, 800))
    assert first.admitted == ("old",)
    assert first.allocation == {"old": 8}
    return policy


def test_a_fallen_behind_admitted_job_makes_every_newcomer_of_the_event_refused() -> None:
    policy = _admit_tight_job()
    # 10 s lost to overhead: 400 iterations left, 40 s to go at 8 it/s -> old is infeasible;
    # "new" alone would easily fit (60 iterations, a deadline a day away)
    old, new = _view("old", 100.0, 800, done=400.0), _view("new", 86400.0, 60)
    second = _decide(policy, 60, 1, ("new",), old, new)
    assert second.rejected == ("new",)
    assert second.admitted == ()
    assert second.allocation == {"old": 8}  # never revoked: it runs on, past its deadline
    # it stays in the set: the next event is refused as well
    later = _view("later", 86400.0, 60)
    third = _decide(policy, 120, 2, ("later",), _view("old", 100.0, 800, done=720.0), later)
    assert third.rejected == ("later",)


def test_the_same_newcomer_is_admitted_while_the_admitted_jobs_stay_feasible() -> None:
    policy = _admit_tight_job()
    # on schedule: 320 iterations left, exactly 40 s at 8 it/s
    old, new = _view("old", 100.0, 800, done=480.0), _view("new", 86400.0, 60)
    second = _decide(policy, 60, 1, ("new",), old, new)
    assert second.rejected == ()
    assert second.admitted == ("new",)
    assert second.allocation == {"old": 8}  # new waits for old's reservation to end


def test_newcomers_of_one_event_are_refused_together_and_best_effort_ones_queue() -> None:
    policy = _admit_tight_job()
    old = _view("old", 100.0, 800, done=480.0)
    hopeless = _view("hopeless", 90.0, 10_000)  # cannot finish in 30 s even alone
    fine = _view("fine", 86400.0, 60)
    spare = _view("spare", float("inf"), 60, best_effort=True)
    second = _decide(policy, 60, 1, ("hopeless", "fine", "spare"), old, hopeless, fine, spare)
    assert set(second.rejected) == {"hopeless", "fine"}
    assert "spare" not in second.rejected
    assert "spare" in second.planned_finish  # queued in the runnable set


# -- job by job against the artifact's own simulator -----------------------------------------------

FIDELITY = elasticflow_dir() / "fidelity"


def _artifact(trace: str) -> dict[str, tuple[bool, bool]]:
    with (FIDELITY / "artifact" / f"{trace}_jobs.csv").open(newline="", encoding="utf-8") as fh:
        return {r["job_id"]: (r["admitted"] == "1", r["met"] == "1") for r in csv.DictReader(fh)}


@pytest.mark.slow
@pytest.mark.parametrize(("trace", "cluster", "slot"), [("t05", "8x8", 60), ("t01", "8x8", 240)])
def test_elasticflow_reproduces_the_artifacts_admission_and_met_job_by_job(
    trace: str, cluster: str, slot: int
) -> None:
    """Two traces of the fidelity set (one per slot length; the bench runs all twelve): the
    policy named ``elasticflow`` admits and meets exactly the artifact's jobs, through the CLI's
    own path (its timekeeping quirk included)."""
    w = load_workload(str(FIDELITY / "traces" / f"{trace}.csv"), cluster, "A100", 1)
    flags = _artifact(trace)
    run = run_policy(
        w, "elasticflow", slot=slot, speeds="oracle", seed=1, sigma=0.0, bound=None, timing=False
    )
    assert {o.job_id: (not o.rejected, o.met) for o in run.outcomes} == flags
    assert sum(met for _, met in flags.values()) > 0  # a trace where something is met at all


REFERENCE_JOBS = Path(__file__).parent / "fixtures" / "elasticflow_artifact"
MS = "microsoft-elasticflow-traces/data/elasticflow-traces"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "trace", "cluster", "gpu", "slot"),
    [
        ("195job", f"{MS}/195job.csv", "n16g8", "A100", 240),
        (
            "elasticVpollux_e",
            "pkusys-ElasticFlow/ElasticFlow/traces_for_ElasticFlow/elasticVpollux_e.csv",
            "n16g4",
            "T4",
            60,
        ),
    ],
)
def test_elasticflow_reproduces_the_artifact_job_by_job_on_reference_settings(
    setting: str, trace: str, cluster: str, gpu: str, slot: int
) -> None:
    """Two of the five reference settings, on the artifact's own cluster specs (the bench runs
    all five, cluster01 on its two switches included): the same admission and met flags."""
    w = load_workload(str(elasticflow_dir() / trace), cluster, gpu, 1)
    with (REFERENCE_JOBS / f"{setting}_jobs.csv").open(newline="", encoding="utf-8") as fh:
        flags = {r["job_id"]: (r["admitted"] == "1", r["met"] == "1") for r in csv.DictReader(fh)}
    run = run_policy(
        w, "elasticflow", slot=slot, speeds="oracle", seed=1, sigma=0.0, bound=None, timing=False
    )
    assert {o.job_id: (not o.rejected, o.met) for o in run.outcomes} == flags
