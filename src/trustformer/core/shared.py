"""Helpers and conventions every layer may import: seeds, named tensors, the local step type, the device.

The one low module that protocols, tasks and the runtime share (it imports nothing from the package).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

Tensors = dict[str, torch.Tensor]

ALL_SHARDS = -1
"""Partition id of the centralized client, which holds the union of all shards."""

LocalStep = Callable[[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]
"""One local training step on a batch ``(model, optimizer, src, tgt)`` (image tasks: ``(model, optimizer, x, y)``):
updates the model and returns the batch loss summed over tokens or examples (detached) and their count."""


def clipped_gradients(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    src: torch.Tensor,
    tgt: torch.Tensor,
    smoothing: float,
    clip: float,
) -> tuple[torch.Tensor, int]:
    """The first half of the task's plain step, for a protocol's or an attacker's own step to change the gradient
    before ``optimizer.step()``: gradients zeroed, the batch's mean loss back-propagated, the gradient clipped to
    ``clip`` (0: not clipped) as the task's step clips it. Returns the batch's summed loss (detached) and count."""
    optimizer.zero_grad(set_to_none=True)
    loss_sum, count = model.loss(src, tgt, label_smoothing=smoothing)  # type: ignore[operator]
    (loss_sum / max(count, 1)).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    return loss_sum.detach(), count


def derive_seed(*parts: int | str) -> int:
    """A stable 63-bit seed derived from the run seed and labels (client, round, purpose)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def select_device(name: str) -> torch.device:
    """``runtime.device``: ``auto`` is CUDA when this process sees a GPU, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "runtime.device = 'cuda' but this process sees no CUDA device (use runtime.device = 'auto' or 'cpu')"
        )
    return torch.device(name)


def trainable_tensors(model: torch.nn.Module) -> Tensors:
    """Detached copies of a model's trainable tensors by name (shared tensors once)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def assign_tensors(model: torch.nn.Module, tensors: Tensors) -> None:
    """Overwrite a model's trainable tensors in place (names and shapes must match)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].dtype))


__all__ = ["ALL_SHARDS", "LocalStep", "Tensors", "assign_tensors", "derive_seed", "select_device", "trainable_tensors"]
