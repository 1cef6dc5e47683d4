"""Lloyd's iterations of the k-means engine (module docstring of ``kmeans.py``): memory-bounded E-steps over
distance blocks on a pool of single-threaded workers, M-steps by index_add_, the stopping rules, and the block
sizes and memory bound they work within."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

#: Bytes of one distance block (row chunk × centroid tile) on CPU; 2048×1024 fp32 = 8 MB measured fastest.
CPU_BLOCK_BYTES = 8 << 20
#: Bytes of one distance block on an accelerator (bigger blocks keep it busy).
ACCEL_BLOCK_BYTES = 256 << 20
#: Centroids at or below this count are compared in one tile; above it, tiles of TILE centroids.
UNTILED_MAX_K = 2048
TILE = 1024
#: E-steps of fewer FLOP run on the calling thread (a pool hand-off costs more than it saves).
PARALLEL_MIN_FLOP = 2e7


# ----------------------------------------------------------------------------------------------
# shapes and sizes


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


def lloyd_block_bytes(device: torch.device, block_bytes: int | None) -> int:
    if block_bytes is not None:
        return int(block_bytes)
    return CPU_BLOCK_BYTES if device.type == "cpu" else ACCEL_BLOCK_BYTES


# ----------------------------------------------------------------------------------------------
# Lloyd: E-step and M-step


class SingleThreadedTorch:
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
            if SingleThreadedTorch._depth == 0:
                SingleThreadedTorch._saved = torch.get_num_threads()
                torch.set_num_threads(1)
            SingleThreadedTorch._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            SingleThreadedTorch._depth -= 1
            if SingleThreadedTorch._depth == 0:
                torch.set_num_threads(SingleThreadedTorch._saved)


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """One persistent pool per worker count (its threads start inside SingleThreadedTorch, so each
    keeps torch's intra-op threads at 1)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="kmeans")
        return _POOLS[workers]


def default_workers(device: torch.device, workers: int | None) -> int:
    if device.type != "cpu":
        return 1
    if workers is None:
        workers = torch.get_num_threads() if SingleThreadedTorch._depth == 0 else SingleThreadedTorch._saved
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
    rows, tile = block_shape(r, k, x.element_size(), lloyd_block_bytes(x.device, block_bytes))
    c_sq = (c * c).sum(1)
    labels = torch.empty(r, dtype=torch.int64, device=x.device)
    partial = torch.empty(r, dtype=x.dtype, device=x.device)
    n_workers = default_workers(x.device, workers)
    if n_workers > 1 and 2.0 * r * k * x.shape[1] >= PARALLEL_MIN_FLOP:
        rows = min(rows, -(-r // n_workers))  # at least one chunk per worker
    n_chunks = -(-r // rows)
    if n_workers == 1 or n_chunks == 1:
        _assign_span(x, c, c_sq, labels, partial, (0, r), rows, tile, exclude_self)
        return labels, partial
    # a few spans per worker so that a worker slowed by a competing process takes fewer of them
    per = max(1, n_chunks // (4 * n_workers))
    spans = [(i, min(r, i + per * rows)) for i in range(0, r, per * rows)]
    with SingleThreadedTorch():
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


def inertia_of(x: torch.Tensor, c: torch.Tensor, labels: torch.Tensor, rows: int) -> float:
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


def lloyd_iterations(
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
    rows = max(1, lloyd_block_bytes(x.device, block_bytes) // (x.element_size() * max(1, x.shape[1])))
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
    small = r * k * x.element_size() <= lloyd_block_bytes(x.device, block_bytes) and k <= UNTILED_MAX_K
    buf = torch.empty(r, k, dtype=x.dtype, device=x.device) if small else None
    for it in range(1, max_iter + 1):  # noqa: B007 (the iterations taken: returned)
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


__all__ = [
    "ACCEL_BLOCK_BYTES",
    "CPU_BLOCK_BYTES",
    "PARALLEL_MIN_FLOP",
    "TILE",
    "UNTILED_MAX_K",
    "block_shape",
    "iteration_memory_bytes",
    "lloyd_assign",
    "lloyd_update",
    "relocate_empty",
]
