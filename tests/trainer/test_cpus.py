from __future__ import annotations

import os
from pathlib import Path

import pytest
from threadpoolctl import ThreadpoolController

from qosflow_trainer import allowed_cpus
from qosflow_trainer.cpus import CpuFollower, cgroup_cpu_limit, own_cpu_max_files


def _file(tmp_path: Path, text: str, name: str = "cpu.max") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("200000 100000\n", 2.0),
        ("150000 100000\n", 1.5),
        ("50000 100000\n", 0.5),
        ("max 100000\n", None),
        ("garbage\n", None),
        ("0 100000\n", None),
        ("", None),
    ],
)
def test_cgroup_cpu_limit_parses_cpu_max(tmp_path: Path, text: str, cpus: float | None) -> None:
    assert cgroup_cpu_limit(_file(tmp_path, text)) == cpus


def test_missing_cpu_max_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "nope") is None


def test_allowed_cpus_is_min_of_affinity_and_quota_rounded_down(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert allowed_cpus(cpu_max=tmp_path / "missing") == affinity
    assert allowed_cpus(cpu_max=_file(tmp_path, "max 100000")) == affinity
    assert allowed_cpus(cpu_max=_file(tmp_path, "50000 100000")) == 1  # at least one
    assert allowed_cpus(cpu_max=_file(tmp_path, "150000 100000")) == 1
    assert allowed_cpus(cpu_max=_file(tmp_path, "6400000 100000")) == affinity
    # the tightest file of a chain wins
    chain = [_file(tmp_path, "max 100000", "a"), _file(tmp_path, "100000 100000", "b")]
    assert allowed_cpus(cpu_max=chain) == 1


def test_allowed_cpus_follows_affinity_of_the_calling_thread(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs 2 CPUs")
    try:
        os.sched_setaffinity(0, {min(before)})
        assert allowed_cpus(cpu_max=tmp_path / "missing") == 1
    finally:
        os.sched_setaffinity(0, before)
    assert allowed_cpus(cpu_max=tmp_path / "missing") == len(before)


def test_own_cpu_max_files_walks_from_own_cgroup_to_root(tmp_path: Path) -> None:
    proc = _file(tmp_path, "0::/kubepods/pod1/ctr\n", "cgroup")
    root = tmp_path / "fs"
    assert own_cpu_max_files(proc, root) == (
        root / "kubepods/pod1/ctr/cpu.max",
        root / "kubepods/pod1/cpu.max",
        root / "kubepods/cpu.max",
        root / "cpu.max",
    )
    v1 = _file(tmp_path, "4:cpu,cpuacct:/x\n", "cgroup1")
    assert own_cpu_max_files(v1, root) == ()
    assert own_cpu_max_files(tmp_path / "none", root) == ()


def test_follower_resizes_blas_pool_only_on_change() -> None:
    import numpy  # noqa: F401  (loads OpenBLAS so the controller sees a pool)

    budget = [1]
    controller = ThreadpoolController()
    follower = CpuFollower(reader=lambda: budget[0], controller=controller)
    assert follower.check() == 1
    assert set(follower.pool_sizes().values()) == {1}
    assert follower.check() is None
    budget[0] = 2
    assert follower.check() == 2
    assert set(follower.pool_sizes().values()) == {2}
