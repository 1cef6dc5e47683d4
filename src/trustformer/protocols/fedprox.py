"""FedProx (Li et al. 2020, "Federated optimization in heterogeneous networks", Algorithm 2): FedAvg whose clients
minimise h_k(w; w^t) = F_k(w) + (μ/2)·‖w − w^t‖² (Eq. 2), w^t the global model the round starts from.

The server side is FedAvg's (the data-size-weighted mean, catch-up under client sampling). The proximal term
pulls each client's local solution toward w^t, which bounds client drift on non-IID shards. With μ = 0 the local
step is the task's own, so the run is FedAvg's to the last bit. Options: the ``[fedprox]`` section, ``mu``.

The anchor w^t is the client's trainable tensors when the round's local training starts: the global model it
applied (or caught up to). With ``federation.agg_every`` > 1, a round without exchange anchors at the client's own
model at the round's start. Under record-level DP-SGD the term is data-independent: its gradient is added after
the noise (``core/dpsgd.py``), which costs no privacy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import ConfigError, RunConfig
from ..core.shared import LocalStep
from .fedavg import FedAvg
from .interface.base import ClientSession
from .interface.parts import LocalTraining
from .interface.spec import ProtocolSpec


@dataclass(frozen=True)
class FedProxConfig:
    """FedProx (protocols/fedprox.py)."""

    mu: float = 0.01  # μ, the weight of the proximal term (μ/2)·‖w − w_global‖²; 0 = FedAvg exactly

    def validate(self) -> None:
        if not (self.mu >= 0 and self.mu < float("inf")):
            raise ConfigError(f"fedprox.mu = {self.mu} must be a finite number >= 0 (0 = FedAvg)")


def proximal_term(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """(μ/2)·Σ‖w − w^t‖² over the trainable tensors (Li et al. 2020, Eq. 2), differentiable in ``params``."""
    total = torch.zeros(())
    for p, a in zip(params, anchors, strict=True):
        total = total + (p - a.to(p.dtype)).pow(2).sum()
    return 0.5 * mu * total


def proximal_step(session: ClientSession, mu: float) -> LocalStep:
    """The task's plain step on h_k: its loss (mean over tokens or examples) plus the proximal term, the gradient
    clipped as the task's own step clips it (``session.grad_clip``)."""
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    params = dict(session.model.named_parameters())
    anchors = [params[n].detach().clone() for n in names]  # w^t: where this round's local training starts
    smoothing, clip = session.smoothing, session.grad_clip

    def step(model, optimizer, src, tgt):
        current = dict(model.named_parameters())
        optimizer.zero_grad(set_to_none=True)
        loss_sum, count = model.loss(src, tgt, label_smoothing=smoothing)
        (loss_sum / max(count, 1) + proximal_term([current[n] for n in names], anchors, mu)).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss_sum.detach(), count  # the reported training loss is the task's loss alone

    def penalty(model):  # under DP-SGD: data-independent, its gradient added after the noise
        current = dict(model.named_parameters())
        return proximal_term([current[n] for n in names], anchors, mu)

    step.dp_form = {"penalty": penalty}  # type: ignore[attr-defined]
    return step


class FedProx(FedAvg, LocalTraining):
    spec = ProtocolSpec(
        name="fedprox",
        factory=lambda cfg: FedProx(cfg),
        section=FedProxConfig,
        mean_weighting="examples",
        sums_noise_shares=True,  # one step from the global model: the proximal term's gradient is 0 there
        aggregate_kind="model",
        summary="FedAvg whose clients add the proximal term (mu/2)||w - w_global||^2 (Li et al. 2020)",
    )

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.mu = cfg.section(self.spec.name).mu

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return proximal_step(session, self.mu) if self.mu > 0 else None


SPEC = FedProx.spec

__all__ = ["FedProx", "FedProxConfig", "proximal_step", "proximal_term"]
