from __future__ import annotations

import threading

import numpy as np

from qosflow_trainer.model import ModelShape, Task, init_params, sgd_step, train_step
from qosflow_trainer.workers import WorkerPool


def test_pool_keeps_order_and_resizes() -> None:
    pool = WorkerPool(1)
    main = threading.get_ident()
    assert pool.map(lambda i: (i * i, threading.get_ident() == main), range(5)) == [
        (i * i, True) for i in range(5)
    ]
    pool.resize(3)
    assert pool.threads == 3
    results = pool.map(lambda i: (i, threading.get_ident()), range(40))
    assert [r[0] for r in results] == list(range(40))
    assert main not in {r[1] for r in results}
    pool.resize(0)  # never below one
    assert pool.threads == 1
    pool.close()


def test_step_is_bit_identical_for_any_thread_count() -> None:
    shape = ModelShape(input_dim=16, width=48, depth=2)
    task = Task(shape, 2)
    runs = []
    for threads in (1, 2, 3):
        params = init_params(shape, 2)
        pool = WorkerPool(threads)
        losses = [sgd_step(params, *task.batch(k, 50), lr=0.01, mapper=pool) for k in range(6)]
        pool.close()
        runs.append((losses, params))
    for losses, params in runs[1:]:
        assert losses == runs[0][0]
        for name, value in params.items():
            assert np.array_equal(value, runs[0][1][name]), name


def test_shard_count_only_reorders_sums() -> None:
    shape = ModelShape(input_dim=16, width=48, depth=2)
    task = Task(shape, 2)
    a, b = init_params(shape, 2), init_params(shape, 2)
    x, y = task.batch(0, 64)
    la = sgd_step(a, x, y, lr=0.01, shards=1)
    lb = sgd_step(b, x, y, lr=0.01, shards=8)
    assert abs(la - lb) <= 1e-12 * abs(la)
    np.testing.assert_allclose(a["w0"], b["w0"], rtol=1e-10, atol=1e-14)


def test_train_step_draws_shards_in_parallel_and_matches_sgd_step() -> None:
    shape = ModelShape(input_dim=16, width=48, depth=2)
    task = Task(shape, 4)
    a, b = init_params(shape, 4), init_params(shape, 4)
    pool = WorkerPool(2)
    for k in range(3):
        la = train_step(a, task, k, 60, lr=0.01, shards=8, mapper=pool)
        lb = sgd_step(b, *task.batch(k, 60, shards=8), lr=0.01, shards=8)
        assert la == lb
    pool.close()
    assert all(np.array_equal(a[n], b[n]) for n in a)
