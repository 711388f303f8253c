"""The reference model: an MLP regressor trained with momentum SGD on seeded synthetic data.

The data come from a fixed random *teacher* ``y = tanh(x A / sqrt(d)) B`` with Gaussian inputs;
the *student* is a ReLU MLP (``depth`` hidden layers of ``width`` units) fitted by mean squared
error. Everything is float64 numpy, so each step is a handful of large matrix products whose cost
is CPU-bound and split across BLAS threads.

Determinism: the teacher, the initial weights, the evaluation set and training batch ``k`` are each
drawn from their own ``numpy.random.default_rng([seed, stream, ...])``. Batch ``k`` therefore
depends only on ``(seed, k)``, never on how many steps ran before in this process, so a run
stopped at step ``s`` and resumed from its checkpoint sees exactly the batches an uninterrupted run
sees.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Params = dict[str, Array]

_TEACHER, _INIT, _EVAL, _BATCH = 0, 1, 2, 3


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

    def flops_per_example(self) -> int:
        """Approximate floating-point operations of one training step per example."""
        macs = self.input_dim * self.width + (self.depth - 1) * self.width**2
        macs += self.width * self.output_dim
        backward = 2 * macs - self.input_dim * self.width
        return 2 * (macs + backward)


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

    def batch(self, index: int, size: int) -> tuple[Array, Array]:
        """Training batch ``index`` (0-based): a function of ``(seed, index)`` only."""
        return self._draw(np.random.default_rng([self.seed, _BATCH, index]), size)


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


def sgd_step(params: Params, x: Array, y: Array, *, lr: float, momentum: float = 0.9) -> float:
    """One momentum-SGD step on the batch, in place.

    Returns:
        The batch loss before the update.
    """
    out, acts = forward(params, x)
    diff = out - y
    batch_loss = float(np.mean(diff**2))
    grad = diff * (2.0 / diff.size)
    grads: dict[str, Any] = {}
    for i in range(_layers(params) - 1, -1, -1):
        grads[f"w{i}"] = acts[i].T @ grad
        grads[f"b{i}"] = grad.sum(axis=0)
        if i > 0:
            grad = grad @ params[f"w{i}"].T
            grad *= acts[i] > 0.0
    for name, g in grads.items():
        _momentum_update(params[name], params[f"v_{name}"], g, lr=lr, momentum=momentum)
    return batch_loss


def _momentum_update(p: Array, v: Array, g: Array, *, lr: float, momentum: float) -> None:
    """``v = momentum * v + g; p -= lr * v`` in place; ``g`` is reused as scratch space.

    Plain numpy on purpose: calling scipy's BLAS here would wake a second OpenBLAS thread pool
    whose spinning workers fight numpy's pool for the same CPUs (measured: 2 threads got slower
    than 1).
    """
    v *= momentum
    v += g
    np.multiply(v, lr, out=g)
    p -= g
