"""The optimizer and learning-rate schedule of local training (the training recipe).

Two optimizers, chosen by ``train.optimizer``:

* ``adamw``: Adam with decoupled weight decay (Loshchilov & Hutter 2019) on weight matrices only.
  Biases, LayerNorm parameters and embeddings (the tied embedding is also the output projection)
  are not decayed: pulling them toward zero only hurts, and with coupled decay it dominates.
* ``adam``: ``torch.optim.Adam(weight_decay=...)`` — the decay is added to every gradient before
  Adam's scaling, on every parameter, exactly as the Trustformer paper's Table II reads.

The schedule (``train.schedule``): linear warm-up over ``train.warmup_steps`` optimizer steps, then
``inverse_sqrt`` (lr·sqrt(warmup/step), Vaswani et al. 2017), ``cosine`` (down to ``train.min_lr``
over ``train.decay_steps``, 0 = every step the client will take in the run) or ``constant``. The
position in the schedule is the optimizer's own step count, so it survives rounds, the state store
and resume with the optimizer state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["AdamWBiasCorrected", "build_optimizer", "lr_at", "optimizer_steps", "set_lr", "split_decay"]


def split_decay(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed): weight matrices of ``nn.Linear`` layers vs everything else
    (biases, LayerNorm gains and biases, embeddings, scalars)."""
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay: list[nn.Parameter] = []
    keep: list[nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if id(p) in matrices and p.dim() >= 2 else keep).append(p)
    return decay, keep


class AdamWBiasCorrected(torch.optim.Optimizer):
    """AdamW whose second-moment estimate has the DP noise's variance taken out (DP-AdamBC, Tang et al. 2024,
    Algorithm 1): θ ← θ(1 − ηλ) − η·m̂ / sqrt(max(v̂ − Φ, γ·Φ)), Φ = (σC/B)² the variance the noise adds to every
    coordinate of the privatized mean gradient (``noise_variance``, set by DP-SGD before it steps) and γ
    (``floor``) the share of it that bounds the step where the noise dominates. Without it, v̂ ≈ Φ everywhere and
    DP-Adam is DP-SGD with a learning rate of η/σ_noise. ``noise_variance`` = 0 is AdamW exactly (test); the state
    keeps AdamW's names."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.98), eps: float = 1e-8, weight_decay: float = 0.0):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "noise_variance": 0.0, "floor": 0.1})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            phi, lr = float(group["noise_variance"]), float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                p.mul_(1 - lr * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = state["exp_avg"] / (1 - beta1**t)
                v_hat = state["exp_avg_sq"] / (1 - beta2**t)
                if phi > 0:
                    denom = (v_hat - phi).clamp(min=group["floor"] * phi).sqrt()
                else:
                    denom = v_hat.sqrt().add_(group["eps"])
                p.add_(m_hat / denom, alpha=-lr)
        return loss


def build_optimizer(
    model: nn.Module,
    *,
    name: str = "adamw",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.98),
    noise_corrected: bool = False,
) -> torch.optim.Optimizer:
    """``adamw``: decoupled decay on matrices only; ``adam``: L2-coupled decay on every parameter.
    ``noise_corrected`` (adamw): :class:`AdamWBiasCorrected`, for DP-SGD's noisy gradients."""
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    if name != "adamw":
        raise ValueError(f"unknown optimizer {name!r} (train.optimizer: adamw | adam)")
    decay, keep = split_decay(model)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    if noise_corrected:
        return AdamWBiasCorrected([g for g in groups if g["params"]], lr=lr, betas=betas)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)


def lr_at(step: int, *, lr: float, schedule: str, warmup_steps: int, decay_steps: int, min_lr: float = 0.0) -> float:
    """Learning rate of optimizer step ``step`` (1-based): linear warm-up to ``lr``, then the decay."""
    if schedule not in ("cosine", "inverse_sqrt", "constant"):
        raise ValueError(f"unknown schedule {schedule!r} (train.schedule: cosine | inverse_sqrt | constant)")
    step = max(step, 1)
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "inverse_sqrt":
        return lr * math.sqrt(max(warmup_steps, 1) / step)
    span = max(decay_steps - warmup_steps, 1)  # cosine
    progress = min((step - warmup_steps) / span, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Steps this optimizer has taken (from its saved state, so it survives save and load), plus the
    ``steps_before`` of its first parameter group: the steps of a run it stands in for from the middle (the
    learning-rate schedule then continues from there, as for LiRA's reference models, ``attack/lira.py``)."""
    before = int(optimizer.param_groups[0].get("steps_before", 0)) if optimizer.param_groups else 0
    for state in optimizer.state.values():
        step = state.get("step")
        if step is not None:
            return int(step) + before
    return before


def set_lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = value
