"""The simulator collects cyclic garbage less often while it runs, and only then."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from qosflow.sim.engine import SimConfig, simulate
from qosflow.sim.garbage import YOUNG_COLLECTION_AT, few_collections
from qosflow.sim.policies.k8s_default import K8sDefault
from qosflow.sim.policy import SlotDecision, SlotSnapshot
from qosflow.sim.trace import load_throughputs, load_trace


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_a_run_collects_less_often_and_restores_the_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    with few_collections():
        assert gc.get_threshold() == (YOUNG_COLLECTION_AT, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_thresholds_come_back_when_the_run_fails() -> None:
    gc.set_threshold(500, 5, 5)
    with pytest.raises(RuntimeError), few_collections():
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == (500, 5, 5)


@pytest.mark.usefixtures("thresholds")
def test_a_collector_switched_off_or_set_rarer_is_left_as_it_is() -> None:
    for setting in ((0, 10, 10), (10 * YOUNG_COLLECTION_AT, 10, 10)):
        gc.set_threshold(*setting)
        with few_collections():
            assert gc.get_threshold() == setting


@pytest.mark.usefixtures("thresholds")
def test_policies_decide_under_the_run_s_thresholds(tmp_path: Path) -> None:
    seen: list[int] = []

    class Watching(K8sDefault):
        def decide(self, snap: SlotSnapshot) -> SlotDecision:
            seen.append(gc.get_threshold()[0])
            return super().decide(snap)

    path = tmp_path / "trace.csv"
    path.write_text(
        "job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration\n"
        "a,0,1000,resnet50,99999,256,8,600\n",
        encoding="utf-8",
    )
    table = load_throughputs("A100")
    gc.set_threshold(700, 10, 10)
    simulate(load_trace(path, table), table, Watching(), SimConfig(capacity=8, node_size=8))
    assert seen and set(seen) == {YOUNG_COLLECTION_AT}
    assert gc.get_threshold() == (700, 10, 10)
