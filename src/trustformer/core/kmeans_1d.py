"""Exact 1-D k-means (the f == 1 path of ``kmeans.py``: biases, LayerNorm), rank-aligned to the init.

``kmeans_1d_batch`` clusters several value vectors of one length r at once: dynamic programming over
the sorted values (a Knuth window from the previous layer, or divide and conquer over positions,
vectorised over the problems), or, when the DP's estimated time per problem exceeds
``DP1D_MAX_SECONDS`` (a vocabulary-sized bias), greedy Ward merging of sorted neighbours followed by
sorted Lloyd steps. The q-th smallest centroid sits at the index of the q-th smallest init value.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import torch

__all__ = ["DP1D_MAX_SECONDS", "kmeans_1d", "kmeans_1d_batch"]

#: Estimated seconds per problem under which the exact 1-D dynamic program is used.
DP1D_MAX_SECONDS = 0.05


def _dp1d_seconds(r: int, k: int) -> float:
    """Rough CPU time of _dp1d_sorted for one problem: ~30 µs per layer plus ~50 ns per candidate,
    with ≈ m·k + m²/2·(ln k + 1) candidates (m = r − k + 1); calibrated on the 2-core machine."""
    m = r - k + 1
    return 3e-5 * k + 5e-8 * (m * k + 0.5 * m * m * (math.log(max(k, 1)) + 1.0))


def _seg_argmin(val: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum of each consecutive segment of val and the position of its first occurrence."""
    total = val.shape[0]
    seg_min = np.minimum.reduceat(val, starts)
    pos = np.arange(total)
    first = np.minimum.reduceat(np.where(val == np.repeat(seg_min, lengths), pos, total), starts)
    return seg_min, first


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Concatenation of the integer ranges [lo_s, hi_s]: (values, owner segment, starts, lengths)."""
    lengths = hi - lo + 1
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    total = int(starts[-1] + lengths[-1])
    owner = np.repeat(np.arange(lengths.shape[0]), lengths)
    return np.arange(total) - (starts - lo)[owner], owner, starts, lengths


def _dp1d_sorted(s: np.ndarray, k: int) -> np.ndarray:
    """Exact 1-D k-means of each row of s (B×r, rows sorted): start index of each of the k clusters (B×k).

    D_q(i) = min_j D_{q−1}(j−1) + SSE(s_j..s_i), j the start of the last cluster. Only i ∈ [q−1, q−1+m),
    m = r − k + 1, is needed at layer q. The optimal start opt_q(i) is monotone (SSE satisfies the
    quadrangle inequality; lowest argmins kept): opt_{q−1}(i) ≤ opt_q(i) ≤ opt_q(i+1). A layer scans the
    window [max(opt_{q−1}(i), q−1), i] for all i at once (Knuth) when those windows are short, else it
    bisects over i (divide and conquer, O(m log m)) inside the same lower bound. The B problems share
    every vectorised step.
    """
    s = np.atleast_2d(s)
    nb, r = s.shape
    s = s.astype(np.float64) - s.mean(1, keepdims=True)
    zero = np.zeros((nb, 1))
    p = np.concatenate((zero, np.cumsum(s, 1)), 1).ravel()
    p2 = np.concatenate((zero, np.cumsum(s * s, 1)), 1).ravel()
    m = r - k + 1
    t = np.tile(np.arange(m), nb)  # flat (b, t)
    row = np.repeat(np.arange(nb), m)
    dc_cost = 4 * nb * m * max(1, math.ceil(math.log2(m + 1)))

    def sse(j: np.ndarray, i: np.ndarray, b: np.ndarray) -> np.ndarray:
        off = b * (r + 1)
        n = (i - j + 1).astype(np.float64)
        a = p[off + i + 1] - p[off + j]
        return np.maximum(p2[off + i + 1] - p2[off + j] - a * a / n, 0.0)

    d_prev = sse(np.zeros(nb * m, dtype=np.int64), t, row)
    opt_prev = np.zeros(nb * m, dtype=np.int64)
    opts = np.empty((k, nb * m), dtype=np.int32 if r < 2**31 else np.int64)
    opts[0] = 0
    nxt = np.minimum(t + 1, m - 1) + row * m
    for q in range(2, k + 1):
        lo_all = np.maximum(opt_prev[nxt], q - 1)
        if int((t + q - lo_all).sum()) <= dc_cost:
            j, owner, starts, lengths = _ranges(lo_all, t + q - 1)
            b = row[owner]
            val = d_prev[b * m + j - q + 1] + sse(j, t[owner] + q - 1, b)
            d_new, first = _seg_argmin(val, starts, lengths)
            opt_new = j[first]
        else:
            d_new = np.empty(nb * m)
            opt_new = np.empty(nb * m, dtype=np.int64)
            seg_b = np.arange(nb)
            seg_l = np.zeros(nb, dtype=np.int64)
            seg_r = np.full(nb, m - 1, dtype=np.int64)
            cand_l = np.full(nb, q - 1, dtype=np.int64)
            cand_r = np.full(nb, q - 1 + m - 1, dtype=np.int64)
            while seg_b.shape[0]:
                mid = (seg_l + seg_r) // 2
                flat = seg_b * m + mid
                lo = np.maximum(cand_l, lo_all[flat])
                hi = np.minimum(cand_r, mid + q - 1)
                j, owner, starts, lengths = _ranges(lo, hi)
                b = seg_b[owner]
                val = d_prev[b * m + j - q + 1] + sse(j, mid[owner] + q - 1, b)
                v, first = _seg_argmin(val, starts, lengths)
                o = j[first]
                d_new[flat] = v
                opt_new[flat] = o
                left = mid > seg_l
                right = mid < seg_r
                seg_b = np.concatenate((seg_b[left], seg_b[right]))
                seg_l, seg_r = (
                    np.concatenate((seg_l[left], mid[right] + 1)),
                    np.concatenate((mid[left] - 1, seg_r[right])),
                )
                cand_l, cand_r = np.concatenate((cand_l[left], o[right])), np.concatenate((o[left], cand_r[right]))
        d_prev, opt_prev = d_new, opt_new
        opts[q - 1] = opt_prev
    bounds = np.empty((nb, k), dtype=np.int64)
    i = np.full(nb, r - 1)
    for q in range(k, 0, -1):
        j = opts[q - 1, np.arange(nb) * m + i - (q - 1)].astype(np.int64)
        bounds[:, q - 1] = j
        i = j - 1
    return bounds


def _merge1d_sorted(s: np.ndarray, k: int, lloyd_steps: int = 20) -> np.ndarray:
    """Approximate 1-D k-means on sorted values: greedy Ward merging of neighbouring clusters (heap),
    then sorted Lloyd steps (boundaries at midpoints between consecutive centroids). Starts returned."""
    r = s.shape[0]
    s = s.astype(np.float64) - s.mean()
    cnt = [1] * r
    tot = s.tolist()
    nxt = list(range(1, r + 1))
    prv = list(range(-1, r - 1))
    alive = [True] * r
    ver = [0] * r

    def cost(a: int, b: int) -> float:
        ma, mb = tot[a] / cnt[a], tot[b] / cnt[b]
        return cnt[a] * cnt[b] / (cnt[a] + cnt[b]) * (ma - mb) ** 2

    heap = [(cost(a, a + 1), a, 0, 0) for a in range(r - 1)]
    heapq.heapify(heap)
    clusters = r
    while clusters > k and heap:
        _, a, va, vb = heapq.heappop(heap)
        b = nxt[a] if alive[a] else r
        if not alive[a] or b >= r or ver[a] != va or ver[b] != vb:
            continue
        cnt[a] += cnt[b]
        tot[a] += tot[b]
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[a] < r:
            prv[nxt[a]] = a
        ver[a] += 1
        clusters -= 1
        if prv[a] >= 0:
            heapq.heappush(heap, (cost(prv[a], a), prv[a], ver[prv[a]], ver[a]))
        if nxt[a] < r:
            heapq.heappush(heap, (cost(a, nxt[a]), a, ver[a], ver[nxt[a]]))
    starts = np.flatnonzero(np.array(alive))
    p = np.concatenate(([0.0], np.cumsum(s)))
    for _ in range(lloyd_steps):
        ends = np.concatenate((starts[1:], [r]))
        cen = (p[ends] - p[starts]) / (ends - starts)
        cut = np.searchsorted(s, 0.5 * (cen[:-1] + cen[1:]), side="right")
        new = np.concatenate(([0], cut))
        if np.any(np.diff(new) <= 0) or new[-1] >= r or np.array_equal(new, starts):
            break
        starts = new
    return starts


def kmeans_1d_batch(
    values: list[torch.Tensor], inits: list[torch.Tensor], *, exact_max_seconds: float = DP1D_MAX_SECONDS
) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    """1-D k-means of several value vectors of one length r, each into k = len(init) clusters.

    Exact DP (all problems in one vectorised solve) while its estimated time ≤ exact_max_seconds per
    problem, else sort-based merge + sorted Lloyd. Rank alignment: the q-th smallest centroid goes to
    the index of the q-th smallest init value (ties by index). Returns (centroids (k,), labels (r,),
    method) per problem.
    """
    r, k = values[0].shape[0], inits[0].shape[0]
    v = np.stack([t.detach().to("cpu", torch.float64).numpy() for t in values])
    order = np.argsort(v, axis=1, kind="stable")
    s = np.take_along_axis(v, order, 1)
    if _dp1d_seconds(r, k) <= exact_max_seconds:
        starts, method = _dp1d_sorted(s, k), "dp1d"
    else:
        starts, method = np.stack([_merge1d_sorted(row, k) for row in s]), "merge1d"
    out = []
    for b, (vals, init) in enumerate(zip(values, inits, strict=True)):
        st = starts[b]
        ends = np.concatenate((st[1:], [r]))
        cen_sorted = np.add.reduceat(s[b], st) / (ends - st)  # per-cluster sums: no prefix-sum rounding
        slot = np.argsort(init.detach().to("cpu", torch.float64).numpy(), kind="stable")
        cen = np.empty(k)
        cen[slot] = cen_sorted
        labels = np.empty(r, dtype=np.int64)
        labels[order[b]] = slot[np.repeat(np.arange(k), ends - st)]
        out.append(
            (
                torch.from_numpy(cen).to(vals.device, vals.dtype),
                torch.from_numpy(labels).to(vals.device),
                method,
            )
        )
    return out


def kmeans_1d(
    values: torch.Tensor, init: torch.Tensor, *, exact_max_seconds: float = DP1D_MAX_SECONDS
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """1-D k-means of r values into k = len(init) clusters, rank-aligned to init (see kmeans_1d_batch)."""
    return kmeans_1d_batch([values], [init], exact_max_seconds=exact_max_seconds)[0]
