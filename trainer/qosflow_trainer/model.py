"""The reference model: an MLP regressor trained with momentum SGD on seeded synthetic data.

The data come from a fixed random *teacher* ``y = tanh(x A / sqrt(d)) B`` with Gaussian inputs;
the *student* is a ReLU MLP (``depth`` hidden layers of ``width`` units) fitted by mean squared
error. Everything is float64 numpy, so each step is a handful of large matrix products whose cost
is CPU-bound; :func:`train_step` splits it over fixed batch shards that any number of threads
can share.

Determinism: the teacher, the initial weights, the evaluation set and each shard of training batch
``k`` are drawn from their own ``numpy.random.default_rng([seed, stream, ...])``. Batch ``k``
therefore depends only on ``(seed, k, shards)``, never on how many steps ran before in this
process, so a run stopped at step ``s`` and resumed from its checkpoint sees exactly the batches an
uninterrupted run sees.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Params = dict[str, Array]

_TEACHER, _INIT, _EVAL, _BATCH = 0, 1, 2, 3
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Sizes of the problem; together with the batch size they set the cost of a step.

    Attributes:
        input_dim: Features per example.
        width: Units per hidden layer.
        depth: Number of hidden layers (>= 1).
        output_dim: Regression targets per example.
        teacher_width: Hidden units of the teacher that generates the targets.
    """

    input_dim: int = 256
    width: int = 512
    depth: int = 3
    output_dim: int = 16
    teacher_width: int = 32


class Task:
    """The seeded synthetic regression task."""

    def __init__(self, shape: ModelShape, seed: int, *, eval_size: int = 512) -> None:
        self.shape = shape
        self.seed = seed
        rng = np.random.default_rng([seed, _TEACHER])
        self._a = rng.standard_normal((shape.input_dim, shape.teacher_width))
        self._a /= np.sqrt(shape.input_dim)
        self._b = rng.standard_normal((shape.teacher_width, shape.output_dim))
        self._b /= np.sqrt(shape.teacher_width)
        self.eval_x, self.eval_y = self._draw(np.random.default_rng([seed, _EVAL]), eval_size)

    def _draw(self, rng: np.random.Generator, n: int) -> tuple[Array, Array]:
        x = rng.standard_normal((n, self.shape.input_dim))
        y = np.tanh(x @ self._a) @ self._b
        y += 0.01 * rng.standard_normal(y.shape)
        return x, y

    def shard(self, index: int, size: int, shards: int, part: int) -> tuple[Array, Array]:
        """Rows of shard ``part`` of training batch ``index``; see :meth:`batch`."""
        rows = shard_bounds(size, shards)
        rng = np.random.default_rng([self.seed, _BATCH, index, part])
        return self._draw(rng, rows[part + 1] - rows[part])

    def batch(self, index: int, size: int, shards: int = 8) -> tuple[Array, Array]:
        """Training batch ``index`` (0-based): a function of ``(seed, index, shards)`` only.

        Each of the ``shards`` row blocks is drawn from its own generator, so the shards can be
        generated in parallel by the threads that train on them.
        """
        parts = [self.shard(index, size, shards, p) for p in range(_count(size, shards))]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def _count(size: int, shards: int) -> int:
    return max(1, min(shards, size))


def shard_bounds(size: int, shards: int) -> list[int]:
    """Row boundaries of the fixed shards of a batch of ``size`` rows."""
    return [int(b) for b in np.linspace(0, size, _count(size, shards) + 1).astype(int)]


def init_params(shape: ModelShape, seed: int) -> Params:
    """He-initialised weights, zero biases, and zero momentum buffers (``v_*``)."""
    rng = np.random.default_rng([seed, _INIT])
    dims = [shape.input_dim] + [shape.width] * shape.depth + [shape.output_dim]
    params: Params = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(dims)):
        scale = np.sqrt(2.0 / fan_in) if i < shape.depth else np.sqrt(1.0 / fan_in)
        params[f"w{i}"] = rng.standard_normal((fan_in, fan_out)) * scale
        params[f"b{i}"] = np.zeros(fan_out)
    for name in list(params):
        params[f"v_{name}"] = np.zeros_like(params[name])
    return params


def _layers(params: Params) -> int:
    return sum(1 for k in params if k.startswith("w"))


def forward(params: Params, x: Array) -> tuple[Array, list[Array]]:
    """Network output and the activations needed for backprop (input first)."""
    acts = [x]
    h = x
    last = _layers(params) - 1
    for i in range(last):
        h = h @ params[f"w{i}"]
        h += params[f"b{i}"]
        np.maximum(h, 0.0, out=h)
        acts.append(h)
    out = h @ params[f"w{last}"] + params[f"b{last}"]
    return out, acts


def loss(params: Params, x: Array, y: Array) -> float:
    """Mean squared error of the network on ``(x, y)``."""
    out, _ = forward(params, x)
    return float(np.mean((out - y) ** 2))


class Mapper(Protocol):
    """Runs a function over items and returns the results in order (a thread pool, or inline)."""

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(item) for item in items]``, possibly in parallel."""
        ...


class Inline:
    """A :class:`Mapper` that runs everything in the calling thread."""

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``[fn(item) for item in items]``."""
        return [fn(item) for item in items]


def _shard_grads(params: Params, x: Array, y: Array, scale: float) -> tuple[float, Params]:
    """Squared-error sum and gradients (times ``scale``) of one shard of the batch."""
    out, acts = forward(params, x)
    diff = out - y
    sq = float(np.dot(diff.ravel(), diff.ravel()))
    grad = diff * scale
    grads: Params = {}
    for i in range(_layers(params) - 1, -1, -1):
        grads[f"w{i}"] = acts[i].T @ grad
        grads[f"b{i}"] = grad.sum(axis=0)
        if i > 0:
            grad = grad @ params[f"w{i}"].T
            grad *= acts[i] > 0.0
    return sq, grads


def _chunks(params: Params, elements: int = 65_536) -> list[tuple[str, slice]]:
    """Row slices of every trainable tensor, about ``elements`` values each."""
    out: list[tuple[str, slice]] = []
    for name, value in params.items():
        if name.startswith("v_"):
            continue
        cols = int(np.prod(value.shape[1:])) if value.ndim > 1 else 1
        rows = max(1, elements // cols)
        out += [(name, slice(r, r + rows)) for r in range(0, value.shape[0], rows)]
    return out


def sgd_step(
    params: Params,
    x: Array,
    y: Array,
    *,
    lr: float,
    momentum: float = 0.9,
    shards: int = 8,
    mapper: Mapper | None = None,
) -> float:
    """One momentum-SGD step on the batch ``(x, y)``, in place; see :func:`train_step`.

    Returns:
        The batch loss (mean squared error) before the update.
    """
    rows = shard_bounds(len(x), shards)
    parts = [slice(a, b) for a, b in itertools.pairwise(rows)]
    scale = 2.0 / y.size
    run = mapper or Inline()
    results = run.map(lambda s: _shard_grads(params, x[s], y[s], scale), parts)
    return _update(params, results, y.size, lr=lr, momentum=momentum, run=run)


def train_step(
    params: Params,
    task: Task,
    index: int,
    size: int,
    *,
    lr: float,
    momentum: float = 0.9,
    shards: int = 8,
    mapper: Mapper | None = None,
) -> float:
    """One momentum-SGD step on training batch ``index`` of ``task``, in place.

    The batch is cut into ``shards`` fixed row blocks; each task draws its block (see
    :meth:`Task.batch`) and computes its gradients with single-threaded BLAS, ``mapper`` runs the
    tasks (e.g. on a thread pool of any size), the gradients are summed in shard order, and the
    optimizer update runs in parallel over row slices of each tensor. Every floating-point
    operation and its order depend on ``shards`` only, never on the number of threads, so runs
    with different CPU counts give bit-identical results (same as
    ``sgd_step(params, *task.batch(index, size, shards), shards=shards)``).

    Returns:
        The batch loss (mean squared error) before the update.
    """
    run = mapper or Inline()
    scale = 2.0 / (size * task.shape.output_dim)

    def grads(part: int) -> tuple[float, Params]:
        x, y = task.shard(index, size, shards, part)
        return _shard_grads(params, x, y, scale)

    results = run.map(grads, range(_count(size, shards)))
    return _update(params, results, size * task.shape.output_dim, lr=lr, momentum=momentum, run=run)


def _update(
    params: Params,
    results: list[tuple[float, Params]],
    values: int,
    *,
    lr: float,
    momentum: float,
    run: Mapper,
) -> float:
    """Sum shard gradients in shard order and apply the momentum update, chunk by chunk."""

    def update(chunk: tuple[str, slice]) -> None:
        name, rows = chunk
        total = results[0][1][name][rows].copy()
        for _, grads in results[1:]:
            total += grads[name][rows]
        v = params[f"v_{name}"][rows]
        _momentum_update(params[name][rows], v, total, lr=lr, momentum=momentum)

    run.map(update, _chunks(params))
    return sum(sq for sq, _ in results) / values


def _momentum_update(p: Array, v: Array, g: Array, *, lr: float, momentum: float) -> None:
    """``v = momentum * v + g; p -= lr * v`` in place; ``g`` is reused as scratch space."""
    v *= momentum
    v += g
    np.multiply(v, lr, out=g)
    p -= g
