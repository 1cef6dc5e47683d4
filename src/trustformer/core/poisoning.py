"""Model poisoning by a well-formed malicious client, as pure functions on named tensors (docs/robustness.md).

The client trains as usual, then replaces what it trained by ``start + g(trained − start)``, where ``start`` is
the model it started the round from; the protocol then builds its payload from that model, so every check of
shapes, values and counts passes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Named = Mapping[str, torch.Tensor]


def poisoned_model(
    start: Named, trained: Named, kind: str, *, factor: float = -10.0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """``scale``: the update times ``factor``; ``sign_flip``: the update negated; ``noise``: a Gaussian vector
    (seeded) of the update's L2 norm instead of the update (Blanchard et al. 2017's Gaussian attacker, scaled)."""
    update = {n: trained[n].detach().to(torch.float64) - start[n].detach().to(torch.float64) for n in trained}
    if kind == "scale":
        poisoned = {n: u * factor for n, u in update.items()}
    elif kind == "sign_flip":
        poisoned = {n: -u for n, u in update.items()}
    elif kind == "noise":
        generator = torch.Generator().manual_seed(seed)
        noise = {n: torch.randn(u.shape, generator=generator, dtype=torch.float64) for n, u in update.items()}
        norm = sum(float(u.pow(2).sum()) for u in update.values()) ** 0.5
        noise_norm = sum(float(z.pow(2).sum()) for z in noise.values()) ** 0.5
        poisoned = {n: z * (norm / noise_norm if noise_norm > 0 else 0.0) for n, z in noise.items()}
    else:
        raise ValueError(f"unknown model poisoning kind {kind!r} (scale, sign_flip, noise)")
    return {n: (start[n].detach().to(torch.float64) + poisoned[n]).to(trained[n].dtype) for n in trained}


__all__ = ["poisoned_model"]
