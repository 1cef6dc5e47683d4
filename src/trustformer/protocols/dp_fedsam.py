"""DP-FedSAM (Shi et al. 2023, "Make landscape flatter in differentially private federated learning",
Algorithm 1): DP-FedAvg (``dp.py`` around ``fedavg_updates.py``) whose clients train with Sharpness-Aware
Minimization.

Each local step: g = ∇L(w), ε̂ = ρ·g/‖g‖, g_SAM = ∇L(w + ε̂), and the optimizer steps from w with
g_SAM (the base optimizer is the run's Adam, paper Table II, where Shi et al. use SGD). The noise is
added once to the sum on the server (as in DP-FedAvg) rather than split over the clients as
N(0, σ²C²/m) each: the same distribution of the sum, and the same accounting.
"""

from __future__ import annotations

from ..config import RunConfig
from ..core.local_rules import sam_step
from .fedavg_updates import FedAvgUpdates
from .interface.base import ClientSession, FederatedProtocol, LocalStep
from .wrappers.dp import DifferentialPrivacy, dp_spec, record_level


def sam_local_step(rho: float):
    """The SAM step of local training, for a client's session (``privacy.sam_rho`` = ρ)."""

    def make(session: ClientSession) -> LocalStep:
        smoothing = session.smoothing

        def step(model, optimizer, src, tgt):
            params = [p for p in model.parameters() if p.requires_grad]
            calls: list[tuple] = []

            def closure():
                loss_sum, n_tokens = model.loss(src, tgt, label_smoothing=smoothing)
                calls.append((loss_sum.detach(), n_tokens))
                return loss_sum / max(n_tokens, 1)

            sam_step(params, closure, optimizer, rho)
            return calls[0]  # the loss at w (before the perturbation) is the reported training loss

        step.dp_form = {"sam_rho": rho}  # type: ignore[attr-defined]  # under DP-SGD (core/dpsgd.py)
        return step

    return make


def dp_fedsam(cfg: RunConfig) -> FederatedProtocol:
    """Client level: user-level DP around FedAvg of SAM-trained updates. Record level (``privacy.unit =
    "record"``, the other reading of the paper's clipping): SAM under DP-SGD, its ascent along the previous
    step's noisy gradient (``core/dpsgd.py``), plain averaging."""
    inner = FedAvgUpdates(cfg, local_step=sam_local_step(cfg.privacy.sam_rho))
    if cfg.privacy.unit == "record":
        return record_level(inner, SPEC)
    return DifferentialPrivacy(inner, cfg.privacy, spec=SPEC)


SPEC = dp_spec("dp-fedsam", dp_fedsam, "DP-FedAvg whose clients train with SAM (Shi et al. 2023)")

__all__ = ["dp_fedsam", "sam_local_step"]
