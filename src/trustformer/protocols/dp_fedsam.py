"""DP-FedSAM (Shi et al. 2023, "Make landscape flatter in differentially private federated
learning", Algorithm 1): local training with Sharpness-Aware Minimization, then the clipped update
and server-side Gaussian noise of DP-FedAvg.

Each local step: g = ∇L(w), ε̂ = ρ·g/‖g‖, g_SAM = ∇L(w + ε̂), and the optimizer steps from w with
g_SAM (the base optimizer is the run's Adam, paper Table II, where Shi et al. use SGD). The
noise is added once to the sum on the server (as in DP-FedAvg) rather than split over the clients
as N(0, σ²C²/m) each: the same distribution of the sum, and the same accounting.
"""

from __future__ import annotations

from ..config import RunConfig
from ..core.local_rules import sam_step
from .base import ClientSession, LocalStep
from .dp_fedavg import DPFedAvg


class DPFedSAM(DPFedAvg):
    name = "dp-fedsam"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.rho = cfg.privacy.sam_rho

    def local_step(self, session: ClientSession) -> LocalStep:
        smoothing = session.smoothing
        rho = self.rho

        def step(model, optimizer, src, tgt):
            params = [p for p in model.parameters() if p.requires_grad]
            calls: list[tuple] = []

            def closure():
                loss_sum, n_tokens = model.loss(src, tgt, label_smoothing=smoothing)
                calls.append((loss_sum.detach(), n_tokens))
                return loss_sum / max(n_tokens, 1)

            sam_step(params, closure, optimizer, rho)
            return calls[0]  # the loss at w (before the perturbation) is the reported training loss

        return step


__all__ = ["DPFedSAM"]
