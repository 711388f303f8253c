"""Sizes become pods: one pod up to a node, equal pods above it; placement takes whole pods."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qosflow.core.cluster import Capacity
from qosflow.core.errors import SpecError
from qosflow.core.layout import Layout, job_problem, layout, placeable
from qosflow.core.placement import job_capacity
from qosflow.core.placement import placeable as placeable_level
from qosflow.core.spec import Resources, load_job

NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)


def test_a_gpu_job_above_one_node_is_equal_pods_of_at_most_a_node() -> None:
    assert layout("gpu", 4, per_node=8) == Layout(1, 4, "gpu", 4)
    assert layout("gpu", 16, per_node=8) == Layout(2, 8, "gpu", 8)
    assert layout("gpu", 12, per_node=8) == Layout(2, 6, "gpu", 6)
    assert layout("worker", 3, per_node=1, worker_unit="gpu", per_worker=2) == Layout(
        3, 1, "gpu", 2
    )
    assert job_problem("gpu", (8, 9), per_node=8, launcher="torchrun") == (
        "resources.levels",
        "9 gpu units need 2 pods of at most 8 (a node), and 9 does not split into 2 equal pods: "
        "use a multiple of 2",
    )
    field, rule = job_problem("cpu", (1, 2, 16), per_node=8, launcher="none") or ("", "")
    assert field == "launcher" and "launcher: torchrun" in rule
    assert job_problem("gpu", (1, 2, 4, 8, 16), per_node=8, launcher="torchrun") is None


def test_sixteen_gpus_need_two_nodes_with_eight_free_not_sixteen_anywhere() -> None:
    res = Resources("gpu", (1, 2, 4, 8, 16), 8, "8Gi")
    two_nodes = Capacity("gpu", 24, 16, {"a": 8, "b": 8, "c": 0})
    spread = Capacity("gpu", 24, 16, {"a": 8, "b": 4, "c": 4})
    assert placeable_level(res, two_nodes) == 16
    assert placeable_level(res, spread) == 8


def test_workers_count_in_pods_of_their_size() -> None:
    res = Resources("worker", (1, 2, 3), 1, "1Gi", "cpu", 2)
    cap = Capacity("cpu", 6, 5, {"a": 3, "b": 2})
    assert job_capacity(res, cap).free == 2 and job_capacity(res, cap).free_per_node == {
        "a": 1,
        "b": 1,
    }
    assert placeable_level(res, cap) == 2


@given(
    per_pod=st.integers(1, 8),
    pods=st.integers(1, 6),
    free=st.lists(st.integers(0, 16), min_size=1, max_size=6),
)
def test_placement_is_exactly_whether_whole_pods_fit(
    per_pod: int, pods: int, free: list[int]
) -> None:
    lay = Layout(pods, per_pod, "gpu", per_pod)
    nodes = {f"n{i}": f for i, f in enumerate(free)}
    assert placeable(lay, nodes) == (sum(f // per_pod for f in free) >= pods)


def test_a_worker_job_is_torchrun_and_its_own_node_for_the_speed_model() -> None:
    data = {
        "name": "ddp",
        "total_steps": 100,
        "deadline": "PT1H",
        "resources": {"unit": "worker", "min": 1, "max": 2, "per_worker": {"cpu": 1}},
        "command": ["python", "-m", "qosflow_trainer", "--ddp"],
    }
    spec = load_job(data, now=NOW)
    assert spec.launcher == "torchrun" and spec.resources.per_node == 1
    assert spec.resources.layout(2) == Layout(2, 1, "cpu", 1)
    with pytest.raises(SpecError, match=r"^resources.per_node: a worker is a pod"):
        load_job({**data, "resources": {**data["resources"], "per_node": 4}}, now=NOW)
    with pytest.raises(SpecError, match=r"^command: torchrun runs a Python program"):
        load_job({**data, "command": ["./train"]}, now=NOW)
    with pytest.raises(SpecError, match=r"^launcher: workers are the pods of one torchrun job"):
        load_job({**data, "launcher": "none"}, now=NOW)
