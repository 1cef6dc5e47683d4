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

The engine's parts: ``kmeans_lloyd.py`` (block sizes, E-step, M-step, Lloyd's iterations), ``kmeans_merge.py``
(the opt-in merge path) and ``kmeans_1d.py`` (the exact 1-D solver); this module holds the entry points.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .centroids import layer_matrix
from .kmeans_1d import kmeans_1d, kmeans_1d_batch
from .kmeans_lloyd import (
    ACCEL_BLOCK_BYTES,
    CPU_BLOCK_BYTES,
    PARALLEL_MIN_FLOP,
    TILE,
    UNTILED_MAX_K,
    SingleThreadedTorch,
    block_shape,
    default_workers,
    inertia_of,
    iteration_memory_bytes,
    lloyd_assign,
    lloyd_block_bytes,
    lloyd_iterations,
    lloyd_update,
    relocate_empty,
)
from .kmeans_merge import align, pair_merge

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
    "ACCEL_BLOCK_BYTES",
    "CPU_BLOCK_BYTES",
    "PARALLEL_MIN_FLOP",
    "TILE",
    "UNTILED_MAX_K",
]


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
    n_workers = default_workers(x.device, workers)
    with SingleThreadedTorch() if x.device.type == "cpu" else contextlib.nullcontext():
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
    rows = max(1, lloyd_block_bytes(x.device, block_bytes) // (x.element_size() * max(1, f)))
    opts = dict(max_iter=max_iter, tol=tol, label_tol=label_tol, block_bytes=block_bytes, workers=workers, empty=empty)
    if method in ("auto", "lloyd"):
        start = c0 if init_labels is None else lloyd_update(x, init_labels, c0)
        c, labels, it, conv, hist = lloyd_iterations(x, start, c0, start_labels=init_labels, **opts)  # type: ignore[arg-type]
        return KMeansResult(c, labels, it, inertia_of(x, c, labels, rows), 0.0, "lloyd", conv, hist)
    if method == "merge":
        pl = pair_merge(x, k, block_bytes=block_bytes, workers=workers)
        pc = lloyd_update(x, pl, c0)
        perm = align(pc, c0, block_bytes=block_bytes, workers=workers)
        c, labels, it, conv, hist = lloyd_iterations(x, pc[perm], c0, **opts)  # type: ignore[arg-type]
        return KMeansResult(c, labels, it, inertia_of(x, c, labels, rows), 0.0, "merge", conv, hist)
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
    for (_rows, _k, _), names in groups.items():
        t0 = time.perf_counter()
        xs = [as_matrix(layers[n])[:, 0] for n in names]
        c0s = [inits[n].reshape(-1) for n in names]
        solved = kmeans_1d_batch(xs, c0s)
        each = (time.perf_counter() - t0) / len(names)
        for n, x, (cen, labels, m) in zip(names, xs, solved, strict=True):
            out[n] = _result_1d(x.unsqueeze(1), cen, labels, m, each, x.dtype)
    return {name: out[name] for name in layers}
