"""Parity: a recorded job snapshot decided by the simulator's adapter and by the Airflow watch.

``fixtures/parity_cases.json`` (written by ``fixtures/make_parity.py``) holds jobs as the
simulator's engine shows them to the qosflow policy in learned mode -- progress samples, progress
at ``now``, free units, last rescale -- with the job spec and status the Airflow watch would have
for the same job and the history prior it would be handed. Each case goes through

* the simulator: :class:`~qosflow.sim.truth.LearnedBelief` (the engine's fit) ->
  :class:`~qosflow.sim.policy.JobView` -> :mod:`qosflow.sim.adapter`;
* Airflow: ``job_from_dict`` (the spec as XCom carries it) -> ``Watcher.decide`` (what the
  deferrable trigger runs on every poll);

and the two decisions must be identical: action, units, both finish predictions, margin, reason.
The recorded action pins which branch of the core each case exercises.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from qosflow.core.cluster import JobStatus, Phase
from qosflow.core.decide import Decision
from qosflow.core.planning import belief_for
from qosflow.core.predict import Calibration
from qosflow.core.spec import JobSpec
from qosflow.core.speed import ProgressSample, SpeedModel, TableCurve
from qosflow.sim import adapter
from qosflow.sim.policy import JobView
from qosflow.sim.trace import ThroughputTable, TraceJob
from qosflow.sim.truth import FittedSpeeds, LearnedBelief, Truth
from qosflow_airflow.state import job_from_dict
from qosflow_airflow.watch import Watcher

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "parity_cases.json").read_text(encoding="utf-8")
)
SIM: dict[str, Any] = FIXTURE["sim"]
CASES: list[dict[str, Any]] = FIXTURE["cases"]
CALIBRATION = Calibration(SIM["calibration"]["factor"], SIM["calibration"]["n"])


def _view(case: dict[str, Any]) -> JobView:
    """The job as the engine shows it to a policy in learned mode (``_Run.view``)."""
    j = case["job"]
    job = TraceJob(**j, duration=0.0)
    curve = {int(k): float(v) for k, v in case["speeds"].items()}
    truth = Truth(ThroughputTable("A100", {(job.model, job.batch_size): curve}))
    samples = [(float(t), float(d), int(u)) for t, d, u in case["samples"]]
    status = case["status"]
    return JobView(
        job_id=job.job_id,
        submit=job.submit,
        deadline=job.deadline,
        total=job.iterations,
        done=float(status["steps_done"] or 0),
        units=status["units"] if status["phase"] == "Running" else 0,
        requested=job.num_gpu,
        speeds=LearnedBelief(truth, node_size=SIM["node_size"]).speeds(job, samples),
        max_units=truth.max_units(job),
        model=job.model,
        batch_size=job.batch_size,
    )


def _sim_decision(case: dict[str, Any]) -> Decision:
    return adapter.decision(
        _view(case),
        node_size=SIM["node_size"],
        margin_s=SIM["margin_s"],
        dwell_s=SIM["dwell_s"],
        calibration=CALIBRATION,
        now=case["now"],
        last_rescale_at=case["last_rescale_at"],
        rescale_overhead_s=SIM["rescale_overhead_s"],
        free_units=case["free_units"],
    )


def _samples(case: dict[str, Any]) -> list[ProgressSample]:
    return [ProgressSample(float(t), int(d), int(u)) for t, d, u in case["samples"]]


def _watcher(case: dict[str, Any], spec: JobSpec) -> Watcher:
    """The watch as ``new_watcher`` primes it: history prior, calibration, samples seen."""
    watcher = Watcher(
        spec=spec,
        workflow=f"{spec.name}-0",
        last_rescale_at=case["last_rescale_at"],
        prior=SpeedModel.from_params(case["prior"], spec.resources.per_node),
        calibration=CALIBRATION,
        rescale_overhead_s=SIM["rescale_overhead_s"],
    )
    watcher.samples = _samples(case)
    return watcher


def _airflow_decision(case: dict[str, Any]) -> Decision:
    spec = job_from_dict(case["spec"])
    s = case["status"]
    status = JobStatus(
        name=f"{spec.name}-0",
        job=spec.name,
        segment=0,
        phase=Phase(s["phase"]),
        steps_done=s["steps_done"],
        total_steps=spec.total_steps,
        units=s["units"],
    )
    return _watcher(case, spec).decide(status, now=case["now"], free_units=case["free_units"])


def test_the_fixture_covers_every_kind_of_decision() -> None:
    actions = {c["expected_action"] for c in CASES}
    assert {"on_track", "scale_up", "bump", "scale_down"} <= actions
    assert any(c["status"]["phase"] == "Pending" for c in CASES)
    assert any(len(c["samples"]) < 3 for c in CASES if c["status"]["phase"] == "Running")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_both_adapters_build_the_same_spec_and_belief(case: dict[str, Any]) -> None:
    view = _view(case)
    spec = job_from_dict(case["spec"])
    ours = adapter.job_spec(
        view, node_size=SIM["node_size"], margin_s=SIM["margin_s"], dwell_s=SIM["dwell_s"]
    )
    assert ours == spec
    watcher = _watcher(case, spec)
    theirs = belief_for(spec, watcher.samples, prior=watcher.prior, calibration=watcher.calibration)
    assert adapter.belief_of(view, spec.resources.levels, CALIBRATION) == theirs


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_sim_adapter_and_airflow_watch_decide_the_same(case: dict[str, Any]) -> None:
    sim, airflow = _sim_decision(case), _airflow_decision(case)
    assert sim.action.value == case["expected_action"]
    assert (sim.action, sim.units) == (airflow.action, airflow.units)
    assert sim.median_finish == airflow.median_finish
    assert sim.conservative_finish == airflow.conservative_finish
    assert sim == airflow  # margin, deadline and the reason in words too


def test_learned_speeds_read_as_the_fitted_table() -> None:
    view = _view(CASES[0])
    assert isinstance(view.speeds, FittedSpeeds)
    assert dict(view.speeds) == dict(view.speeds.table)
    assert view.speeds == dict(view.speeds.table)
    model = view.speeds.fit.model
    assert all(view.speeds[n] == model.throughput(n) for n in view.speeds)


def test_oracle_speeds_are_planned_on_as_they_are() -> None:
    case = CASES[0]
    table = {int(k): float(v) for k, v in case["speeds"].items()}
    oracle = replace(_view(case), speeds=table)
    levels = tuple(sorted(table))
    belief = adapter.belief_of(oracle, levels, None)
    assert belief.median == belief.conservative == TableCurve(table)
    assert belief.observed == ()
    slower = adapter.belief_of(oracle, levels, Calibration(1.25))
    assert slower.conservative.step_time(8) == pytest.approx(1.25 / table[8])


def test_the_qosflow_policy_decides_through_this_adapter() -> None:
    """Parity of the adapter is worth something only if the policy uses it (drop the mark then)."""
    from qosflow.core import allocator
    from qosflow.sim.policies import qosflow_policy, xing19

    assert qosflow_policy.job_spec is adapter.job_spec
    assert qosflow_policy.belief_of is adapter.belief_of
    assert qosflow_policy.allocate is allocator.allocate
    assert getattr(xing19, "belief_of", None) is adapter.belief_of
    # the allocator snapshots a job exactly as the adapter (and so the watch) does
    for case in CASES[:5]:
        view = _view(case)
        spec = adapter.job_spec(view, node_size=8, margin_s=60.0, dwell_s=600.0)
        belief = adapter.belief_of(view, spec.resources.levels, None)
        job = allocator.JobInput(spec, view.done, view.units, belief, rescale_overhead_s=30.0)
        cluster = allocator.ClusterInput(
            now=float(case["now"]), capacity=64, slot_s=60.0, jobs=(job,)
        )
        got = allocator.prepare(job, cluster, job.state).snap
        want = adapter.job_snapshot(
            view, spec, now=float(case["now"]), last_rescale_at=None, rescale_overhead_s=30.0
        )
        assert got == want


def test_sizes_of_the_key_history_count_as_observed_on_both_sides() -> None:
    """A run of the key measured 8 units; the new run measured only 2 so far.

    The simulator's belief fits the key's history of completed runs and keeps what it measured
    (``FittedSpeeds.known``); the watch is primed as ``new_watcher`` primes it from the history
    store: ``prior_of`` the history and ``measured`` of it. Both must plan up to 16 units (one
    level beyond 8), not 4, and both anchor 8 units at what the earlier run measured there.
    """
    from qosflow.core.fit import measured
    from qosflow.core.prior import prior_of

    case = CASES[0]
    j = case["job"]
    curve = {int(k): float(v) for k, v in case["speeds"].items()}
    earlier = TraceJob(**{**j, "job_id": "earlier"}, duration=0.0)
    job = TraceJob(**j, duration=0.0)
    truth = Truth(ThroughputTable("A100", {(job.model, job.batch_size): curve}))
    belief = LearnedBelief(truth, node_size=SIM["node_size"])
    run = [(10.0 * i, 10.0 * i * curve[8], 8) for i in range(40)]
    belief.finished(earlier, run)
    own = [(1000.0 + 10.0 * i, 10.0 * i * curve[2], 2) for i in range(40)]
    speeds = belief.speeds(job, own)
    assert isinstance(speeds, FittedSpeeds)
    assert speeds.known == measured([ProgressSample(t, int(d), u) for t, d, u in run])
    assert [m.units for m in speeds.known] == [8]

    spec = job_from_dict(case["spec"])
    history = [ProgressSample(t, int(d), u) for t, d, u in run]
    watcher = Watcher(
        spec=spec,
        workflow=f"{spec.name}-0",
        last_rescale_at=None,
        prior=prior_of(history, spec.resources.per_node),
        known=measured(history),
        calibration=CALIBRATION,
    )
    watcher.samples = [ProgressSample(t, int(d), u) for t, d, u in own]
    theirs = belief_for(
        spec,
        watcher.samples,
        prior=watcher.prior,
        calibration=watcher.calibration,
        known=watcher.known,
    )
    view = replace(_view(case), speeds=speeds, units=2, done=own[-1][1])
    ours = adapter.belief_of(view, spec.resources.levels, CALIBRATION)
    assert ours.observed == theirs.observed == (2, 8)
    assert ours.probe_limit == theirs.probe_limit == 16
    assert all(
        ours.conservative.step_time(n) == pytest.approx(theirs.conservative.step_time(n))
        for n in spec.resources.levels
    )
    # 8 units is believed as the earlier run measured it there, not as the model fits it
    assert ours.median.step_time(8) == theirs.median.step_time(8) == speeds.known[0].step_time
