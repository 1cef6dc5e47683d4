"""Attacks that stay inside the defences, as pure functions on flat update vectors (docs/robustness.md).

A malicious client crafts the update it sends from what it can see: its own honest update(s) and, when it
colludes, the honest updates of its colluders (``runtime/attacker.py`` gathers them). Every function here takes
those *benign samples* as the rows of a float64 matrix ``B`` (one flattened update per row) and returns one
flattened malicious update; :func:`flatten` / :func:`unflatten` convert named tensors.

- :func:`alie` — "A Little Is Enough" (Baruch et al., NeurIPS 2019);
- :func:`min_max` / :func:`min_sum` — the AGR-agnostic attacks of Shejwalkar & Houmansadr, "Manipulating the
  Byzantine" (NDSS 2021);
- :func:`norm_matched` — model replacement (Bagdasaryan et al., AISTATS 2020) boosted, then scaled back to the
  norm the server's bound accepts, estimated from the benign samples (:func:`median_norm`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import torch

Named = Mapping[str, torch.Tensor]
PERTURBATIONS = ("unit", "std", "sign")


def flatten(update: Named) -> torch.Tensor:
    """All tensors of ``update`` as one float64 vector, in the mapping's order."""
    return torch.cat([t.detach().to(torch.float64).reshape(-1) for t in update.values()])


def unflatten(vector: torch.Tensor, like: Named) -> dict[str, torch.Tensor]:
    """The inverse of :func:`flatten`: ``vector`` cut into tensors with the names, shapes and dtypes of ``like``."""
    out, offset = {}, 0
    for name, ref in like.items():
        out[name] = vector[offset : offset + ref.numel()].reshape(ref.shape).to(ref.dtype)
        offset += ref.numel()
    if offset != vector.numel():
        raise ValueError(f"a vector of {vector.numel()} values does not fill tensors of {offset}")
    return out


def stack(samples: Sequence[Named]) -> torch.Tensor:
    """The benign samples as the rows of a float64 matrix."""
    if not samples:
        raise ValueError("an attack needs at least one benign sample")
    return torch.stack([flatten(s) for s in samples])


def alie_z(clients: int, malicious: int) -> float:
    """ALIE's z_max (Baruch et al. 2019, Alg. 3 lines 1–2): with s = ⌊n/2 + 1⌋ − f the supporters the attackers
    need, z_max = Φ⁻¹((n − s) / n), the largest shift that keeps the attackers closer to the mean than s benign
    clients (0 when they need none: n − s ≤ n/2)."""
    if not 0 < malicious < clients:
        raise ValueError(f"ALIE needs 0 < f < n, got f = {malicious} of n = {clients}")
    supporters = math.floor(clients / 2 + 1) - malicious
    p = (clients - supporters) / clients
    return max(0.0, NormalDist().inv_cdf(min(p, 1 - 1e-12))) if p > 0 else 0.0


def mean_and_std(benign: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-coordinate mean μ_j and standard deviation σ_j of the benign samples (population form: 0 for one
    sample)."""
    return benign.mean(dim=0), benign.std(dim=0, correction=0)


def alie(benign: torch.Tensor, z: float) -> torch.Tensor:
    """ALIE (Baruch et al. 2019, Alg. 3 line 4): p_j = μ_j − z·σ_j for every coordinate j, so that the update lies
    within z standard deviations of the benign mean in every coordinate."""
    mu, sigma = mean_and_std(benign)
    return mu - z * sigma


def perturbation(benign: torch.Tensor, kind: str) -> torch.Tensor:
    """∇ᵖ of Shejwalkar & Houmansadr 2021 (Sec. IV-A): ``unit`` = −∇ᵇ/‖∇ᵇ‖ (inverse unit vector of the benign
    mean), ``std`` = −σ (inverse standard deviation), ``sign`` = −sign(∇ᵇ)."""
    mu, sigma = mean_and_std(benign)
    if kind == "unit":
        norm = float(mu.norm())
        return -mu / norm if norm > 0 else torch.zeros_like(mu)
    if kind == "std":
        return -sigma
    if kind == "sign":
        return -torch.sign(mu)
    raise ValueError(f"unknown perturbation {kind!r} (one of: {', '.join(PERTURBATIONS)})")


def _sq_distances(point: torch.Tensor, benign: torch.Tensor) -> torch.Tensor:
    return (benign - point).pow(2).sum(dim=1)


def max_gamma(fits, upper: float, tolerance: float = 1e-6, steps: int = 60) -> float:
    """The largest γ in [0, ``upper``] with ``fits(γ)``, by bisection (Shejwalkar & Houmansadr 2021, Alg. 1: the
    γ search halving its step). The feasible set of both attacks is an interval [0, γ*] (a convex distance
    below a threshold, feasible at 0), so bisection finds γ* to ``tolerance`` × ``upper``."""
    if upper <= 0 or not fits(0.0):
        return 0.0
    if fits(upper):
        return upper
    low, high = 0.0, upper
    for _ in range(steps):
        if high - low <= tolerance * upper:
            break
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _pairwise_sq(benign: torch.Tensor) -> torch.Tensor:
    return torch.cdist(benign, benign).pow(2)


def _search_upper(benign: torch.Tensor, direction: torch.Tensor) -> float:
    """A γ past which no malicious update can fit: twice the benign diameter over ‖∇ᵖ‖."""
    norm = float(direction.norm())
    diameter = float(_pairwise_sq(benign).max()) ** 0.5
    return 2.0 * diameter / norm + 1e-12 if norm > 0 else 0.0


@dataclass(frozen=True)
class Crafted:
    """A malicious update and what its search found (γ, the threshold it kept under, what it reached)."""

    update: torch.Tensor
    gamma: float
    threshold: float
    reached: float


def min_max(benign: torch.Tensor, kind: str = "unit") -> Crafted:
    """Min-Max (Shejwalkar & Houmansadr 2021, Eq. 6): ∇ᵐ = ∇ᵇ + γ∇ᵖ with the largest γ for which
    max_i ‖∇ᵐ − ∇_i‖ ≤ max_{i,j} ‖∇_i − ∇_j‖ over the benign updates: the malicious update is no farther from any
    benign one than the two farthest benign ones are from each other."""
    mu, direction = benign.mean(dim=0), perturbation(benign, kind)
    threshold = float(_pairwise_sq(benign).max())

    def fits(gamma: float) -> bool:
        return float(_sq_distances(mu + gamma * direction, benign).max()) <= threshold

    gamma = max_gamma(fits, _search_upper(benign, direction))
    update = mu + gamma * direction
    return Crafted(update, gamma, threshold, float(_sq_distances(update, benign).max()))


def min_sum(benign: torch.Tensor, kind: str = "unit") -> Crafted:
    """Min-Sum (Shejwalkar & Houmansadr 2021, Eq. 7): the largest γ for which Σ_i ‖∇ᵐ − ∇_i‖² ≤
    max_i Σ_j ‖∇_i − ∇_j‖²: the malicious update's summed squared distance to the benign ones is no larger than
    that of any benign update."""
    mu, direction = benign.mean(dim=0), perturbation(benign, kind)
    threshold = float(_pairwise_sq(benign).sum(dim=1).max())

    def fits(gamma: float) -> bool:
        return float(_sq_distances(mu + gamma * direction, benign).sum()) <= threshold

    gamma = max_gamma(fits, _search_upper(benign, direction))
    update = mu + gamma * direction
    return Crafted(update, gamma, threshold, float(_sq_distances(update, benign).sum()))


def median_norm(benign: torch.Tensor) -> float:
    """The attacker's estimate of the norm a bound at the round's median accepts: the median L2 norm of its benign
    samples (its own and its colluders' honest updates; the server's median is never seen)."""
    return float(benign.norm(dim=1).median())


def norm_matched(poisoned: torch.Tensor, boost: float, norm_cap: float) -> torch.Tensor:
    """Model replacement (Bagdasaryan et al. 2020, Eq. 3: X̃ = γ(X − G) + G with γ = ``boost``), constrained as in
    their Sec. 4 ("constrain-and-scale") against a norm bound S: the boosted update scaled down so that its norm
    is at most S = ``norm_cap``, i.e. γ' = min(γ, S / ‖X − G‖). The direction stays the poisoned update's."""
    length = float(poisoned.norm())
    if length == 0:
        return poisoned.clone()
    return poisoned * min(boost, norm_cap / length)


def projected(update: torch.Tensor, norm_cap: float, reference: torch.Tensor | None, min_cosine: float) -> torch.Tensor:
    """The projection of a constrained backdoor's descent (PGD: Sun et al. 2019, Sec. 4; Wang et al. 2020, "Attack of
    the tails", Sec. 4): ``update`` scaled into the L2 ball of radius ``norm_cap`` (the norm bound), then, where its
    cosine with ``reference`` is below ``min_cosine``, turned toward ``reference`` in the plane they span until its
    cosine is ``min_cosine``, its norm kept (the server's direction check)."""
    length = float(update.norm())
    out = update * (norm_cap / length) if length > norm_cap > 0 else update.clone()
    if reference is None or float(reference.norm()) == 0 or min_cosine <= -1 or length == 0:
        return out
    unit = reference / reference.norm()
    along = float(out @ unit)
    size = float(out.norm())
    if along >= min_cosine * size:
        return out
    across = out - along * unit
    side = across / across.norm() if float(across.norm()) > 0 else torch.zeros_like(out)
    return size * (min_cosine * unit + math.sqrt(max(0.0, 1.0 - min_cosine**2)) * side)


def neurotoxin_mask(last_update: torch.Tensor, top: float) -> torch.Tensor:
    """Neurotoxin (Zhang et al. 2022, Alg. 1): 1 on every coordinate outside the top ``top`` share of the last global
    update's magnitudes (those honest clients move most, where a backdoor would be overwritten), 0 on those."""
    mask = torch.ones_like(last_update)
    count = math.ceil(top * last_update.numel())
    if count:
        mask[torch.topk(last_update.abs(), count).indices] = 0.0
    return mask


__all__ = [
    "PERTURBATIONS",
    "Crafted",
    "alie",
    "alie_z",
    "flatten",
    "max_gamma",
    "mean_and_std",
    "median_norm",
    "min_max",
    "min_sum",
    "neurotoxin_mask",
    "norm_matched",
    "perturbation",
    "projected",
    "stack",
    "unflatten",
]
