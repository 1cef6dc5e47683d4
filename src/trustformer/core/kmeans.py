"""Aligned, warm-started, memory-bounded k-means over the rows of weight tensors (SPEC §2, Algorithm 2).

``kmeans(x, init)`` clusters the r rows of x (r×f) into k = init.shape[0] clusters; cluster j
corresponds to init row j on every client that starts from the same init. ``cluster_layers`` does all
layers of a client in one call (each result carries its own seconds); ``choose_initial_rows`` gives the
round-1 rows. Paths:

- k == r: the exact trivial solution (labels = arange, centroids = a copy of x), so β = 1 is FedAvg.
- f == 1 (biases, LayerNorm): exact 1-D k-means (``kmeans_1d.py``; layers of one (r, k) share one
  solve in cluster_layers), rank-aligned: the q-th smallest centroid sits at the index of the q-th
  smallest init.
- otherwise Lloyd from init. E-step in blocks of ≤ 8 MB: row chunks × all centroids, or × tiles of
  1,024 centroids with a running minimum when k > 2,048 — never an r×k matrix; ‖c‖² − 2x·c by addmm,
  ties to the lowest index. M-step by index_add_ (a sorted index_put_ off CPU); an empty cluster takes
  its init row (``empty="farthest"``: the row farthest from its centroid, as scikit-learn does). Stop
  when Σ‖shift‖² ≤ tol · mean feature variance (scikit-learn's rule), when ≤ label_tol·r labels change
  (0.1%), or at max_iter.

Warm start: a round's clusters start from the previous global centroids; ``init_labels`` (the previous
memberships) is available but the protocol does not use it. ``method="merge"`` (greedy Ward merging) is opt-in,
since it loses the clusters' alignment across clients. The code is our own PyTorch rather than faiss or
scikit-learn for the semantics the protocol needs (cluster j stays aligned with init row j; the k == r identity;
an exact 1-D path; a warm start), for one code path on any device, and for bounded memory. The measurements
behind each of these choices (speed against both libraries, inertia, alignment, memory) are in
docs/benchmarks.md, "Clustering: design measurements".

Threads: on CPU a call sets torch's intra-op threads to 1 for its duration (restored after) and runs the
E-step on ``workers`` threads of its own (default: torch's thread count before the call).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from .centroids import layer_matrix

from .kmeans_1d import kmeans_1d, kmeans_1d_batch

__all__ = [
    "KMeansResult",
    "kmeans",
    "choose_initial_rows",
    "cluster_layers",
    "as_matrix",
    "block_shape",
    "iteration_memory_bytes",
    "lloyd_assign",
    "lloyd_update",
    "relocate_empty",
    "pair_merge",
]

#: Bytes of one distance block (row chunk × centroid tile) on CPU; 2048×1024 fp32 = 8 MB measured fastest.
CPU_BLOCK_BYTES = 8 << 20
#: Bytes of one distance block on an accelerator (bigger blocks keep it busy).
ACCEL_BLOCK_BYTES = 256 << 20
#: Centroids at or below this count are compared in one tile; above it, tiles of TILE centroids.
UNTILED_MAX_K = 2048
TILE = 1024
#: E-steps of fewer FLOP run on the calling thread (a pool hand-off costs more than it saves).
PARALLEL_MIN_FLOP = 2e7


@dataclass
class KMeansResult:
    """Outcome of clustering one matrix: cluster j corresponds to init row j."""

    centroids: torch.Tensor  # (k, f), dtype and device of x
    labels: torch.Tensor  # (r,) int64
    iterations: int
    inertia: float  # sum of squared distances of rows to their centroid
    seconds: float
    method: str = "lloyd"
    converged: bool = True
    history: list[float] = field(default_factory=list)  # E-step inertia per Lloyd iteration


# ----------------------------------------------------------------------------------------------
# shapes and sizes


as_matrix = layer_matrix  # SPEC §2 row view: ≥2-D → (shape[0], -1); 1-D → (r, 1)


def block_shape(r: int, k: int, itemsize: int, block_bytes: int) -> tuple[int, int]:
    """Row chunk and centroid tile of one distance block, rows × tile × itemsize ≤ block_bytes.

    All k centroids form one tile while k ≤ UNTILED_MAX_K; beyond, tiles of TILE centroids are scanned
    with a running minimum, so no r×k matrix ever exists.
    """
    tile = k if k <= UNTILED_MAX_K else TILE
    rows = max(1, min(r, block_bytes // (itemsize * tile)))
    return rows, tile


def iteration_memory_bytes(
    r: int, k: int, f: int, *, itemsize: int = 4, block_bytes: int = CPU_BLOCK_BYTES, workers: int = 2
) -> int:
    """Upper bound of the extra memory of one Lloyd iteration beyond x and init (the 512 MB budget).

    E-step, per worker: one rows×tile distance block and, when tiled, rows×n_tiles minima and
    indices; shared: labels (int64, this and the previous iteration), per-row minima, ‖c‖², the
    changed-label mask. M-step: sums/centroids (k×f), the previous centroids and one shift temporary
    (k×f each), counts. Chunked scans (variance, inertia): two rows×f float64 temporaries.
    """
    rows, tile = block_shape(r, k, itemsize, block_bytes)
    n_tiles = -(-k // tile)
    per_worker = rows * min(tile, k) * itemsize
    if n_tiles > 1:
        per_worker += rows * n_tiles * (itemsize + 8)
    shared = r * (2 * 8 + itemsize + 1) + k * (itemsize + 8)
    m_step = 3 * k * f * itemsize + k * f * 8
    scans = 2 * max(1, block_bytes // (itemsize * max(1, f))) * f * 8
    return workers * per_worker + shared + m_step + scans


def _block_bytes(device: torch.device, block_bytes: int | None) -> int:
    if block_bytes is not None:
        return int(block_bytes)
    return CPU_BLOCK_BYTES if device.type == "cpu" else ACCEL_BLOCK_BYTES


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def choose_initial_rows(r: int, k: int, seed: int) -> torch.Tensor:
    """k distinct row indices in increasing order, a function of (r, k, seed) only; k == r → arange(r)."""
    if not 1 <= k <= r:
        raise ValueError(f"need 1 <= k <= r, got k={k}, r={r}")
    if k == r:
        return torch.arange(r, dtype=torch.int64)
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(r, generator=g)[:k].sort().values


# ----------------------------------------------------------------------------------------------
# Lloyd: E-step and M-step


class _SingleThreadedTorch:
    """Context: torch intra-op threads = 1 while our own pool parallelises over row chunks.

    Measured on the shared 2-core machine: two torch threads splitting every matrix product fall to
    21–47 GFLOP/s when other processes compete for the cores, while one single-threaded product per
    worker over disjoint row spans (scikit-learn's scheme) keeps 73–111 GFLOP/s. Nested and concurrent
    entries share one saved setting (the last one out restores it).
    """

    _lock = threading.Lock()
    _depth = 0
    _saved = 1

    def __enter__(self) -> None:
        with self._lock:
            if _SingleThreadedTorch._depth == 0:
                _SingleThreadedTorch._saved = torch.get_num_threads()
                torch.set_num_threads(1)
            _SingleThreadedTorch._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            _SingleThreadedTorch._depth -= 1
            if _SingleThreadedTorch._depth == 0:
                torch.set_num_threads(_SingleThreadedTorch._saved)


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """One persistent pool per worker count (its threads start inside _SingleThreadedTorch, so each
    keeps torch's intra-op threads at 1)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="kmeans")
        return _POOLS[workers]


def _default_workers(device: torch.device, workers: int | None) -> int:
    if device.type != "cpu":
        return 1
    if workers is None:
        workers = torch.get_num_threads() if _SingleThreadedTorch._depth == 0 else _SingleThreadedTorch._saved
    return max(1, int(workers))


def _assign_span(
    x: torch.Tensor,
    c: torch.Tensor,
    c_sq: torch.Tensor,
    labels: torch.Tensor,
    partial: torch.Tensor,
    span: tuple[int, int],
    rows: int,
    tile: int,
    exclude_self: bool,
) -> None:
    """E-step over rows span[0]:span[1], block by block; writes labels and partial in place."""
    k = c.shape[0]
    n_tiles = -(-k // tile)
    buf = torch.empty(rows * min(tile, k), dtype=x.dtype, device=x.device)
    if n_tiles > 1:
        tile_val = torch.empty(rows, n_tiles, dtype=x.dtype, device=x.device)
        tile_idx = torch.empty(rows, n_tiles, dtype=torch.int64, device=x.device)
    for i0 in range(span[0], span[1], rows):
        i1 = min(span[1], i0 + rows)
        xb = x[i0:i1]
        nb = i1 - i0
        for t in range(n_tiles):
            j0 = t * tile
            j1 = min(k, j0 + tile)
            d = buf[: nb * (j1 - j0)].view(nb, j1 - j0)
            torch.addmm(c_sq[j0:j1], xb, c[j0:j1].T, beta=1, alpha=-2, out=d)
            if exclude_self:
                lo, hi = max(i0, j0), min(i1, j1)
                if lo < hi:
                    diag = torch.arange(lo, hi, device=x.device)
                    d[diag - i0, diag - j0] = math.inf
            if n_tiles == 1:
                torch.min(d, 1, out=(partial[i0:i1], labels[i0:i1]))
            else:
                v, ix = d.min(1)
                tile_val[:nb, t] = v
                tile_idx[:nb, t] = ix + j0
        if n_tiles > 1:
            v, which = tile_val[:nb].min(1)
            partial[i0:i1] = v
            labels[i0:i1] = tile_idx[:nb].gather(1, which[:, None])[:, 0]


def lloyd_assign(
    x: torch.Tensor,
    c: torch.Tensor,
    *,
    block_bytes: int | None = None,
    exclude_self: bool = False,
    workers: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """E-step: nearest centroid of every row, in blocks (never an r×k matrix).

    argmin_j ‖x_i − c_j‖² = argmin_j (‖c_j‖² − 2 x_i·c_j); returns (labels, partial) where
    partial_i = min_j (‖c_j‖² − 2 x_i·c_j), i.e. the squared distance minus ‖x_i‖².
    Ties go to the lowest index. With exclude_self (c is x), row i never matches itself.
    On CPU, `workers` threads (default: torch's thread count) take disjoint row spans.
    """
    r, k = x.shape[0], c.shape[0]
    rows, tile = block_shape(r, k, x.element_size(), _block_bytes(x.device, block_bytes))
    c_sq = (c * c).sum(1)
    labels = torch.empty(r, dtype=torch.int64, device=x.device)
    partial = torch.empty(r, dtype=x.dtype, device=x.device)
    n_workers = _default_workers(x.device, workers)
    if n_workers > 1 and 2.0 * r * k * x.shape[1] >= PARALLEL_MIN_FLOP:
        rows = min(rows, -(-r // n_workers))  # at least one chunk per worker
    n_chunks = -(-r // rows)
    if n_workers == 1 or n_chunks == 1:
        _assign_span(x, c, c_sq, labels, partial, (0, r), rows, tile, exclude_self)
        return labels, partial
    # a few spans per worker so that a worker slowed by a competing process takes fewer of them
    per = max(1, n_chunks // (4 * n_workers))
    spans = [(i, min(r, i + per * rows)) for i in range(0, r, per * rows)]
    with _SingleThreadedTorch():
        futures = [
            _pool(n_workers).submit(_assign_span, x, c, c_sq, labels, partial, sp, rows, tile, exclude_self)
            for sp in spans
        ]
        for fu in futures:
            fu.result()
    return labels, partial


def lloyd_update(x: torch.Tensor, labels: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """M-step: every centroid becomes the mean of its rows; an empty cluster j takes fallback[j].

    Sums use index_add_ on CPU (deterministic there) and a sorted index_put_ elsewhere (deterministic
    on CUDA, where index_add_ uses atomics).
    """
    return _m_step(x, labels, fallback)[0]


def _m_step(x: torch.Tensor, labels: torch.Tensor, fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """lloyd_update and the cluster sizes."""
    k, f = fallback.shape
    counts = torch.bincount(labels, minlength=k)
    sums = torch.zeros(k, f, dtype=x.dtype, device=x.device)
    if x.device.type == "cpu":
        sums.index_add_(0, labels, x)
    else:
        sums.index_put_((labels,), x, accumulate=True)
    if int(counts.min()) > 0:  # one scalar read; the masked copy only when some cluster is empty
        return sums.div_(counts.unsqueeze(1)), counts
    empty = counts == 0
    sums.div_(counts.clamp_min(1).unsqueeze(1))
    sums[empty] = fallback[empty]
    return sums, counts


def relocate_empty(
    x: torch.Tensor, centroids: torch.Tensor, counts: torch.Tensor, row_dist: torch.Tensor
) -> torch.Tensor:
    """scikit-learn's rule for empty clusters: the e empty clusters (in index order) move onto the e rows
    farthest from their centroid (row_dist: each row's squared distance in the last E-step; ties to the
    lower row). In place on centroids, which is returned."""
    empty = (counts == 0).nonzero()[:, 0]
    if empty.numel():
        far = torch.argsort(row_dist, descending=True, stable=True)[: empty.numel()]
        centroids[empty] = x[far]
    return centroids


def _row_sq_total(x: torch.Tensor, rows: int) -> tuple[float, float]:
    """Σ‖x_i‖² and the mean per-feature variance of x (scikit-learn's tolerance scale).

    One block (x.shape[0] ≤ rows): two dot products in x's dtype, Σx² − ‖Σ_i x_i‖²/r (a threshold and
    a constant offset of the history, ~1e-7 relative in fp32). Otherwise row chunks accumulated in
    float64.
    """
    r, f = x.shape
    if r <= rows:
        flat = x.reshape(-1)
        col = x.sum(0)
        sq, csq = float(torch.dot(flat, flat)), float(torch.dot(col, col))
        return sq, max(0.0, (sq - csq / r) / (r * f))
    s = torch.zeros(f, dtype=torch.float64, device=x.device)
    s2 = torch.zeros(f, dtype=torch.float64, device=x.device)
    for i0 in range(0, r, rows):
        xb = x[i0 : i0 + rows]
        s += xb.sum(0, dtype=torch.float64)
        s2 += xb.square().sum(0, dtype=torch.float64)
    mean = s / r
    var = (s2 / r - mean * mean).clamp_min(0)
    return float(s2.sum()), float(var.mean())


def _inertia(x: torch.Tensor, c: torch.Tensor, labels: torch.Tensor, rows: int) -> float:
    """Σ_i ‖x_i − c_{label_i}‖², directly (no cancellation). One block: a dot product of the
    differences in x's dtype; otherwise row chunks, row sums in x's dtype, their total in float64."""
    if x.shape[0] <= rows:
        d = torch.sub(x, c.index_select(0, labels)).reshape(-1)
        return float(torch.dot(d, d))
    total = 0.0
    for i0 in range(0, x.shape[0], rows):
        d = x[i0 : i0 + rows] - c[labels[i0 : i0 + rows]]
        total += float(d.square_().sum(1).sum(dtype=torch.float64))
    return total


def _lloyd(
    x: torch.Tensor,
    start: torch.Tensor,
    fallback: torch.Tensor,
    *,
    max_iter: int,
    tol: float,
    label_tol: float,
    block_bytes: int | None,
    workers: int | None,
    start_labels: torch.Tensor | None = None,
    empty: str = "keep",
) -> tuple[torch.Tensor, torch.Tensor, int, bool, list[float]]:
    """Lloyd iterations from `start`; stop when Σ‖shift‖² ≤ tol·mean variance (scikit-learn's rule),
    when no label changes, or when at most label_tol·r labels change (counted against start_labels
    in the first iteration when `start` are their means); capped at max_iter. An empty cluster takes
    fallback[j] (empty="keep") or the farthest row (empty="farthest", relocate_empty)."""
    r = x.shape[0]
    rows = max(1, _block_bytes(x.device, block_bytes) // (x.element_size() * max(1, x.shape[1])))
    sq_total, mean_var = _row_sq_total(x, rows)
    tol_abs = tol * mean_var
    c = start
    prev: torch.Tensor | None = start_labels
    labels = torch.zeros(r, dtype=torch.int64, device=x.device)
    history: list[float] = []
    converged = False
    allowed = label_tol * r  # label changes still counted as converged
    row_sq: torch.Tensor | None = None  # ‖x_i‖², computed the first time a cluster is relocated
    it = 0
    k = fallback.shape[0]
    # small problems (one distance block, one tile): the E-step inline in a reused buffer, no pool —
    # the per-iteration dispatch overhead dominates there
    small = r * k * x.element_size() <= _block_bytes(x.device, block_bytes) and k <= UNTILED_MAX_K
    buf = torch.empty(r, k, dtype=x.dtype, device=x.device) if small else None
    for it in range(1, max_iter + 1):
        if buf is not None:
            torch.addmm((c * c).sum(1), x, c.T, beta=1, alpha=-2, out=buf)
            partial, labels = buf.min(1)
        else:
            labels, partial = lloyd_assign(x, c, block_bytes=block_bytes, workers=workers)
        history.append(sq_total + float(partial.sum(dtype=torch.float64)))
        new, counts = _m_step(x, labels, fallback)
        if empty == "farthest" and int(counts.min()) == 0:
            if row_sq is None:
                row_sq = (x * x).sum(1)
            new = relocate_empty(x, new, counts, row_sq + partial)
        shift = float(torch.dist(new, c)) ** 2
        if shift <= tol_abs:
            converged = True
        elif prev is not None:  # a label count against the previous iteration (or start_labels)
            converged = torch.equal(labels, prev) if allowed < 1 else int((labels != prev).sum()) <= allowed
        c, prev = new, labels
        if converged:
            break
    return c, labels, it, converged, history


# ----------------------------------------------------------------------------------------------
# high β: greedy merge of the closest disjoint pairs, aligned to init


def pair_merge(x: torch.Tensor, k: int, *, block_bytes: int | None = None, workers: int | None = None) -> torch.Tensor:
    """Greedy closest-pair merging (Ward's first merges) down to k clusters, for k ≥ r/2.

    Each pass finds every free row's nearest free row, walks those edges by increasing distance and pairs
    rows that are both still free, until r − k pairs exist. Returns labels in [0, k) (pairs first, then
    singletons, both in row order) — an arbitrary numbering; `_align` maps it onto the init.
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


def _align(
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


# ----------------------------------------------------------------------------------------------
# public entry points


def _result_1d(
    x: torch.Tensor, cen: torch.Tensor, labels: torch.Tensor, method: str, seconds: float, out_dtype: torch.dtype
) -> KMeansResult:
    d = x[:, 0].to(torch.float64) - cen.to(torch.float64)[labels]
    return KMeansResult(
        centroids=cen.unsqueeze(1).to(out_dtype),
        labels=labels,
        iterations=1,
        inertia=float((d * d).sum()),
        seconds=seconds,
        method=method,
    )


def _identity(x: torch.Tensor, t0: float) -> KMeansResult:
    """k == r: labels = arange(r), centroids = x, zero inertia (β = 1 reproduces FedAvg exactly)."""
    return KMeansResult(
        centroids=x.detach().clone(),
        labels=torch.arange(x.shape[0], dtype=torch.int64, device=x.device),
        iterations=0,
        inertia=0.0,
        seconds=time.perf_counter() - t0,
        method="identity",
    )


def _check(x: torch.Tensor, init: torch.Tensor) -> None:
    if x.dim() != 2 or init.dim() != 2 or init.shape[1] != x.shape[1]:
        raise ValueError(f"x must be (r, f) and init (k, f); got {tuple(x.shape)} and {tuple(init.shape)}")
    if not 1 <= init.shape[0] <= x.shape[0]:
        raise ValueError(f"need 1 <= k <= r, got k={init.shape[0]}, r={x.shape[0]}")


def kmeans(
    x: torch.Tensor,
    init: torch.Tensor,
    *,
    max_iter: int = 50,
    tol: float = 1e-4,
    seed: int = 0,
    init_labels: torch.Tensor | None = None,
    label_tol: float = 1e-3,
    method: str = "auto",
    block_bytes: int | None = None,
    workers: int | None = None,
    empty: str = "keep",
) -> KMeansResult:
    """k-means of the rows of x (r×f) with k = init.shape[0]; cluster j is aligned to init row j.

    k == r: the identity solution. method "auto": f == 1 → exact 1-D DP (sort-based merge when the DP
    would be slow), rank-aligned to init; otherwise Lloyd from init. "lloyd" and "1d" force a path;
    "merge" (k ≥ r/2) is the closest-pair merge matched onto init, opt-in because it is not
    alignment-safe (module docstring).
    init_labels: the rows' previous memberships (warm start across rounds): Lloyd then starts from the
    means of x over them, an empty one taking init[j] — i.e. the previous global centroid moved by the
    local drift of its rows — and counts label changes against them from the first iteration.
    Stopping: Σ‖centroid shift‖² ≤ tol · mean feature variance, ≤ label_tol·r labels changed, or
    max_iter. block_bytes: one distance block (default 8 MB on CPU). workers: CPU threads (default:
    torch's). seed: every path is deterministic given its inputs; kept for API stability.
    empty: what an empty cluster j becomes in a Lloyd M-step — "keep" (init[j]: the alignment-safe
    default the protocol uses) or "farthest" (scikit-learn's relocation onto the rows farthest from
    their centroids: lower inertia, above all from warm starts, but cluster j then no longer follows
    init[j] on every client).
    """
    t0 = time.perf_counter()
    _check(x, init)
    if empty not in ("keep", "farthest"):
        raise ValueError(f"empty must be 'keep' or 'farthest', got {empty!r}")
    r, f = x.shape
    k = init.shape[0]
    if k == r:
        return _identity(x, t0)
    xc = x.detach().to(_compute_dtype(x.dtype))
    c0 = init.detach().to(xc.device, xc.dtype)
    if f == 1 and method in ("auto", "1d"):
        cen, labels, m = kmeans_1d(xc[:, 0], c0[:, 0])
        return _result_1d(xc, cen, labels, m, time.perf_counter() - t0, x.dtype)
    if init_labels is not None:
        init_labels = init_labels.detach().to(xc.device, torch.int64).reshape(-1)
        if init_labels.shape[0] != r or int(init_labels.min()) < 0 or int(init_labels.max()) >= k:
            raise ValueError(f"init_labels must be {r} cluster indices in [0, {k})")
    n_workers = _default_workers(x.device, workers)
    with _SingleThreadedTorch() if x.device.type == "cpu" else contextlib.nullcontext():
        best = _kmeans_nd(xc, c0, init_labels, max_iter, tol, label_tol, method, block_bytes, n_workers, empty)
    best.centroids = best.centroids.to(x.dtype)
    best.seconds = time.perf_counter() - t0
    return best


def _kmeans_nd(
    x: torch.Tensor,
    c0: torch.Tensor,
    init_labels: torch.Tensor | None,
    max_iter: int,
    tol: float,
    label_tol: float,
    method: str,
    block_bytes: int | None,
    workers: int,
    empty: str = "keep",
) -> KMeansResult:
    """Lloyd from init or from init_labels' means ("auto", "lloyd"), or the closest-pair merge matched
    onto init ("merge", opt-in: lower inertia at high β, but it breaks cross-client alignment)."""
    r, f = x.shape
    k = c0.shape[0]
    rows = max(1, _block_bytes(x.device, block_bytes) // (x.element_size() * max(1, f)))
    opts = dict(max_iter=max_iter, tol=tol, label_tol=label_tol, block_bytes=block_bytes, workers=workers, empty=empty)
    if method in ("auto", "lloyd"):
        start = c0 if init_labels is None else lloyd_update(x, init_labels, c0)
        c, labels, it, conv, hist = _lloyd(x, start, c0, start_labels=init_labels, **opts)  # type: ignore[arg-type]
        return KMeansResult(c, labels, it, _inertia(x, c, labels, rows), 0.0, "lloyd", conv, hist)
    if method == "merge":
        pl = pair_merge(x, k, block_bytes=block_bytes, workers=workers)
        pc = lloyd_update(x, pl, c0)
        perm = _align(pc, c0, block_bytes=block_bytes, workers=workers)
        c, labels, it, conv, hist = _lloyd(x, pc[perm], c0, **opts)  # type: ignore[arg-type]
        return KMeansResult(c, labels, it, _inertia(x, c, labels, rows), 0.0, "merge", conv, hist)
    raise ValueError(f"unknown method {method!r}")


def cluster_layers(
    layers: Mapping[str, torch.Tensor],
    inits: Mapping[str, torch.Tensor],
    *,
    max_iter: int = 50,
    tol: float = 1e-4,
    seed: int = 0,
    init_labels: Mapping[str, torch.Tensor] | None = None,
    **options: object,
) -> dict[str, KMeansResult]:
    """Algorithm 2 for one client: k-means of every layer's row view (as_matrix) from inits[name]
    ((k, f), or (k,) for a 1-D layer); each result's seconds is that layer's own time.

    1-D layers of equal (r, k) solved by the exact DP share one vectorised solve (their seconds are the
    group's time divided evenly); the rest go through kmeans one by one.
    """
    out: dict[str, KMeansResult] = {}
    groups: dict[tuple[int, int, torch.device], list[str]] = {}
    method = options.get("method", "auto")
    for name, w in layers.items():
        x = as_matrix(w)
        c0 = inits[name]
        c0 = c0.reshape(-1, 1) if c0.dim() <= 1 else c0.reshape(c0.shape[0], -1)
        r, k = x.shape[0], c0.shape[0]
        if x.shape[1] == 1 and method in ("auto", "1d") and 1 <= k < r:
            groups.setdefault((r, k, x.device), []).append(name)
            continue
        labels = None if init_labels is None else init_labels.get(name)
        out[name] = kmeans(
            x,
            c0,
            max_iter=max_iter,
            tol=tol,
            seed=seed,
            init_labels=labels,
            **options,  # type: ignore[arg-type]
        )
    for (r, k, _), names in groups.items():
        t0 = time.perf_counter()
        xs = [as_matrix(layers[n])[:, 0] for n in names]
        c0s = [inits[n].reshape(-1) for n in names]
        solved = kmeans_1d_batch(xs, c0s)
        each = (time.perf_counter() - t0) / len(names)
        for n, x, (cen, labels, m) in zip(names, xs, solved):
            out[n] = _result_1d(x.unsqueeze(1), cen, labels, m, each, x.dtype)
    return {name: out[name] for name in layers}
