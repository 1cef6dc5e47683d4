"""The opt-in ``method="merge"`` path of the k-means engine (module docstring of ``kmeans.py``): greedy
closest-pair merging for high β, and the matching of its clusters onto the init rows."""

from __future__ import annotations

import numpy as np
import torch

from .kmeans_lloyd import lloyd_assign


def pair_merge(x: torch.Tensor, k: int, *, block_bytes: int | None = None, workers: int | None = None) -> torch.Tensor:
    """Greedy closest-pair merging (Ward's first merges) down to k clusters, for k ≥ r/2.

    Each pass finds every free row's nearest free row, walks those edges by increasing distance and pairs
    rows that are both still free, until r − k pairs exist. Returns labels in [0, k) (pairs first, then
    singletons, both in row order) — an arbitrary numbering; `align` maps it onto the init.
    """
    r = x.shape[0]
    need = r - k
    if need < 0 or 2 * need > r:
        raise ValueError("pair_merge needs r/2 <= k <= r")
    partner = np.full(r, -1, dtype=np.int64)
    free = torch.arange(r, device=x.device)
    while need > 0:
        xf = x[free]
        nn, part = lloyd_assign(xf, xf, block_bytes=block_bytes, exclude_self=True, workers=workers)
        d = part + (xf * xf).sum(1)
        order = torch.argsort(d, stable=True).cpu().numpy()
        nn_np = nn.cpu().numpy()
        fr = free.cpu().numpy()
        taken = np.zeros(len(fr), dtype=bool)
        for a in order:
            b = nn_np[a]
            if taken[a] or taken[b]:
                continue
            taken[a] = taken[b] = True
            partner[fr[a]], partner[fr[b]] = fr[b], fr[a]
            need -= 1
            if need == 0:
                break
        free = free[torch.from_numpy(~taken).to(x.device)]
    labels = np.empty(r, dtype=np.int64)
    first = np.flatnonzero((partner >= 0) & (partner > np.arange(r)))
    labels[first] = np.arange(len(first))
    labels[partner[first]] = np.arange(len(first))
    single = np.flatnonzero(partner < 0)
    labels[single] = len(first) + np.arange(len(single))
    return torch.from_numpy(labels).to(x.device)


def align(
    cent: torch.Tensor, init: torch.Tensor, *, block_bytes: int | None = None, workers: int | None = None
) -> torch.Tensor:
    """perm with cluster perm[j] ↦ index j: greedy matching of centroids to init rows by distance.

    Each pass: every unmatched centroid proposes its nearest unmatched init row; each init row accepts the
    closest proposer (ties: lower index). Repeats on what is left.
    """
    k = init.shape[0]
    perm = torch.full((k,), -1, dtype=torch.int64, device=init.device)
    left_c = torch.arange(k, device=init.device)
    left_i = torch.arange(k, device=init.device)
    while left_c.numel() > 0:
        cc, ii = cent[left_c], init[left_i]
        near, part = lloyd_assign(cc, ii, block_bytes=block_bytes, workers=workers)
        d = part + (cc * cc).sum(1)
        order = torch.argsort(d, stable=True)
        order = order[torch.argsort(near[order], stable=True)]
        nr = near[order]
        win = torch.ones_like(nr, dtype=torch.bool)
        win[1:] = nr[1:] != nr[:-1]
        chosen_c = order[win]
        perm[left_i[nr[win]]] = left_c[chosen_c]
        keep_c = torch.ones(left_c.numel(), dtype=torch.bool, device=init.device)
        keep_c[chosen_c] = False
        keep_i = torch.ones(left_i.numel(), dtype=torch.bool, device=init.device)
        keep_i[nr[win]] = False
        left_c, left_i = left_c[keep_c], left_i[keep_i]
    return perm


__all__ = ["pair_merge"]
