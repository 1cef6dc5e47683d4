"""Local-training rules of the DP baselines, as functions on parameters and a loss closure.

- SAM (Foret et al. 2021), the local optimizer of DP-FedSAM (Shi et al. 2023, Algorithm 1):
  ε̂ = ρ·g/‖g‖ with g = ∇L(w); take the gradient at w + ε̂; step from w with it.
- BLUR (Cheng et al. 2022, bounded local update regularization): a penalty on the part of the
  local update's norm ‖w − w_global‖ above a bound, added to the local loss, so that the update
  is already small when it reaches the clipping step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch


def sam_perturbation(grads: Sequence[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """ε̂(w) = ρ · g / ‖g‖₂ with ‖g‖ over all tensors together (Foret et al. 2021, Eq. 2)."""
    present = [g for g in grads if g is not None]
    norm = math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in present))
    scale = rho / (norm + 1e-12)
    return [None if g is None else g.detach() * scale for g in grads]


def sam_step(
    params: Sequence[torch.nn.Parameter],
    closure: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    rho: float,
) -> torch.Tensor:
    """One SAM update (DP-FedSAM, Algorithm 1, local steps).

    1. g = ∇L(w) (``closure`` computes the loss; this function calls ``backward``);
    2. move to w + ε̂ with ε̂ = ρ·g/‖g‖;
    3. g_SAM = ∇L(w + ε̂);
    4. return to w and let ``optimizer`` step with g_SAM.

    Returns the loss at w (step 1), detached.
    """
    params = list(params)
    optimizer.zero_grad(set_to_none=True)
    loss = closure()
    loss.backward()
    perturbation = sam_perturbation([p.grad for p in params], rho)
    with torch.no_grad():
        for p, e in zip(params, perturbation, strict=True):
            if e is not None:
                p.add_(e)
    optimizer.zero_grad(set_to_none=True)
    closure().backward()
    with torch.no_grad():
        for p, e in zip(params, perturbation, strict=True):
            if e is not None:
                p.sub_(e)
    optimizer.step()
    return loss.detach()


def blur_penalty(
    params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], bound: float, lam: float
) -> torch.Tensor:
    """R(w) = (λ/2) · max(0, ‖w − w_global‖₂ − B)², differentiable in ``params``.

    Zero (and with zero gradient) while the local update's norm stays within B; above it, a pull
    back towards the global model that grows with the excess.
    """
    if len(params) != len(anchors):
        raise ValueError(f"{len(params)} parameters but {len(anchors)} anchors")
    sq = cast(torch.Tensor, sum((p - a.to(p.dtype)).pow(2).sum() for p, a in zip(params, anchors, strict=True)))
    norm = torch.sqrt(torch.clamp_min(sq, 1e-30))
    excess = torch.relu(norm - bound)
    return 0.5 * lam * excess * excess


__all__ = ["sam_perturbation", "sam_step", "blur_penalty"]
