"""Defences against stealthy attacks, as pure functions on the round's updates (docs/robustness.md).

Every function takes the round's client *updates* (payload minus the global model the round started from) as
the rows of a float64 matrix ``U`` (``attacks.stack``), and returns the aggregate update to add to the global
model with what it did to each client, for the wrapper (``protocols/wrappers/robust.py``) to record as events:

- :func:`fltrust` — FLTrust (Cao et al., NDSS 2021), trust from the server's own update on root data;
- :func:`flame` — FLAME (Nguyen et al., USENIX Security 2022): HDBSCAN on cosine distances, median-norm clipping,
  Gaussian noise;
- :func:`clip_and_noise` — norm clipping with weak differential-privacy noise (Sun et al. 2019, "Can you really
  backdoor federated learning?");
- :func:`robust_learning_rate` — the robust learning rate (Ozdayi et al., AAAI 2021): the server's step reversed on
  every coordinate where too few clients agree on its sign; :func:`rlr_step` is the same from the sums alone (the
  mean update and the sum of signs, which secure aggregation can compute unseen).

Random noise is drawn from a ``torch.Generator`` the caller seeds from the run's configuration, so a run
reproduces; it is a defence's noise, not a privacy mechanism's (no accountant covers it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class DefenceResult:
    """The aggregate update and, per client (by row), its weight in the aggregate, the factor its update was
    scaled by (1: unchanged) and whether it was left out."""

    update: torch.Tensor
    weights: list[float]
    scales: list[float]
    kept: list[bool]
    info: dict[str, float | list[float] | list[int]] = field(default_factory=dict)


def cosine_matrix(updates: torch.Tensor) -> torch.Tensor:
    """n×n cosine similarities of the rows (0 where a row is zero)."""
    norms = updates.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, updates / norms.clamp_min(1e-300), torch.zeros_like(updates))
    return (unit @ unit.T).clamp(-1.0, 1.0)


def cosines_to(updates: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Each row's cosine similarity with ``reference`` (0 where either is zero)."""
    ref_norm, norms = float(reference.norm()), updates.norm(dim=1)
    if ref_norm == 0:
        return torch.zeros(len(updates), dtype=updates.dtype)
    return torch.where(norms > 0, (updates @ reference) / (norms.clamp_min(1e-300) * ref_norm), 0.0)


def fltrust(updates: torch.Tensor, server_update: torch.Tensor) -> DefenceResult:
    """FLTrust (Cao et al. 2021, Alg. 2 and Eqs. 1–4): each client's trust score TS_i = ReLU(cos(g_i, g_0)) with the
    server's update g_0 from root data; each update rescaled to ‖g_0‖ (ḡ_i = ‖g_0‖/‖g_i‖ · g_i); the aggregate
    g = Σ TS_i ḡ_i / Σ TS_j (zero when every score is zero: the global model stays)."""
    trust = cosines_to(updates, server_update).clamp_min(0.0)
    server_norm = float(server_update.norm())
    norms = updates.norm(dim=1)
    scales = torch.where(norms > 0, server_norm / norms.clamp_min(1e-300), 0.0)
    total = float(trust.sum())
    weights = (trust / total) if total > 0 else torch.zeros_like(trust)
    aggregate = (weights * scales) @ updates
    return DefenceResult(
        aggregate,
        weights.tolist(),
        scales.tolist(),
        [bool(t > 0) for t in trust],
        {"trust": trust.tolist(), "server_norm": server_norm},
    )


def majority_cluster(distances: np.ndarray, min_cluster_size: int) -> list[int]:
    """FLAME's model filtering (Nguyen et al. 2022, Alg. 1 lines 5–7): HDBSCAN (scikit-learn's, on the precomputed
    distances, ``min_samples`` = 1 and a single cluster allowed, as in FLAME's published implementation) with
    ``min_cluster_size``; the rows of the largest cluster (ties: the one with the lowest label). Rows HDBSCAN calls
    noise (label −1) are outliers; with no cluster at all, no row is kept.

    With ``min_cluster_size`` > n/2 there is at most one cluster, and HDBSCAN's single-cluster labelling keeps only
    the rows that stay in it until it dissolves: about the ``min_cluster_size`` densest rows. The others are noise,
    honest ones included, so FLAME leaves out about n/2 − 1 updates every round even when all are honest."""
    from sklearn.cluster import HDBSCAN  # scikit-learn: imported when FLAME runs, not with the package

    n = len(distances)
    if n < 2:
        return list(range(n))
    labels = HDBSCAN(
        min_cluster_size=max(2, min_cluster_size),
        min_samples=1,
        metric="precomputed",
        allow_single_cluster=True,
        copy=True,
    ).fit_predict(distances)
    clusters = sorted({int(x) for x in labels if x >= 0})
    if not clusters:
        return []
    largest = max(clusters, key=lambda c: (int((labels == c).sum()), -c))
    return [i for i in range(n) if labels[i] == largest]


def median_of(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def gaussian(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²) per coordinate, in float64, from ``generator``."""
    if std <= 0:
        return torch.zeros_like(like)
    return torch.randn(like.shape, generator=generator, dtype=torch.float64) * std


def flame(updates: torch.Tensor, noise_factor: float, generator: torch.Generator) -> DefenceResult:
    """FLAME (Nguyen et al. 2022, Alg. 1): cosine distances c_ij = 1 − cos(Δ_i, Δ_j) between the updates;
    HDBSCAN with min_cluster_size = ⌊n/2⌋ + 1 keeps the majority cluster (lines 5–7); the median L2 norm S_t of all
    updates (line 9) is the clipping bound, each kept update scaled by min(1, S_t/e_i) (lines 10–13); the kept
    updates are averaged (line 15) and Gaussian noise of σ = λ·S_t added per coordinate (lines 16–17)."""
    n = len(updates)
    distances = (1.0 - cosine_matrix(updates)).clamp_min(0.0).numpy().astype(np.float64)
    np.fill_diagonal(distances, 0.0)
    kept = set(majority_cluster(distances, n // 2 + 1))
    norms = updates.norm(dim=1).tolist()
    bound = median_of(norms)
    scales = [min(1.0, bound / e) if e > 0 else 1.0 for e in norms]
    weights = [1.0 / len(kept) if i in kept else 0.0 for i in range(n)]
    aggregate = torch.zeros(updates.shape[1], dtype=torch.float64)
    for i in sorted(kept):
        aggregate += updates[i] * (scales[i] * weights[i])
    sigma = noise_factor * bound
    aggregate += gaussian(aggregate, sigma, generator)
    return DefenceResult(
        aggregate,
        weights,
        scales,
        [i in kept for i in range(n)],
        {"bound": bound, "sigma": sigma, "norms": norms},
    )


def clip_and_noise(
    updates: torch.Tensor,
    num_examples: Sequence[float],
    clip_norm: float,
    noise_factor: float,
    generator: torch.Generator,
) -> DefenceResult:
    """Norm clipping with weak DP (Sun et al. 2019, Sec. 4): every update scaled to at most M (Δ_i · min(1, M/‖Δ_i‖));
    their example-weighted mean (FedAvg's); Gaussian noise of σ = λ·M added per coordinate. ``clip_norm`` = M; 0
    takes the round's median update norm (the bound then follows the honest majority's scale)."""
    norms = updates.norm(dim=1).tolist()
    bound = clip_norm if clip_norm > 0 else median_of(norms)
    scales = [min(1.0, bound / e) if e > 0 else 1.0 for e in norms]
    total = float(sum(num_examples))
    weights = [float(w) / total for w in num_examples]
    aggregate = torch.zeros(updates.shape[1], dtype=torch.float64)
    for i, row in enumerate(updates):
        aggregate += row * (scales[i] * weights[i])
    sigma = noise_factor * bound
    aggregate += gaussian(aggregate, sigma, generator)
    return DefenceResult(
        aggregate, weights, scales, [True] * len(norms), {"bound": bound, "sigma": sigma, "norms": norms}
    )


def rlr_step(mean_update: torch.Tensor, sign_agreement: torch.Tensor, threshold: float) -> torch.Tensor:
    """The robust learning rate's step (Ozdayi et al. 2021, Eq. 4): η_θ ⊙ mean update, η_θ = +1 on a coordinate where
    the clients' sign agreement |Σ_i sign(Δ_i)| is at least θ, −1 elsewhere (the server moves away from what only a
    few clients push)."""
    return torch.where(sign_agreement.abs() >= threshold, mean_update, -mean_update)


def robust_learning_rate(updates: torch.Tensor, num_examples: Sequence[float], threshold: float) -> DefenceResult:
    """RLR on the round's updates (the rows): the example-weighted mean update (FedAvg's), reversed on every coordinate
    where fewer than ``threshold`` clients agree on its sign (:func:`rlr_step`); ``info`` has the reversed share."""
    total = float(sum(num_examples))
    weights = [float(w) / total for w in num_examples]
    mean = (torch.tensor(weights, dtype=updates.dtype)[:, None] * updates).sum(0)
    agreement = torch.sign(updates).sum(0)
    reversed_share = float((agreement.abs() < threshold).double().mean()) if agreement.numel() else 0.0
    n = len(weights)
    return DefenceResult(
        rlr_step(mean, agreement, threshold), weights, [1.0] * n, [True] * n, {"reversed_share": reversed_share}
    )


__all__ = [
    "DefenceResult",
    "clip_and_noise",
    "cosine_matrix",
    "cosines_to",
    "flame",
    "fltrust",
    "gaussian",
    "majority_cluster",
    "median_of",
    "rlr_step",
    "robust_learning_rate",
]
