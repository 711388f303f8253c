"""The trainer's own worker threads: one per allowed CPU, resized when the budget changes.

Why not simply give OpenBLAS more threads? Measured on a 2-core machine shared with other busy
processes (load average ~9): with OpenBLAS splitting each matrix product over 2 threads, a step
took 1.7x as long as with 1 thread (speedup 0.59) — OpenBLAS waits for its slowest worker by
spinning, and a descheduled worker stalls the whole product. With the batch cut into fixed
shards, each computed with single-threaded BLAS by a plain thread pool (idle threads sleep instead
of spinning), 2 threads stayed at 0.94-1.11x of 1 thread under the same load, used about the same
CPU time per step as 1 thread (no coordination waste), and the result no longer depends on the
thread count at all (see :func:`qosflow_trainer.model.train_step`). numpy releases the GIL inside matrix products and
element-wise loops, so the threads really run in parallel.

Threads are created by the thread that calls :meth:`WorkerPool.resize` (the main thread), so they
inherit its current CPU affinity — after an in-place resize they can run on the new CPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


class WorkerPool:
    """A resizable pool of threads that maps a function over items, results in order.

    With one thread the work runs inline in the caller (no hand-off cost).
    """

    def __init__(self, threads: int = 1) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._threads = 0
        self.resize(threads)

    @property
    def threads(self) -> int:
        """Current number of threads."""
        return self._threads

    def resize(self, threads: int) -> None:
        """Use ``threads`` threads from now on (old threads finish and exit)."""
        threads = max(1, threads)
        if threads == self._threads:
            return
        old, self._executor = self._executor, None
        if threads > 1:
            self._executor = ThreadPoolExecutor(threads, thread_name_prefix="qosflow-worker")
        self._threads = threads
        if old is not None:
            old.shutdown(wait=True)

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(item) for item in items]``, spread over the pool's threads."""
        if self._executor is None:
            return [fn(item) for item in items]
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        """Stop the threads."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
