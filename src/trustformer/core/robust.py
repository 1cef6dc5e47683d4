"""Robust aggregation as pure functions on named tensors: a bound on each client's update and the rules of
Flower's FedMedian, FedTrimmedAvg, Krum and MultiKrum (``flwr.server.strategy.aggregate``), mirrored on torch
tensors and checked against Flower's own functions in ``tests/test_robust.py``.

Every input is a list of payloads with the same names and shapes (one per client). Sums are taken in
float64 and cast back, as in :func:`~trustformer.core.aggregation.weighted_mean`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .aggregation import weighted_mean

Named = Mapping[str, torch.Tensor]


def _stack(payloads: Sequence[Named], name: str) -> torch.Tensor:
    return torch.stack([p[name].detach().to(torch.float64) for p in payloads])


def coordinate_median(payloads: Sequence[Named]) -> dict[str, torch.Tensor]:
    """FedMedian (Yin et al. 2018): the coordinate-wise median; with an even count, the mean of the two middle
    values (``numpy.median``, as Flower's ``aggregate_median``)."""
    if not payloads:
        raise ValueError("coordinate_median needs at least one input")
    n = len(payloads)
    out = {}
    for name, ref in payloads[0].items():
        ordered = _stack(payloads, name).sort(dim=0).values
        middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        out[name] = middle.to(ref.dtype)
    return out


def trimmed_mean(payloads: Sequence[Named], fraction: float) -> dict[str, torch.Tensor]:
    """FedTrimmedAvg (Yin et al. 2018): per coordinate, drop the ``int(fraction * n)`` smallest and largest
    values and average the rest (Flower's ``aggregate_trimmed_avg``; unweighted)."""
    if not 0.0 <= fraction < 0.5:
        raise ValueError(f"the trimmed fraction must be in [0, 0.5), got {fraction}")
    n = len(payloads)
    cut = int(fraction * n)
    out = {}
    for name, ref in payloads[0].items():
        ordered = _stack(payloads, name).sort(dim=0).values
        out[name] = ordered[cut : n - cut].mean(dim=0).to(ref.dtype)
    return out


def pairwise_sq_distances(payloads: Sequence[Named]) -> torch.Tensor:
    """n×n squared L2 distances between the payloads, all tensors flattened together (Flower's
    ``_compute_distances``)."""
    n = len(payloads)
    dist = torch.zeros((n, n), dtype=torch.float64)
    for name in payloads[0]:
        flat = _stack(payloads, name).reshape(n, -1)
        dist += torch.cdist(flat, flat).pow(2)
    return dist


def krum_scores(payloads: Sequence[Named], byzantine: int) -> list[float]:
    """Krum's score (Blanchard et al. 2017, Eq. 3): each payload's summed squared distance to its n − f − 2
    nearest others (at least 1, as in Flower)."""
    dist = pairwise_sq_distances(payloads)
    closest = max(1, len(payloads) - byzantine - 2)
    return [float(row.sort().values[1 : closest + 1].sum()) for row in dist]


def krum_select(payloads: Sequence[Named], byzantine: int, keep: int) -> list[int]:
    """The indices Krum (``keep`` = 1) or MultiKrum keeps: the ``keep`` lowest scores (ties: lower index first)."""
    scores = krum_scores(payloads, byzantine)
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return sorted(order[: max(1, keep)])


def deviation_norms(payloads: Sequence[Named], center: Named) -> list[float]:
    """The L2 norm of each payload's deviation from ``center``, over all its tensors."""
    norms = []
    for p in payloads:
        sq = sum(float((p[n].detach().to(torch.float64) - center[n].to(torch.float64)).pow(2).sum()) for n in center)
        norms.append(sq**0.5)
    return norms


def cosines_to_median(updates: Sequence[Named]) -> list[float]:
    """Each update's cosine similarity with the coordinate-wise median update (0 for a zero vector)."""
    center = coordinate_median(updates)
    center_sq = sum(float(t.to(torch.float64).pow(2).sum()) for t in center.values())
    out = []
    for u in updates:
        dot = sum(float((u[n].to(torch.float64) * center[n].to(torch.float64)).sum()) for n in center)
        u_sq = sum(float(u[n].to(torch.float64).pow(2).sum()) for n in center)
        out.append(dot / (u_sq * center_sq) ** 0.5 if u_sq > 0 and center_sq > 0 else 0.0)
    return out


def clip_to_bound(payload: Named, center: Named, norm: float, bound: float) -> dict[str, torch.Tensor]:
    """``center + (payload − center) · bound / norm``: the payload's deviation scaled down to the bound
    (the norm bounding of Sun et al. 2019, around a robust center)."""
    scale = bound / norm
    return {
        n: (center[n].to(torch.float64) + (t.detach().to(torch.float64) - center[n].to(torch.float64)) * scale).to(
            t.dtype
        )
        for n, t in payload.items()
    }


def bounded(
    payloads: Sequence[Named], bound: float, center: Named | None = None
) -> tuple[list[Named], list[float], dict[str, torch.Tensor]]:
    """Every payload whose deviation from ``center`` (default: the coordinate-wise median) is longer than
    ``bound`` clipped to it; the others are returned as they are (the same objects). Returns (payloads,
    deviation norms, center)."""
    center = dict(center) if center is not None else coordinate_median(payloads)
    norms = deviation_norms(payloads, center)
    out = [
        clip_to_bound(p, center, norm, bound) if norm > bound else p for p, norm in zip(payloads, norms, strict=True)
    ]
    return out, norms, center


def median_bound(norms: Sequence[float], factor: float) -> float:
    """``factor`` × the median deviation norm of the round (the mean of the middle two for an even count)."""
    ordered = sorted(norms)
    n = len(ordered)
    middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return factor * middle


def multikrum_mean(
    payloads: Sequence[Named], num_examples: Sequence[float], byzantine: int, keep: int
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """MultiKrum (El Mhamdi et al. 2018): the example-weighted mean of the ``keep`` payloads with the lowest
    Krum scores (Flower's ``aggregate_krum`` with ``to_keep``); keep = 1 is Krum itself."""
    chosen = krum_select(payloads, byzantine, keep)
    if len(chosen) == 1:
        return {n: t.detach().clone() for n, t in payloads[chosen[0]].items()}, chosen
    return weighted_mean([payloads[i] for i in chosen], [float(num_examples[i]) for i in chosen]), chosen


__all__ = [
    "bounded",
    "clip_to_bound",
    "coordinate_median",
    "cosines_to_median",
    "deviation_norms",
    "krum_scores",
    "krum_select",
    "median_bound",
    "multikrum_mean",
    "pairwise_sq_distances",
    "trimmed_mean",
]
