"""What ``trustformer bench kmeans`` times (module docstring of :mod:`trustformer.bench.kmeans_bench`): our
k-means, scikit-learn's and faiss's (in a worker process of its own), the objective every method is scored by,
and the machine's own measures (matrix-product speed, resident memory)."""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trustformer.core.kmeans import kmeans
from trustformer.core.kmeans_lloyd import inertia_of, lloyd_assign


@dataclass
class Row:
    case: str
    phase: str  # cold | warm
    method: str
    seconds: float
    iterations: int
    inertia: float
    flop_per_iter: float
    rel_inertia: float = math.nan

    @property
    def gflops(self) -> float:
        return self.iterations * self.flop_per_iter / self.seconds / 1e9 if self.seconds > 0 else math.nan


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def num_clusters(r: int, beta: float) -> int:
    """Eq. 3: k = clamp(floor(r·β), 1, r)."""
    return max(1, min(r, math.floor(r * beta + 1e-9)))


# ------------------------------------------------------------------------------------- machine


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Median fp32 n³ matrix-product speed with torch's current thread count."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.Process().memory_info().rss)


def peak_extra_rss(fn: Callable[[], Any], interval: float = 0.001) -> tuple[int, Any]:
    """Peak resident-size increase while fn runs (sampled by a thread), and fn's result."""
    base = _rss_bytes()
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out = fn()
    finally:
        done.set()
        th.join()
    peak = max(peak, _rss_bytes())
    return peak - base, out


# ------------------------------------------------------------------------------------- methods


def have(module: str) -> bool:
    """Whether a library is installed, without importing it here (faiss must stay out of this process)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_ours(
    x: torch.Tensor,
    c0: torch.Tensor,
    *,
    max_iter: int,
    tol: float,
    label_tol: float,
    method: str = "auto",
    init_labels: torch.Tensor | None = None,
) -> tuple[float, int, torch.Tensor]:
    t = time.perf_counter()
    res = kmeans(x, c0, max_iter=max_iter, tol=tol, label_tol=label_tol, method=method, init_labels=init_labels)
    run_ours.last = res  # type: ignore[attr-defined]
    return time.perf_counter() - t, res.iterations, res.centroids


def run_sklearn(x: torch.Tensor, c0: torch.Tensor, *, max_iter: int, tol: float) -> tuple[float, int, torch.Tensor]:
    from sklearn.cluster import KMeans

    xn, cn = x.numpy(), c0.numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        km = KMeans(n_clusters=cn.shape[0], init=cn, n_init=1, max_iter=max_iter, tol=tol, algorithm="lloyd")
        km.fit(xn)
        dt = time.perf_counter() - t
    return dt, int(km.n_iter_), torch.from_numpy(np.ascontiguousarray(km.cluster_centers_, dtype=np.float32))


def _faiss_fit(
    xn: np.ndarray, cn: np.ndarray, niter: int, seed: int, threads: int, assign: bool
) -> tuple[float, np.ndarray]:
    """In the faiss worker process: faiss.Kmeans from cn for niter iterations (+ memberships), timed."""
    import faiss  # type: ignore[import-not-found]

    faiss.omp_set_num_threads(threads)
    r, f = xn.shape
    t = time.perf_counter()
    km = faiss.Kmeans(
        f,
        cn.shape[0],
        niter=niter,
        seed=seed,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=max(r, 1),
    )
    km.train(xn, init_centroids=cn)
    if assign:  # the memberships (and with them the inertia) that ours and scikit-learn return
        km.index.search(xn, 1)
    dt = time.perf_counter() - t
    return dt, np.array(km.centroids, dtype=np.float32)


_FAISS_POOL: Any = None


def _faiss_pool() -> Any:
    """One spawned worker process for every faiss call. Loading faiss (its own OpenMP OpenBLAS) into this
    process made every torch operation here 1.3–1.7× slower on the 2-core machine (A/B, alternating
    fresh processes: torch.zeros 2.1 → 2.8 µs, a 256×256·256×25 addmm 40 → 53 µs), which would bias the
    comparison against ours."""
    global _FAISS_POOL
    if _FAISS_POOL is None:
        import multiprocessing

        _FAISS_POOL = multiprocessing.get_context("spawn").Pool(1)
    return _FAISS_POOL


def close_faiss_pool() -> None:
    global _FAISS_POOL
    if _FAISS_POOL is not None:
        _FAISS_POOL.terminate()
        _FAISS_POOL.join()
        _FAISS_POOL = None


def run_faiss(
    x: torch.Tensor, c0: torch.Tensor, *, niter: int, seed: int, assign: bool = True
) -> tuple[float, int, torch.Tensor]:
    xn = np.ascontiguousarray(x.numpy(), dtype=np.float32)
    cn = np.ascontiguousarray(c0.numpy(), dtype=np.float32)
    dt, cent = _faiss_pool().apply(_faiss_fit, (xn, cn, niter, seed, torch.get_num_threads(), assign))
    return dt, niter, torch.from_numpy(cent)


def nearest_inertia(x: torch.Tensor, c: torch.Tensor) -> float:
    """The k-means objective of a centroid set: every row to its nearest centroid (float64 sum)."""
    labels, _ = lloyd_assign(x, c)
    return inertia_of(x, c, labels, 8192)


__all__ = [
    "Row",
    "close_faiss_pool",
    "log",
    "matmul_gflops",
    "nearest_inertia",
    "num_clusters",
    "peak_extra_rss",
    "run_faiss",
    "run_ours",
    "run_sklearn",
]
