"""Simulator tests: golden metrics, ElasticFlow semantics, loaders, engine order, placement."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from qosflow.core.errors import ClusterError, SpecError, TraceError
from qosflow.sim import engine
from qosflow.sim.engine import SimConfig, SimResult, simulate
from qosflow.sim.placement import buddy_place
from qosflow.sim.policies.edf_elastic import EdfElastic
from qosflow.sim.policies.elasticflow import ElasticFlow
from qosflow.sim.policies.k8s_default import K8sDefault
from qosflow.sim.trace import (
    ClusterShape,
    cluster_shape,
    elasticflow_dir,
    load_cluster_spec,
    load_throughputs,
    load_trace,
)
from qosflow.sim.truth import Noise

HEADER = "job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration\n"
A100 = load_throughputs("A100")
T8 = A100.curve("resnet50", 256)[8]


def _trace(tmp_path: Path, rows: list[str], header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def _run(path: Path, policy: object, capacity: int = 8, slot: int = 60, **kw: object) -> SimResult:
    jobs = load_trace(path, A100)
    cfg = SimConfig(capacity=capacity, node_size=8, slot=slot, **kw)  # type: ignore[arg-type]
    return simulate(jobs, A100, policy, cfg)  # type: ignore[arg-type]


# golden metrics ------------------------------------------------------------------------------


def test_generated_100_jobs_elasticflow_meets_every_deadline_exactly_like_the_artifact() -> None:
    jobs = load_trace(elasticflow_dir() / "generated/100jobs_1500lam.csv", A100)
    cfg = SimConfig(capacity=128, node_size=8, slot=240)
    ef = simulate(jobs, A100, ElasticFlow(A100, slot=240), cfg)
    edf = simulate(jobs, A100, EdfElastic(), cfg)
    assert (ef.met, ef.deadline_jobs, ef.ratio, ef.planned_ratio) == (100, 100, 1.0, 1.0)
    assert edf.met == 92  # the artifact's EDF: 0.92 on this trace


def test_tiny_trace_fifo_serialises_and_elasticflow_refuses_the_infeasible_batch(
    tmp_path: Path,
) -> None:
    size = int(600 * T8)  # 600 s on 8 GPUs
    path = _trace(
        tmp_path,
        [f"a,0,{size},resnet50,700,256,8,600", f"b,0,{size},resnet50,1100,256,8,600"],
    )
    fifo = _run(path, K8sDefault())
    a, b = fifo.outcomes
    assert a.finish == math.ceil(size / T8) and a.met
    assert b.started == a.finish and b.finish == a.finish + math.ceil(size / T8) and not b.met
    assert fifo.ratio == 0.5
    edf = _run(path, EdfElastic())
    assert [o.finish for o in edf.outcomes] == [o.finish for o in fifo.outcomes]
    # ElasticFlow admits arrivals of one event all-or-nothing: b cannot fit after a -> both refused.
    ef = _run(path, ElasticFlow(A100, slot=60))
    assert [o.rejected for o in ef.outcomes] == [True, True] and ef.ratio == 0.0


def test_elasticflow_admits_a_feasible_pair_and_gives_leftover_gpus_away(tmp_path: Path) -> None:
    size = int(600 * T8)
    path = _trace(
        tmp_path,
        [f"a,0,{size},resnet50,5000,256,8,600", f"b,0,{size},resnet50,5000,256,8,600"],
    )
    ef = _run(path, ElasticFlow(A100, slot=60), capacity=16)
    assert ef.ratio == 1.0 and all(o.admitted and not o.rejected for o in ef.outcomes)
    assert max(u for _, u in ef.usage) == 16  # leftover GPUs were handed out


# engine --------------------------------------------------------------------------------------


def test_arrivals_inside_a_slot_are_handled_at_the_slot_boundary(tmp_path: Path) -> None:
    size = int(3000 * T8)
    path = _trace(
        tmp_path,
        [f"a,0,{size},resnet50,99999,256,8,600", f"b,10,{size},resnet50,99999,256,8,600"],
    )
    result = _run(path, K8sDefault(), capacity=16, slot=60)
    a, b = result.outcomes
    assert a.started == 0 and b.started == 60


def test_same_seed_gives_identical_results_and_noise_changes_them(tmp_path: Path) -> None:
    rows = [
        f"j{i},{i * 50},{int((300 + 40 * i) * T8)},resnet50,{900 + 90 * i},256,8,1"
        for i in range(8)
    ]
    path = _trace(tmp_path, rows)
    noisy = {"noise": Noise(sigma=0.2, slow_prob=0.1, slow_factor=2.0)}
    one = _run(path, EdfElastic(), seed=7, **noisy)
    two = _run(path, EdfElastic(), seed=7, **noisy)
    other = _run(path, EdfElastic(), seed=8, **noisy)
    assert one == two
    assert [o.finish for o in one.outcomes] != [o.finish for o in other.outcomes]


def test_dropping_stale_events_never_changes_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decision re-announces each running job's end; the stale ones are dropped in bulk."""
    rows = [
        f"j{i},{i * 50},{int((300 + 40 * i) * T8)},resnet50,{900 + 90 * i},256,8,1"
        for i in range(12)
    ]
    path = _trace(tmp_path, rows)
    noisy = {"noise": Noise(sigma=0.2, slow_prob=0.1, slow_factor=2.0)}
    monkeypatch.setattr(engine, "COMPACT_AT", 10**9)
    kept = [
        _run(path, p, capacity=16, seed=3, **noisy)
        for p in (EdfElastic(), ElasticFlow(A100, slot=60))
    ]
    compactions: list[int] = []
    real = engine._Run.compact
    monkeypatch.setattr(engine, "COMPACT_AT", 0)
    monkeypatch.setattr(engine._Run, "compact", lambda run: (compactions.append(1), real(run)))
    dropped = [
        _run(path, p, capacity=16, seed=3, **noisy)
        for p in (EdfElastic(), ElasticFlow(A100, slot=60))
    ]
    assert compactions  # the bulk drop ran
    assert dropped == kept


def test_an_over_allocating_policy_is_refused(tmp_path: Path) -> None:
    class Greedy:
        name = "greedy"
        overhead = EdfElastic().overhead

        def decide(self, snap):  # type: ignore[no-untyped-def]
            from qosflow.sim.policy import SlotDecision

            return SlotDecision(allocation={j.job_id: 8 for j in snap.jobs})

    path = _trace(tmp_path, ["a,0,100,resnet50,999,256,8,1", "b,0,100,resnet50,999,256,8,1"])
    with pytest.raises(ClusterError, match="capacity"):
        _run(path, Greedy())


def test_buddy_placement_packs_power_of_two_sizes_without_fragmenting() -> None:
    spots = buddy_place(
        [("s1", 1), ("big", 16), ("s4", 4), ("s2", 2), ("s1b", 1)], capacity=32, node_size=8
    )
    assert spots["big"] == ((0, 1), 0)
    assert spots["s4"] == ((2,), 16) and spots["s2"] == ((2,), 20)
    assert spots["s1"][0] == (2,) and spots["s1b"][0] == (2,)
    with pytest.raises(ClusterError):
        buddy_place([("a", 16), ("b", 16), ("c", 8)], capacity=32, node_size=8)


def test_buddy_placement_is_first_fit_largest_first_on_random_power_of_two_mixes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        node_size = rng.choice((4, 8))
        nodes = rng.randint(1, 12)
        sizes, room = [], nodes * node_size
        while room and rng.random() < 0.9:
            k = min(rng.choice((1, 2, 4, 8, 16, 32)), room)
            k = 1 << (k.bit_length() - 1)  # a power of two that still fits
            sizes.append((f"j{len(sizes)}", k))
            room -= k
        spots = buddy_place(sizes, capacity=nodes * node_size, node_size=node_size)
        used = [0] * nodes  # replay the rule: largest first, whole free nodes or first fit
        for job_id, k in sorted(sizes, key=lambda s: -s[1]):
            where, rank = spots[job_id]
            if k >= node_size:
                expected = [n for n in range(nodes) if used[n] == 0][: -(-k // node_size)]
                assert list(where) == expected and rank == expected[0] * node_size
                for n in where:
                    used[n] = node_size
                continue
            fits = [n for n in range(nodes) if 0 < used[n] <= node_size - k]
            expected_node = fits[0] if fits else next(n for n in range(nodes) if used[n] == 0)
            assert where == (expected_node,) and rank == expected_node * node_size + used[where[0]]
            used[expected_node] += k
        assert all(u <= node_size for u in used)


# trace loaders ---------------------------------------------------------------------------------


def test_both_column_name_variants_load_the_same_job(tmp_path: Path) -> None:
    ms = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
    (tmp_path / "ms.csv").write_text(ms + "x,5,100,bert,50,128,2,30\n", encoding="utf-8")
    (tmp_path / "ef.csv").write_text(HEADER + "x,5,100,bert,50,128,2,30\n", encoding="utf-8")
    assert load_trace(tmp_path / "ms.csv") == load_trace(tmp_path / "ef.csv")


def test_best_effort_jobs_have_no_deadline(tmp_path: Path) -> None:
    path = tmp_path / "be.csv"
    path.write_text(HEADER.strip() + ",best_effort\nx,0,10,bert,5,128,1,3,1\n", encoding="utf-8")
    (job,) = load_trace(path)
    assert job.best_effort and job.deadline == math.inf


@pytest.mark.parametrize(
    ("row", "column", "rule"),
    [
        ("x,0,ten,bert,50,128,1,30", "iteration", "not a number"),
        ("x,0,10,bert,50,128,0,30", "num_gpu", ">= 1"),
        ("x,60,10,bert,50,128,1,30", "ddl", "before the submit"),
        ("x,0,10,bert,50,96,1,30", "model_name", "no A100 throughput for bert/96"),
        ("x,0,10.5,bert,50,128,1,30", "iteration", "integer"),
    ],
)
def test_bad_rows_name_file_line_and_column(
    tmp_path: Path, row: str, column: str, rule: str
) -> None:
    path = _trace(tmp_path, ["ok,0,10,bert,50,128,1,30", row])
    with pytest.raises(TraceError, match=rule) as info:
        load_trace(path, A100)
    assert (info.value.path, info.value.line, info.value.column) == (str(path), 3, column)


def test_missing_column_and_duplicate_ids_are_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time\nx,0\n", encoding="utf-8")
    with pytest.raises(TraceError, match="missing column"):
        load_trace(bad)
    dup = _trace(tmp_path, ["x,0,10,bert,50,128,1,30", "x,1,10,bert,50,128,1,30"])
    with pytest.raises(TraceError, match="duplicate"):
        load_trace(dup)


def test_tables_caps_and_cluster_specs() -> None:
    t4 = load_throughputs("T4")
    assert 64 not in t4.curve("deepspeech2", 320) and 32 not in t4.curve("yolov3", 64)
    assert 64 not in A100.curve("deepspeech2", 32)  # empty cell = not allowed
    assert A100.elasticflow_cap("bert", 64) == 8 and A100.elasticflow_cap("deepspeech2", 32) == 32
    assert t4.elasticflow_cap("ncf", 32768) == 1 and t4.elasticflow_cap("imagenet", 3200) == 64
    assert A100.generic_cap("deepspeech2", 32) == 32 and t4.generic_cap("yolov3", 64) == 16
    assert (
        load_cluster_spec("n64g8") == ClusterShape(2, 32, 8)
        and load_cluster_spec("n64g8").total == 512
    )
    assert ClusterShape.parse("16x8").total == 128


def test_a_cluster_is_nodes_x_units_or_an_artifact_spec_with_its_switches() -> None:
    assert cluster_shape("n64g8") == ClusterShape(2, 32, 8)  # what cluster01 ran on
    assert cluster_shape("64x8") == ClusterShape(1, 64, 8)
    with pytest.raises(SpecError, match=r"cluster: must look like 16x8 .* such as n64g8"):
        cluster_shape("64-8")


# ElasticFlow planner and overhead ------------------------------------------------------------


def test_minimum_satisfactory_share_on_a_flat_and_on_a_reserved_profile() -> None:
    from qosflow.sim.policies.ef_plan import JobCurve, plan

    speed = A100.curve("resnet50", 256)
    curve = JobCurve(tuple(sorted(speed)), speed, 64)
    work = 1000 * speed[4]  # 1000 s on 4 GPUs, 2000 s would not do on 2
    flat = plan(curve, ddl=1100, left=work, profile=([0], [16]), now=0, slot=60, capacity=16)
    assert flat.ok and flat.allocations == ((0, 4),)
    assert flat.real_end == math.ceil(work / speed[4]) and flat.end == 1020
    assert flat.profile == ([0, 1020], [12, 16])
    # 14 of 16 GPUs are taken until t=600: the share must be 8 from 600 on (and 2 before).
    busy = plan(
        curve, ddl=1100, left=work, profile=([0, 600], [2, 16]), now=0, slot=60, capacity=16
    )
    assert busy.allocations[0] == (0, 2) and (600, 8) in busy.allocations
    assert busy.ok == (busy.real_end <= 1100)
    late = plan(curve, ddl=100, left=work, profile=([0], [16]), now=0, slot=60, capacity=16)
    assert not late.ok and late.real_end > 100


def test_artifact_overhead_charges_new_rank_sets_and_restarts() -> None:
    from qosflow.sim.policies.elasticflow import ElasticFlowOverhead
    from qosflow.sim.policy import Placed

    model = ElasticFlowOverhead(slot=3, node_size=8)
    placed = (Placed("a", 8, 0, (0,), 0), Placed("b", 1, 0, (1,), 8))
    assert model.charge(placed, decision=0, capacity=16) == {"a": 2 + 8, "b": 2 + 2}
    assert model.charge(placed, decision=1, capacity=16) == {"a": 2, "b": 2}  # seen before
    assert model.charge(placed, decision=3, capacity=16) == {"a": 2, "b": 2}  # cached on restart
    assert model.charge(placed, decision=4, capacity=16) == {"a": 10, "b": 4}  # cache was cleared
    big = ElasticFlowOverhead(slot=3, node_size=8)
    assert big.charge(placed, decision=3, capacity=256) == {"a": 7 + 47 + 8, "b": 7 + 47 + 2}


def test_artifact_overhead_on_two_switches_follows_its_free_node_order() -> None:
    from qosflow.sim.policies.elasticflow import ElasticFlowOverhead
    from qosflow.sim.policy import Placed

    # 2 switches x 2 nodes x 8: node ids restart per switch, and the artifact sorts its free list
    # by that id, so a released node goes behind the other switch's node of the same id
    placed = (Placed("a", 8, 0, (0,), 0),)
    one, two = ElasticFlowOverhead(slot=100), ElasticFlowOverhead(slot=100, switches=2)
    assert [one.charge(placed, decision=d, capacity=32) for d in range(3)] == [
        {"a": 10},
        {"a": 2},
        {"a": 2},
    ]
    # decision 1: free list s1n0, s0n0, ... -> rank 16, a new rank set; decision 2: back on s0n0
    assert [two.charge(placed, decision=d, capacity=32) for d in range(3)] == [
        {"a": 10},
        {"a": 10},
        {"a": 2},
    ]


def test_learned_mode_shows_policies_fitted_speeds_not_the_truth(tmp_path: Path) -> None:
    from qosflow.sim.policy import SlotDecision, SlotSnapshot

    seen: list[dict[int, float]] = []

    class Spy(EdfElastic):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            seen.extend(dict(j.speeds) for j in snap.jobs)
            return super().decide(snap)

    size = int(900 * T8)
    path = _trace(tmp_path, [f"a,0,{size},resnet50,9000,256,8,900"])
    learned = _run(path, Spy(), speeds="learned", noise=Noise(sigma=0.05), seed=3)
    truth = dict(A100.curve("resnet50", 256))
    assert learned.met == 1 and seen and all(s != truth for s in seen)
    assert all(s[8] == pytest.approx(truth[8], rel=0.25) for s in seen)  # anchored on num_gpu
    oracle: list[dict[int, float]] = []
    seen.clear()
    _run(path, Spy())
    oracle = seen
    assert all(s == truth for s in oracle)


def test_artifact_completion_mode_reproduces_elasticflow_on_elasticvpollux() -> None:
    """ElasticFlow's own simulator printed 142/195 with 50 refusals (REFERENCE.md, ALGORITHM.md)."""
    t4 = load_throughputs("T4")
    trace = "pkusys-ElasticFlow/ElasticFlow/traces_for_ElasticFlow/elasticVpollux_e.csv"
    jobs = load_trace(elasticflow_dir() / trace, t4)
    cfg = SimConfig(capacity=64, node_size=4, slot=60, completion="artifact")
    result = simulate(jobs, t4, ElasticFlow(t4, slot=60), cfg)
    assert sum(o.rejected for o in result.outcomes) == 50
    assert round(result.planned_ratio * 195) == 142


def _samples_fitted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float, int]]:
    """The samples a learned belief fits, as of its latest fit (filled in while a run goes)."""
    from qosflow.sim.truth import LearnedBelief

    seen: list[tuple[float, float, int]] = []
    fitted = LearnedBelief.speeds

    def spy(self: LearnedBelief, job: object, samples: list[tuple[float, float, int]]) -> object:
        seen[:] = samples
        return fitted(self, job, samples)  # type: ignore[arg-type]

    monkeypatch.setattr(LearnedBelief, "speeds", spy)
    return seen


def _one_learned_job(tmp_path: Path, policy: object, seconds: int, **kw: object) -> SimResult:
    """One resnet50 job of ``seconds`` at 8 GPUs under ``policy``, with learned speeds."""
    size = int(seconds * T8)
    row = f"a,0,{size},resnet50,99999,256,8,{seconds}"
    return _run(_trace(tmp_path, [row]), policy, speeds="learned", **kw)


def test_a_paused_job_is_not_recorded_as_a_slow_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped for two slots in every five and resumed at the same size: the progress samples the
    learned belief fits must show the pauses, not intervals at 8 GPUs three times too slow."""
    from qosflow.sim.policy import SlotDecision, SlotSnapshot

    class PauseAndResume(EdfElastic):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            paused = snap.now // snap.slot % 5 >= 3
            units = {} if paused else {j.job_id: 8 for j in snap.jobs}
            return SlotDecision(allocation=units, wake_at=snap.now + snap.slot)  # every slot

    seen = _samples_fitted(monkeypatch)
    _one_learned_job(tmp_path, PauseAndResume(), 3600)
    rates = [
        (d1 - d0) / (t1 - t0)
        for (_, _, u_prev), (t0, d0, u), (t1, d1, u1) in zip(seen, seen[1:], seen[2:], strict=False)
        if u == u1 == u_prev == 8  # a steady interval at 8 (not the first after a (re)start)
    ]
    assert len(rates) >= 10 and any(u == 0 for _, _, u in seen)
    assert all(r == pytest.approx(T8, rel=1e-6) for r in rates)


def test_an_overhead_stall_is_not_recorded_as_a_slower_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Charged 20 s of every 60 s slot at an unchanged size (ElasticFlow's model stalls every
    running job at every decision): the samples the learned belief fits show the speed at 8 GPUs,
    not two thirds of it, and the stalls still cost their time."""
    from qosflow.sim.policy import Placed, SlotDecision, SlotSnapshot

    class EverySlot(EdfElastic):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            units = {j.job_id: 8 for j in snap.jobs}
            return SlotDecision(allocation=units, wake_at=snap.now + snap.slot)

    class Stall:
        def charge(
            self, placed: tuple[Placed, ...], *, decision: int, capacity: int
        ) -> dict[str, int]:
            return {p.job_id: 20 for p in placed}

    seen = _samples_fitted(monkeypatch)
    result = _one_learned_job(tmp_path, EverySlot(), 1800, overhead=Stall())
    rates = [(d1 - d0) / (t1 - t0) for (t0, d0, _), (t1, d1, _) in itertools.pairwise(seen)]
    assert len(rates) >= 20
    assert all(r == pytest.approx(T8, rel=1e-6) for r in rates)
    finish = result.outcomes[0].finish
    assert finish is not None and finish >= 1800 * 1.5  # 20 s of every 60 s lost


def test_a_decision_sees_the_progress_made_up_to_its_own_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a watch polling at the decision would: every decision's belief rests on the progress up
    to that decision, and a resize keeps the last interval run at the old size."""
    from qosflow.sim.policy import SlotDecision, SlotSnapshot

    fitted: dict[int, list[tuple[float, float, int]]] = {}

    class EightThenFour(EdfElastic):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            fitted[snap.now] = list(seen)  # what this decision's belief was fitted on
            units = 8 if snap.now < 180 else 4
            return SlotDecision({j.job_id: units for j in snap.jobs}, wake_at=snap.now + snap.slot)

    seen = _samples_fitted(monkeypatch)
    _one_learned_job(tmp_path, EightThenFour(), 600)
    assert len(fitted) >= 6
    for now, samples in fitted.items():
        if now > 0:
            assert samples[-1][0] == now  # fitted on the progress up to now, not the slot before
            assert samples[-1][1] > samples[-2][1]
    at_eight = [(t, d) for t, d, u in fitted[240] if u == 8]
    assert at_eight[-1][0] == 180  # the interval run at 8 up to the resize is kept at 8
    assert (at_eight[-1][1] - at_eight[-2][1]) / 60 == pytest.approx(T8, rel=1e-6)


def test_a_completed_job_leaves_its_progress_to_the_next_job_of_its_key(tmp_path: Path) -> None:
    """As the finish step records history: b, submitted after a completed, is believed what a
    measured at 8 GPUs (its completion included) before it has measured anything itself."""
    from dataclasses import replace

    from qosflow.sim.policy import SlotDecision, SlotSnapshot
    from qosflow.sim.truth import FittedSpeeds

    first: dict[str, FittedSpeeds] = {}

    class Spy(EdfElastic):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            for j in snap.jobs:
                if isinstance(j.speeds, FittedSpeeds):
                    first.setdefault(j.job_id, j.speeds)
            decision = super().decide(snap)
            return replace(decision, wake_at=snap.now + snap.slot)  # sample every slot

    size = int(900 * T8)
    rows = [f"a,0,{size},resnet50,9000,256,8,900", f"b,3000,{size},resnet50,12000,256,8,900"]
    result = _run(_trace(tmp_path, rows), Spy(), speeds="learned")
    assert result.met == 2
    assert not first["a"].fit.measured  # a came first: only its request was known
    measured = first["b"].fit.measured  # b's first view: a's history, completion included
    assert [m.units for m in measured] == [8]
    assert measured[0].step_time == pytest.approx(1 / T8, rel=1e-3)
    assert first["b"].fit.n_samples >= 900 // 60
