"""Trustformer's centroid algebra (paper Algorithms 2 and 5, Eq. 3) as pure functions on tensors."""

from __future__ import annotations

import math

import torch


def layer_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """The rows a layer is clustered over (Algorithm 2): rows = first dimension as stored.

    1-D tensors (biases, LayerNorm) become r×1; tensors of 3 or more dimensions are flattened to
    ``(shape[0], -1)``. Returns a view when possible.
    """
    if tensor.dim() == 0:
        return tensor.reshape(1, 1)
    if tensor.dim() == 1:
        return tensor.reshape(-1, 1)
    return tensor.reshape(tensor.shape[0], -1)


def num_clusters(rows: int, beta: float) -> int:
    """Eq. 3: k = clamp(floor(r · β), 1, r). A tiny epsilon keeps e.g. 100 · 0.29 from flooring to 28."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta = {beta} must be in (0, 1]")
    return max(1, min(rows, math.floor(rows * beta + 1e-9)))


def estimate_global_weights(
    weights: torch.Tensor,
    labels: torch.Tensor,
    local_centroids: torch.Tensor,
    global_centroids: torch.Tensor,
) -> torch.Tensor:
    """Algorithms 4–5: every row moves by its cluster's difference, ``W[i] + (G[c(i)] − L[c(i)])``.

    ``weights`` is the r×f layer matrix, ``labels`` its r cluster memberships, ``local_centroids``
    and ``global_centroids`` k×f. Returns a new r×f matrix.
    """
    if local_centroids.shape != global_centroids.shape:
        raise ValueError(
            f"local centroids {tuple(local_centroids.shape)} and global centroids "
            f"{tuple(global_centroids.shape)} differ in shape"
        )
    if labels.shape != (weights.shape[0],):
        raise ValueError(f"{labels.shape[0]} labels for {weights.shape[0]} rows")
    diff = (global_centroids - local_centroids).to(weights.dtype)
    return weights + diff.index_select(0, labels.to(torch.long))
