"""The reference model in PyTorch, and which rows of each global batch a rank trains on.

The data-parallel mode (:mod:`qosflow_trainer.ddp`) trains **the same optimisation** as the numpy
trainer (:mod:`qosflow_trainer.model`): the same teacher, initial weights, batches, mean squared
error and momentum SGD, in float64. Only the arithmetic is spread differently:

* **The global batch is fixed.** Training batch ``k`` is the numpy trainer's: ``shards`` fixed row
  blocks, block ``p`` drawn from its own seeded generator (:meth:`Task.shard`). Rank ``r`` of a
  world of ``W`` trains on the blocks ``p`` with ``p % W == r`` (:func:`rank_parts`), so the
  batch a step sees is the same at every world size and a rank's rows are a pure function of the
  seed, the step and the rank's share — never of timing or of what ran before in the process.
  With more ranks than blocks, the extra ranks get no rows (their loss and gradients are zero).
* **The gradient is the global mean.** Rank ``r`` back-propagates ``W * SSE_r / (B * out)``
  (:func:`scaled_loss`); DDP averages the gradients over the ``W`` ranks, which gives exactly the
  gradient of ``SSE / (B * out)`` over the whole batch whatever the split.

Hence a checkpoint written at one world size resumes at any other, and the results of different
world sizes differ only by the order of float64 additions (the all-reduce, and each rank's partial
sums): about ``1e-15`` relative per step. The weights are stored the numpy way (``w<i>`` of shape
``(fan_in, fan_out)``, momentum buffers ``v_<name>``), so the checkpoint files of both trainers
are interchangeable.

``torch`` is imported lazily (inside the functions): importing this module needs numpy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from qosflow_trainer.model import ModelShape, Params, Task

if TYPE_CHECKING:
    import torch


def rank_parts(parts: int, world_size: int, rank: int) -> list[int]:
    """The row blocks of each global batch that ``rank`` of ``world_size`` trains on.

    Args:
        parts: Row blocks per batch (``min(shards, batch_size)``).
        world_size: Number of ranks.
        rank: This rank, ``0 <= rank < world_size``.

    Returns:
        Block indices, ascending; empty when the world has more ranks than blocks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) (got {rank})")
    return list(range(rank, parts, world_size))


def batch_parts(size: int, shards: int) -> int:
    """Row blocks per batch of ``size`` rows cut into ``shards`` (as the numpy trainer does)."""
    return max(1, min(shards, size))


def build_model(
    shape: ModelShape, params: Params, *, device: torch.device | None = None
) -> torch.nn.Sequential:
    """The student MLP as ``Linear``/``ReLU`` layers, float64, with the weights of ``params``."""
    import torch

    layers: list[torch.nn.Module] = []
    for i in range(shape.depth + 1):
        fan_in, fan_out = params[f"w{i}"].shape
        layers.append(torch.nn.Linear(fan_in, fan_out, dtype=torch.float64, device=device))
        if i < shape.depth:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    load_weights(model, params)
    return model


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``Linear`` layers of ``model`` in order (``model`` may be wrapped in DDP)."""
    import torch

    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def load_weights(model: torch.nn.Module, params: Params) -> None:
    """Copy the numpy weights ``w<i>``/``b<i>`` into the model (``Linear`` stores ``w.T``)."""
    import torch

    with torch.no_grad():
        for i, layer in enumerate(linears(model)):
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(params[f"w{i}"].T)))
            layer.bias.copy_(torch.from_numpy(params[f"b{i}"]))


def load_momentum(model: torch.nn.Module, optimizer: torch.optim.SGD, params: Params) -> None:
    """Set the optimiser's momentum buffers from the numpy ``v_w<i>``/``v_b<i>`` arrays.

    ``torch.optim.SGD`` keeps ``v = momentum * v + g; p -= lr * v`` like the numpy trainer; a
    fresh optimiser has no buffer and starts with ``v = g``, which is the same as ``v = 0``.
    """
    import torch

    for i, layer in enumerate(linears(model)):
        for tensor, value in ((layer.weight, params[f"v_w{i}"].T), (layer.bias, params[f"v_b{i}"])):
            buffer = torch.from_numpy(np.ascontiguousarray(value)).to(tensor.device)
            optimizer.state[tensor] = {"momentum_buffer": buffer.clone()}


def to_arrays(model: torch.nn.Module, optimizer: torch.optim.SGD) -> Params:
    """Weights and momentum buffers as the numpy trainer's arrays (what a checkpoint holds)."""
    arrays: Params = {}
    for i, layer in enumerate(linears(model)):
        for name, tensor, transpose in (
            (f"w{i}", layer.weight, True),
            (f"b{i}", layer.bias, False),
        ):
            value = _numpy(tensor)
            buffer: Any = optimizer.state.get(tensor, {}).get("momentum_buffer")
            momentum = np.zeros_like(value) if buffer is None else _numpy(buffer)
            arrays[name] = value.T.copy() if transpose else value
            arrays[f"v_{name}"] = momentum.T.copy() if transpose else momentum
    return arrays


def _numpy(tensor: torch.Tensor) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.array(tensor.detach().cpu().numpy(), dtype=np.float64)


def rank_batch(
    task: Task, index: int, size: int, shards: int, parts: list[int]
) -> tuple[np.ndarray[Any, np.dtype[np.float64]], np.ndarray[Any, np.dtype[np.float64]]]:
    """This rank's rows of training batch ``index``: its blocks, concatenated in order."""
    if not parts:
        shape = task.shape
        return np.zeros((0, shape.input_dim)), np.zeros((0, shape.output_dim))
    blocks = [task.shard(index, size, shards, p) for p in parts]
    return np.concatenate([x for x, _ in blocks]), np.concatenate([y for _, y in blocks])


def scaled_loss(
    out: torch.Tensor, y: torch.Tensor, *, batch_size: int, world_size: int
) -> torch.Tensor:
    """``world_size * SSE_rank / (batch_size * outputs)``: DDP's gradient mean is the global one.

    Returns:
        A scalar tensor to back-propagate (not the rank's MSE: see the module docstring).
    """
    diff = out - y
    return (diff * diff).sum() * (world_size / (batch_size * y.shape[1]))
