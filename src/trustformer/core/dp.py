"""User-level differential privacy as pure functions on named tensors: clipping, Gaussian noise,
update sparsification, and the sparse wire encoding.

DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models",
Algorithm 1 with the fixed-denominator estimator f_f): every client's update Δ_k = W_k − W_global
is clipped to L2 norm C; the server adds N(0, σ²C² I) to the sum and divides by the expected number
of participants qN. One such release is a sampled Gaussian mechanism with sensitivity C.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Mapping, Sequence

import torch

Tensors = dict[str, torch.Tensor]


def global_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """‖Δ‖₂ over all tensors together (float64)."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors.values()))


def clip_factor(norm: float, clip_norm: float) -> float:
    """min(1, C / ‖Δ‖) (McMahan et al. 2018, Alg. 1, ClipFn with flat clipping)."""
    if norm <= clip_norm or norm == 0.0:
        return 1.0
    return clip_norm / norm


def clip_by_global_norm(tensors: Mapping[str, torch.Tensor], clip_norm: float) -> tuple[Tensors, float]:
    """Δ · min(1, C/‖Δ‖) over all tensors together; returns the clipped tensors and ‖Δ‖ before clipping.

    The scaling is done in float64, so ‖clipped‖ ≤ C up to the rounding of the result's dtype.
    """
    norm = global_norm(tensors)
    factor = clip_factor(norm, clip_norm)
    if factor == 1.0:
        return {n: t.detach().clone() for n, t in tensors.items()}, norm
    return {n: (t.detach().double() * factor).to(t.dtype) for n, t in tensors.items()}, norm


NOISE_SOURCES = ("os", "seeded-not-private")  # privacy.noise_source


def poisson_sample(candidates: Sequence[int], rate: float, rng: random.Random) -> list[int]:
    """Poisson sampling of clients (McMahan et al. 2018, Alg. 1): each candidate independently with probability
    ``rate``, drawn in sorted order from ``rng``; every candidate, in the given order, when ``rate`` ≥ 1."""
    if rate >= 1.0:
        return list(candidates)
    return [c for c in sorted(candidates) if rng.random() < rate]


def os_seed() -> int:
    """63 bits from the operating system's randomness (``secrets``): a seed nobody can recompute."""
    return secrets.randbits(63)


def noise_generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator for the noise of one release.

    ``seed=None`` (what the DP baselines use unless ``privacy.noise_source = "seeded-not-private"``):
    seeded from the operating system's randomness, so neither a client nor anyone who knows the run
    seed can regenerate the noise and subtract it. An explicit ``seed`` makes the noise reproducible
    — and recomputable by everyone who knows the seed, hence not private.
    """
    return torch.Generator().manual_seed(os_seed() if seed is None else int(seed))


def gaussian_noise(shape: Sequence[int] | torch.Size, std: float, generator: torch.Generator) -> torch.Tensor:
    """Samples of N(0, std²), float64."""
    noise = torch.randn(tuple(shape), generator=generator, dtype=torch.float64)
    return noise.mul_(std) if std != 1.0 else noise


def noised_mean(
    updates: Sequence[Mapping[str, torch.Tensor]],
    *,
    clip_norm: float,
    noise_multiplier: float,
    denominator: float,
    generator: torch.Generator,
) -> Tensors:
    """(Σ_k clip(Δ_k) + N(0, σ²C² I)) / denominator (McMahan et al. 2018, Alg. 1, server side).

    Every update is clipped again here (a no-op for an honest client), so the sensitivity of the
    sum is C whatever the clients did. ``denominator`` is the fixed qN of the estimator f_f, not the
    number of updates received. Noise is drawn tensor by tensor in the order of the first update.
    """
    if not updates:
        raise ValueError("noised_mean needs at least one update")
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    names = list(updates[0])
    std = noise_multiplier * clip_norm
    sums = {n: torch.zeros(updates[0][n].shape, dtype=torch.float64) for n in names}
    for i, update in enumerate(updates):
        if list(update) != names:
            raise ValueError(f"update {i} has tensor names {sorted(update)} instead of {sorted(names)}")
        factor = clip_factor(global_norm(update), clip_norm)
        for n in names:
            if update[n].shape != sums[n].shape:
                raise ValueError(
                    f"update {i}: tensor {n!r} has shape {tuple(update[n].shape)}, expected {tuple(sums[n].shape)}"
                )
            sums[n] += update[n].detach().double() * factor
    out: Tensors = {}
    for n in names:
        total = sums[n]
        if std > 0:
            total = total + gaussian_noise(total.shape, std, generator)
        out[n] = (total / denominator).to(updates[0][n].dtype)
    return out


# ----------------------------------------------------------------------- flat views and sparsity


def flatten(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """All tensors as one flat vector, in the mapping's order."""
    return torch.cat([t.detach().reshape(-1) for t in tensors.values()])


def unflatten(flat: torch.Tensor, like: Mapping[str, torch.Tensor]) -> Tensors:
    """Inverse of :func:`flatten`: cut ``flat`` into tensors shaped (and typed) like ``like``."""
    total = sum(t.numel() for t in like.values())
    if flat.numel() != total:
        raise ValueError(f"flat vector has {flat.numel()} values, the tensors hold {total}")
    out: Tensors = {}
    offset = 0
    for name, t in like.items():
        out[name] = flat[offset : offset + t.numel()].reshape(t.shape).to(t.dtype).clone()
        offset += t.numel()
    return out


def keep_count(dim: int, fraction: float) -> int:
    """How many of ``dim`` coordinates local update sparsification keeps: ceil(fraction · dim), ≥ 1."""
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return min(dim, max(1, math.ceil(fraction * dim - 1e-9)))


def top_k_sparsify(flat: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Local update sparsification (Cheng et al. 2022, LUS): keep the ``count`` coordinates of the
    update with the largest magnitude, zero the rest. Returns (sorted int64 indices, their values)."""
    if flat.dim() != 1:
        raise ValueError(f"expected a flat vector, got shape {tuple(flat.shape)}")
    if not 1 <= count <= flat.numel():
        raise ValueError(f"count must be in [1, {flat.numel()}], got {count}")
    _, indices = torch.topk(flat.detach().abs(), count, largest=True, sorted=False)
    indices, _ = torch.sort(indices)
    return indices.to(torch.int64), flat.detach()[indices].clone()


def index_dtype(dim: int) -> torch.dtype:
    """The narrowest signed integer type that holds every index of a ``dim``-vector."""
    return torch.int32 if dim <= 2**31 - 1 else torch.int64


def check_sparse(indices: torch.Tensor, values: torch.Tensor, dim: int, *, what: str = "sparse update") -> None:
    """A sparse encoding is valid: 1-D integer indices, strictly increasing, within [0, dim), one value each."""
    if indices.dim() != 1 or values.dim() != 1 or indices.numel() != values.numel():
        raise ValueError(
            f"{what}: indices {tuple(indices.shape)} and values {tuple(values.shape)} must be 1-D of the same length"
        )
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{what}: indices must be int32 or int64, got {indices.dtype}")
    if not values.dtype.is_floating_point:
        raise ValueError(f"{what}: values must be floating point, got {values.dtype}")
    if indices.numel():
        idx = indices.to(torch.int64)
        if int(idx[0]) < 0 or int(idx[-1]) >= dim:
            raise ValueError(f"{what}: indices must lie in [0, {dim})")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise ValueError(f"{what}: indices must be strictly increasing")


def sparse_noised_mean(
    updates: Sequence[tuple[torch.Tensor, torch.Tensor]],
    dim: int,
    *,
    clip_norm: float,
    noise_multiplier: float,
    denominator: float,
    generator: torch.Generator,
    noise_on: str = "kept",
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Server side of DP-BLUR-LUS: sum the clipped sparse updates, add N(0, σ²C²) and divide by qN.

    ``noise_on = "kept"``: noise on the union of the kept coordinates only, the result stays sparse
    (returns the union's sorted indices and the values there). ``"dense"``: noise on every coordinate
    of the ``dim``-vector (returns ``None`` and the dense values).
    """
    if noise_on not in ("kept", "dense"):
        raise ValueError(f"noise_on must be 'kept' or 'dense', got {noise_on!r}")
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    std = noise_multiplier * clip_norm
    all_idx, all_val = [], []
    for i, (idx, val) in enumerate(updates):
        check_sparse(idx, val, dim, what=f"update {i}")
        factor = clip_factor(math.sqrt(float(val.double().pow(2).sum())), clip_norm)
        all_idx.append(idx.to(torch.int64))
        all_val.append(val.double() * factor)
    if noise_on == "dense":
        total = torch.zeros(dim, dtype=torch.float64)
        for idx, val in zip(all_idx, all_val, strict=True):
            total.index_add_(0, idx, val)
        if std > 0:
            total += gaussian_noise((dim,), std, generator)
        return None, (total / denominator).to(torch.float32)
    if not all_idx:
        raise ValueError("sparse_noised_mean needs at least one update with noise_on = 'kept'")
    union, inverse = torch.unique(torch.cat(all_idx), sorted=True, return_inverse=True)
    total = torch.zeros(union.numel(), dtype=torch.float64)
    total.index_add_(0, inverse, torch.cat(all_val))
    if std > 0:
        total += gaussian_noise((union.numel(),), std, generator)
    return union, (total / denominator).to(torch.float32)


# ----------------------------------------------------------------------- adaptive clipping


def default_count_stddev(expected_participants: float) -> float:
    """σ_b = m / 20 for m expected participants per round (Andrew et al. 2021, "Differentially private learning
    with adaptive clipping", Sec. 3: the noise on the unclipped count they recommend)."""
    return expected_participants / 20.0


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (Andrew et al. 2021, Thm. 1): the noise multiplier of the update sum that,
    released together with the count noised by σ_b, spends what one Gaussian release at σ spends. 0 for σ = 0.

    Raises ValueError when σ⁻² ≤ (2σ_b)⁻², i.e. 2σ_b ≤ σ: the count alone would spend more than the budget.
    """
    if noise_multiplier < 0 or count_stddev < 0:
        raise ValueError(f"noise multiplier {noise_multiplier} and count stddev {count_stddev} must be >= 0")
    if noise_multiplier == 0:
        return 0.0
    if not 2.0 * count_stddev > noise_multiplier:
        raise ValueError(
            f"the count noise stddev sigma_b = {count_stddev:g} is too small for the noise multiplier "
            f"sigma = {noise_multiplier:g}: adaptive clipping needs 2 sigma_b > sigma (Andrew et al. "
            f"2021, Thm. 1), i.e. sigma_b > {noise_multiplier / 2:g}"
        )
    return (noise_multiplier**-2 - (2.0 * count_stddev) ** -2) ** -0.5


def unclipped_count(norms: Sequence[float], clip_norm: float) -> int:
    """b = #{k : ‖Δ_k‖ ≤ C} (Andrew et al. 2021, Alg. 1: the indicator b_k of an update left unclipped)."""
    return sum(1 for norm in norms if norm <= clip_norm)


def geometric_clip_update(clip_norm: float, unclipped_fraction: float, target_quantile: float, lr: float) -> float:
    """C_{t+1} = C_t · exp(−η_C (b̃ − γ)) (Andrew et al. 2021, Alg. 1, geometric update): C shrinks while more
    than the share γ of the updates stays unclipped, and grows while fewer do."""
    return clip_norm * math.exp(-lr * (unclipped_fraction - target_quantile))


__all__ = [
    "default_count_stddev",
    "update_noise_multiplier",
    "unclipped_count",
    "geometric_clip_update",
    "NOISE_SOURCES",
    "os_seed",
    "poisson_sample",
    "global_norm",
    "clip_factor",
    "clip_by_global_norm",
    "noise_generator",
    "gaussian_noise",
    "noised_mean",
    "flatten",
    "unflatten",
    "keep_count",
    "top_k_sparsify",
    "index_dtype",
    "check_sparse",
    "sparse_noised_mean",
]
