"""Trustformer's centroid algebra (paper Algorithms 2 and 5, Eq. 3) as pure functions on tensors."""

from __future__ import annotations

import math

import torch

from ..errors import TrustformerError


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


def num_clusters(rows: int, beta: float, min_rows: int = 1) -> int:
    """Eq. 3 under a privacy floor of ``min_rows`` = m rows per centroid:
    k = clamp(floor(r · β), 1, floor(r / m)), and 0 when r < m (the tensor cannot leave the client).
    With m = 1 this is the paper's clamp(floor(r · β), 1, r). A tiny epsilon keeps e.g. 100 · 0.29
    from flooring to 28."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta = {beta} must be in (0, 1]")
    if min_rows < 1:
        raise ValueError(f"min_rows = {min_rows} must be at least 1")
    if rows < min_rows:
        return 0
    return max(1, min(rows // min_rows, math.floor(rows * beta + 1e-9)))


def cluster_means(x: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k×f means of the rows of ``x`` over their memberships, and the k cluster sizes.
    An empty cluster's mean is 0 (a payload is never built from one: see :func:`check_floor`)."""
    counts = torch.bincount(labels, minlength=k)
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
    sums.index_add_(0, labels.to(x.device), x)
    return sums / counts.clamp_min(1).unsqueeze(1).to(x.dtype), counts


def check_floor(counts: torch.Tensor, min_rows: int, name: str) -> None:
    """Raise if any centroid of layer ``name`` would be the mean of fewer than ``min_rows`` rows."""
    smallest = int(counts.min()) if counts.numel() else min_rows
    if smallest < min_rows:
        raise FloorError(
            f"layer {name!r}: a centroid is the mean of {smallest} row(s), below "
            f"trustformer.min_cluster_rows = {min_rows}; the payload is not sent"
        )


class FloorError(TrustformerError, RuntimeError):
    """A client was about to send a centroid of fewer rows than ``trustformer.min_cluster_rows``."""


def _principal_order(x: torch.Tensor, iterations: int = 8) -> torch.Tensor:
    """Rows of ``x`` ordered along their first principal direction (power iteration from the
    direction of the row farthest from the mean; deterministic). One column: ordered by value."""
    if x.shape[1] == 1:
        return torch.argsort(x[:, 0], stable=True)
    xc = x - x.mean(0, keepdim=True)
    v = xc[int(xc.pow(2).sum(1).argmax())].clone()
    for _ in range(iterations):
        w = xc.T @ (xc @ v)
        norm = w.norm()
        if not norm > 0:
            break
        v = w / norm
    return torch.argsort(xc @ v, stable=True)


def balanced_partition(x: torch.Tensor, k: int) -> torch.Tensor:
    """Memberships of ``x``'s r rows in k clusters of ⌊r/k⌋ or ⌈r/k⌉ rows each (so every cluster
    holds at least m rows whenever k ≤ r/m): recursive splits along the principal direction, the
    split sizes proportional to the clusters on each side."""
    r = x.shape[0]
    if not 1 <= k <= r:
        raise ValueError(f"need 1 <= k <= r, got k={k}, r={r}")
    labels = torch.empty(r, dtype=torch.int64)
    stack = [(torch.arange(r), k, 0)]
    while stack:
        rows, kk, first = stack.pop()
        if kk == 1:
            labels[rows] = first
            continue
        left = kk // 2
        cut = round(rows.numel() * left / kk)
        order = rows[_principal_order(x.index_select(0, rows))]
        stack.append((order[:cut], left, first))
        stack.append((order[cut:], kk - left, first + left))
    return labels


def random_partition(r: int, k: int, seed: int) -> torch.Tensor:
    """Memberships of r rows in k clusters of ⌊r/k⌋ or ⌈r/k⌉ rows, uniformly at random from ``seed``."""
    if not 1 <= k <= r:
        raise ValueError(f"need 1 <= k <= r, got k={k}, r={r}")
    perm = torch.randperm(r, generator=torch.Generator().manual_seed(int(seed)))
    labels = torch.empty(r, dtype=torch.int64)
    labels[perm] = torch.arange(r) % k
    return labels


def enforce_min_rows(x: torch.Tensor, labels: torch.Tensor, k: int, min_rows: int) -> torch.Tensor:
    """Repair memberships (e.g. k-means') so that each of the k clusters holds ≥ ``min_rows`` rows.

    Clusters that already do keep their rows, except the rows farthest from their mean beyond the
    floor when more rows are needed; the rows of the clusters below the floor (and those taken) are
    re-split by :func:`balanced_partition` into the missing clusters. Requires k·m ≤ r."""
    r = x.shape[0]
    if k * min_rows > r:
        raise ValueError(f"{k} clusters of at least {min_rows} rows need {k * min_rows} rows, the layer has {r}")
    counts = torch.bincount(labels, minlength=k)
    short = counts < min_rows
    if not bool(short.any()):
        return labels
    labels = labels.clone()
    pool = short[labels]
    missing = int(short.sum()) * min_rows - int(pool.sum())
    if missing > 0:  # take the rows farthest from their mean, never below the floor of their cluster
        means, _ = cluster_means(x, labels, k)
        dist = (x - means.index_select(0, labels)).pow(2).sum(1)
        order = torch.argsort(dist, descending=True, stable=True)
        spare = (counts - min_rows).clamp_min(0)
        taken = torch.zeros(k, dtype=torch.int64)
        chosen = []
        for row in order.tolist():
            c = int(labels[row])
            if short[c] or taken[c] >= spare[c]:
                continue
            taken[c] += 1
            chosen.append(row)
            if len(chosen) == missing:
                break
        pool[torch.tensor(chosen, dtype=torch.int64)] = True
    rows = pool.nonzero()[:, 0]
    targets = short.nonzero()[:, 0]
    labels[rows] = targets[balanced_partition(x.index_select(0, rows), targets.numel())]
    return labels


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
