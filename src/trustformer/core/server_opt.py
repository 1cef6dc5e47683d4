"""Server-side optimizers (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2): the server treats
the round's pseudo-gradient Δ_t (the mean of the clients' models minus the global model x_t, or the mean of their
updates) as a gradient and takes one step of an optimizer with it, x_{t+1} = x_t + step.

=========  ===============================================================  ===========================
name       the step (Δ_t = the pseudo-gradient, t = 1, 2, … the steps)         Flower's strategy
=========  ===============================================================  ===========================
sgd        η·Δ_t (η = 1: FedAvg)                                            FedAvg / FedAvgM (β = 0)
momentum   m_t = β·m_{t−1} + Δ_t (m_1 = Δ_1); η·m_t                         FedAvgM
adam       m_t = β1·m_{t−1} + (1 − β1)·Δ_t; v_t = β2·v_{t−1} + (1 − β2)·Δ_t²;  FedAdam
           η_t·m_t / (√v_t + τ), η_t = η·√(1 − β2^(t+1)) / (1 − β1^(t+1))
yogi       m_t as adam; v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²);     FedYogi
           η·m_t / (√v_t + τ)
adagrad    m_t = Δ_t; v_t = v_{t−1} + Δ_t²; η·m_t / (√v_t + τ)               FedAdagrad
=========  ===============================================================  ===========================

Each line is Reddi et al.'s Algorithm 2 as Flower 1.x writes it (``flwr/server/strategy/fedadam.py``,
``fedyogi.py``, ``fedadagrad.py``, ``fedavgm.py``), operation for operation, so that both give the same numbers: the
moments start at 0 (m_0 = v_0 = 0, where the paper lets v_{−1} ≥ τ²), FedAvgM's momentum is Δ_1 in the first step
(the same as β·0 + Δ_1), and FedAdam's step size carries Adam's bias correction (Kingma & Ba 2015, the α_t before
their Sec. 2.1) at t + 1, as Flower's does with its round number t + 1.0. Everything is computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Tensors = dict[str, torch.Tensor]

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")
ADAPTIVE = ("adam", "yogi", "adagrad")  # the optimizers with a second moment v_t (Reddi et al., Alg. 2)


@dataclass(frozen=True)
class ServerOptimizer:
    """An optimizer of :data:`SERVER_OPTIMIZERS` and its hyperparameters: η (``lr``), FedAvgM's β (``momentum``),
    Adam's and Yogi's β1, β2, and τ, the adaptive optimizers' degree of adaptivity (the ones it does not read: 0)."""

    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    tau: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in SERVER_OPTIMIZERS:
            raise ValueError(f"server optimizer {self.name!r} is not one of {', '.join(SERVER_OPTIMIZERS)}")

    @property
    def identity(self) -> bool:
        """Plain SGD at η = 1: the step is the pseudo-gradient itself (FedAvg), nothing to do."""
        return self.name == "sgd" and self.lr == 1.0


@dataclass(frozen=True)
class Moments:
    """What the optimizer keeps from step to step: m_t (momentum, adam, yogi, adagrad), v_t (adam, yogi, adagrad),
    and the number t of steps taken (float64 tensors, named like the pseudo-gradient)."""

    first: Tensors | None = None
    second: Tensors | None = None
    steps: int = 0


def server_step(delta: Tensors, moments: Moments, opt: ServerOptimizer) -> tuple[Tensors, Moments]:
    """One step of ``opt`` with the pseudo-gradient ``delta`` (Reddi et al. 2021, Alg. 2, lines 13–16): the step to
    add to the global model (float64) and the moments after it."""
    d = {n: t.detach().double() for n, t in delta.items()}
    t = moments.steps + 1
    if opt.name == "sgd":
        return {n: opt.lr * g for n, g in d.items()}, Moments(steps=t)
    if opt.name == "momentum":
        previous = moments.first
        m = d if previous is None else {n: opt.momentum * previous[n] + g for n, g in d.items()}
        return {n: opt.lr * x for n, x in m.items()}, Moments(first=m, steps=t)
    m = first_moment(d, moments.first, 0.0 if opt.name == "adagrad" else opt.beta1)
    v = second_moment(opt.name, d, moments.second, opt.beta2)
    eta = adam_step_size(opt, t) if opt.name == "adam" else opt.lr
    return {n: eta * m[n] / (torch.sqrt(v[n]) + opt.tau) for n in d}, Moments(first=m, second=v, steps=t)


def first_moment(d: Tensors, previous: Tensors | None, beta1: float) -> Tensors:
    """m_t = β1·m_{t−1} + (1 − β1)·Δ_t, m_0 = 0 (Alg. 2 line 13; FedAdagrad: β1 = 0, m_t = Δ_t)."""
    m0 = previous if previous is not None else {n: torch.zeros_like(g) for n, g in d.items()}
    return {n: beta1 * m0[n] + (1 - beta1) * g for n, g in d.items()}


def second_moment(name: str, d: Tensors, previous: Tensors | None, beta2: float) -> Tensors:
    """v_t, v_0 = 0: Adagrad v_{t−1} + Δ_t² (Alg. 2 line 14), Yogi v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²)
    (line 15), Adam β2·v_{t−1} + (1 − β2)·Δ_t² (line 16)."""
    v0 = previous if previous is not None else {n: torch.zeros_like(g) for n, g in d.items()}
    if name == "adagrad":
        return {n: v0[n] + g * g for n, g in d.items()}
    if name == "yogi":
        return {n: v0[n] - (1.0 - beta2) * (g * g) * torch.sign(v0[n] - g * g) for n, g in d.items()}
    return {n: beta2 * v0[n] + (1 - beta2) * (g * g) for n, g in d.items()}


def adam_step_size(opt: ServerOptimizer, t: int) -> float:
    """FedAdam's bias-corrected step size η·√(1 − β2^(t+1)) / (1 − β1^(t+1)) at step t (Flower's ``eta_norm``, with
    its round number t + 1.0)."""
    return opt.lr * math.sqrt(1 - math.pow(opt.beta2, t + 1.0)) / (1 - math.pow(opt.beta1, t + 1.0))


__all__ = [
    "ADAPTIVE",
    "SERVER_OPTIMIZERS",
    "Moments",
    "ServerOptimizer",
    "adam_step_size",
    "first_moment",
    "second_moment",
    "server_step",
]
