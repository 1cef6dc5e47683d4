"""What a learning task supplies to the federated round loop, and the helpers the image tasks share.

A task owns its data (client shards and the shared held-out test set), its model, its optimizer,
one local-training pass, and its scores. The round loop and the protocols only move the model's
tensors (``named_parameters``); they never look inside a task. Every model a task builds follows
the protocols' ``model.loss(inputs, targets, label_smoothing=…) -> (loss summed over examples, count)``
convention, so a protocol's own local step (SAM, a BLUR penalty) runs unchanged on any task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sized
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from ..core.shared import LocalStep, derive_seed
from ..errors import TrustformerError

PARTITIONS = ("iid", "stratified", "dirichlet")


class TaskConfigError(TrustformerError, ValueError):
    """A task option has a bad value; the message names the option."""


@runtime_checkable
class Task(Protocol):
    """The interface of a learning task (translation, image classification, segmentation).

    - ``name``: ``"image-classification"``, ``"segmentation"``, …
    - ``client_shards(n_clients, partition, seed, *, alpha)``: the clients' private training sets,
      disjoint, deterministic for the seed; ``partition`` is ``iid``, ``stratified`` (FedPC's
      class-stratified imbalanced split) or ``dirichlet`` (label skew with ``alpha``).
    - ``build_model(seed)``: the identical initial model every client starts from.
    - ``build_optimizer(model)``: the local optimizer with the task's settings.
    - ``train_local(model, optimizer, shard, *, seed, epochs, batch_size, step=None)``: ``epochs``
      passes over the shard in seeded order; ``step`` replaces the plain step (see ``LocalStep``).
      Returns ``train_loss`` (mean over examples), ``steps``, ``examples``, ``train_s``,
      ``examples_per_s``.
    - ``test_loss(model)``: mean loss on the shared held-out test set.
    - ``final_metrics(model)``: the task's scores (accuracy …, Dice …) and ``test_loss``.
    - ``describe()``: what a run records about the data and the model (JSON values).
    """

    name: str

    def client_shards(
        self, n_clients: int, partition: str = "iid", seed: int = 0, *, alpha: float = 0.5
    ) -> list[Sized]: ...

    def build_model(self, seed: int) -> nn.Module: ...

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer: ...

    def train_local(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: Any,
        *,
        seed: int,
        epochs: int,
        batch_size: int,
        step: LocalStep | None = None,
    ) -> dict[str, float]: ...

    def test_loss(self, model: nn.Module) -> float: ...

    def final_metrics(self, model: nn.Module) -> dict[str, Any]: ...

    def describe(self) -> dict[str, Any]: ...


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def seeded_model(factory: Callable[[], ModuleT], seed: int) -> ModuleT:
    """Build a model under ``derive_seed(seed, "model-init")`` without touching the global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model-init"))
        return factory()


def build_optimizer(
    model: nn.Module, *, name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with momentum (FedPC's "Momentum optimizer" for the ResNet) or Adam (its U-Net optimizer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise TaskConfigError(f"optimizer must be 'sgd' or 'adam'; got {name!r}")


def plain_step(label_smoothing: float = 0.0) -> LocalStep:
    """Loss, backward, optimizer step on the mean loss of the batch."""

    def step(model, optimizer, inputs, targets):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, n = model.loss(inputs, targets, label_smoothing=label_smoothing)
        (loss_sum / max(n, 1)).backward()
        optimizer.step()
        return loss_sum.detach(), n

    return step


def decay_learning_rate(optimizer: torch.optim.Optimizer, decay: float, progress: float) -> float:
    """FedPC's step-based decay (Section 5.1: "we apply the decay based on training steps, which is in
    turn based on the size of the local training dataset"), as inverse-time decay in local epochs:
    ``lr = lr_0 / (1 + decay · e)``, ``e`` the local epochs done so far (steps × batch / shard size).

    ``lr_0`` and ``e`` live in the optimizer's param groups (``lr_base``, ``local_epochs_done``),
    so they travel with the optimizer's state dict across rounds. ``progress`` (a fraction of an
    epoch) is added after the rate is set. Returns the rate used.
    """
    lr = 0.0
    for group in optimizer.param_groups:
        group.setdefault("lr_base", group["lr"])
        done = group.setdefault("local_epochs_done", 0.0)
        if decay > 0:
            group["lr"] = group["lr_base"] / (1.0 + decay * done)
        group["local_epochs_done"] = done + progress
        lr = group["lr"]
    return lr


def run_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    n_examples: int,
    batch: Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]],
    *,
    seed: int,
    epochs: int,
    batch_size: int,
    step: LocalStep,
    lr_decay: float = 0.0,
) -> dict[str, float]:
    """``epochs`` passes of mini-batch training in a seeded order (shared by the image tasks).

    ``batch(indices, generator)`` returns the (inputs, targets) of those examples on the model's
    device, drawing any augmentation from ``generator`` (seeded per epoch), so a client's training is
    reproducible whatever the order clients run in. ``lr_decay`` > 0 decays the learning rate with
    the local epochs done (:func:`decay_learning_rate`).
    """
    if epochs < 1:
        raise TaskConfigError(f"epochs must be ≥ 1; got {epochs}")
    if batch_size < 1:
        raise TaskConfigError(f"batch_size must be ≥ 1; got {batch_size}")
    if n_examples < 1:
        raise TaskConfigError("a client shard with no example cannot be trained on")
    model.train()
    started = time.perf_counter()
    loss_sum, seen, steps, lr = 0.0, 0, 0, 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "dropout"))  # any stochastic layer: reproducible
        for epoch in range(epochs):
            gen = torch.Generator().manual_seed(derive_seed(seed, "epoch", epoch))
            order = torch.randperm(n_examples, generator=gen)
            for start in range(0, n_examples, batch_size):
                idx = order[start : start + batch_size]
                lr = decay_learning_rate(optimizer, lr_decay, len(idx) / n_examples)
                inputs, targets = batch(idx, gen)
                batch_loss, n = step(model, optimizer, inputs, targets)
                loss_sum += float(batch_loss)
                seen += int(n)
                steps += 1
    elapsed = time.perf_counter() - started
    train_loss = loss_sum / max(seen, 1)
    if not math.isfinite(train_loss):
        raise FloatingPointError(f"local training diverged (train loss {train_loss})")
    return {
        "train_loss": train_loss,
        "steps": steps,
        "examples": seen,
        "train_s": elapsed,
        "examples_per_s": seen / elapsed if elapsed > 0 else float("inf"),
        "lr": lr,
    }


def check_choice(field: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise TaskConfigError(f"{field} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_positive(field: str, value: Any, *, allow_zero: bool = False, integer: bool = False) -> None:
    ok_type = (
        isinstance(value, int) and not isinstance(value, bool)
        if integer
        else (isinstance(value, (int, float)) and not isinstance(value, bool))
    )
    if not ok_type or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        kind = "an integer" if integer else "a number"
        raise TaskConfigError(f"{field} must be {kind} {bound}; got {value!r}")


__all__ = [
    "LocalStep",
    "PARTITIONS",
    "Task",
    "TaskConfigError",
    "build_optimizer",
    "check_choice",
    "check_positive",
    "decay_learning_rate",
    "derive_seed",
    "plain_step",
    "run_epochs",
    "seeded_model",
]
