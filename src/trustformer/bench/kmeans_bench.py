"""`trustformer bench kmeans`: our k-means against scikit-learn's Lloyd and faiss on the same matrices.

For every case (the paper's shapes at several β, and real weights with ``--weights BEFORE AFTER``)
each method starts from the same centroids, cold (k distinct rows, ``choose_initial_rows``) and warm
(on the matrix after a change, from the cold run's memberships: ours via ``init_labels``, the libraries
from the same centroids, their means). Printed side by side: seconds, iterations, seconds per
iteration, achieved GFLOP/s (one Lloyd iteration = 2·r·k·f FLOP) and its share of the machine's
measured matrix-product GFLOP/s, inertia relative to the best method of the case (every method's
centroids scored alike: each row to its nearest centroid).

Methods: ``ours`` (defaults: stops when ≤ 0.1% of labels change; warm: from the previous memberships),
``ours=sk`` (scikit-learn's stopping rule — centroid shift ≤ tol·mean variance or no label change —
from exactly the libraries' start, hence the same iterations and inertia as sklearn), ``ours-c`` (warm
from the previous centroids alone), ``ours-merge`` (``--merge``: the opt-in closest-pair merge),
``sklearn`` (``KMeans(algorithm="lloyd", n_init=1, init=C0)``, whose fit ends with the memberships and
the inertia), ``faiss`` (``faiss.Kmeans``, ``niter`` = scikit-learn's iteration count, no subsampling,
then ``index.search`` for the memberships, which ours and scikit-learn return and faiss's train does
not) and ``faiss-t`` (train alone: centroids only). The per-iteration summary divides the faster of
sklearn and faiss by ours=sk. faiss runs in a worker process of its own (loading it slowed every torch
operation of the process that held it: ``_faiss_pool``); every timing is taken inside the process that
computes. A library that is not installed (extra ``bench``) is skipped with a line saying so.

Peak memory: tracemalloc does not see torch's allocations and torch keeps no CPU allocator statistics,
so the resident set size (/proc/self/statm, else psutil) is sampled every millisecond by a thread
during one full iteration (E-step + M-step) at 250,000×256, k = 25,000, in a fresh process whose glibc
returns every block ≥ 128 KB to the system on free (MALLOC_MMAP_THRESHOLD_); the figure is the peak
minus the resident size just before, x and the initial centroids already allocated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

from trustformer.core.kmeans import (
    KMeansResult,
    _inertia,
    as_matrix,
    choose_initial_rows,
    cluster_layers,
    kmeans,
    lloyd_assign,
    iteration_memory_bytes,
    lloyd_update,
)


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


def _have(module: str) -> bool:
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
    return _inertia(x, c, labels, 8192)


# ------------------------------------------------------------------------------------- cases


def compare(
    case: str,
    x: torch.Tensor,
    c0: torch.Tensor,
    phase: str,
    args: argparse.Namespace,
    methods: list[str],
    prev_labels: torch.Tensor | None = None,
) -> tuple[list[Row], KMeansResult]:
    """Every method from the same start on x, median seconds over args.repeats.

    Cold: all from c0. Warm (prev_labels given): ours from c0 with init_labels=prev_labels, i.e. from the
    means of x over the previous memberships (empty → c0[j]); the libraries from those same centroids;
    "ours-c" from the previous centroids c0 alone. Returns the rows and ours' result.
    """
    r, f = x.shape
    k = c0.shape[0]
    flop = 2.0 * r * k * f
    rows: list[Row] = []
    results: dict[str, tuple[float, int, torch.Tensor]] = {}
    start = c0 if prev_labels is None or f == 1 else lloyd_update(x, prev_labels, c0)
    mi, tol = args.max_iter, args.tol

    def timed(name: str, fn: Callable[[], tuple[float, int, torch.Tensor]]) -> None:
        runs = [fn() for _ in range(args.repeats)]
        results[name] = (statistics.median(rr[0] for rr in runs), runs[0][1], runs[0][2])

    # ours=sk: scikit-learn's stopping rule from the libraries' own start (warm: the means over the
    # previous memberships, computed outside the timing for every method alike)
    timed("ours=sk", lambda: run_ours(x, start, max_iter=mi, tol=tol, label_tol=0.0))
    timed("ours", lambda: run_ours(x, c0, max_iter=mi, tol=tol, label_tol=1e-3, init_labels=prev_labels))
    ours = run_ours.last  # type: ignore[attr-defined]
    if prev_labels is not None and f > 1:
        timed("ours-c", lambda: run_ours(x, c0, max_iter=mi, tol=tol, label_tol=1e-3))
    if args.merge and 2 * k >= r and k < r and f > 1:
        timed("ours-merge", lambda: run_ours(x, c0, max_iter=mi, tol=tol, label_tol=1e-3, method="merge"))
    sk_iters = results["ours=sk"][1]
    if "sklearn" in methods:
        timed("sklearn", lambda: run_sklearn(x, start, max_iter=mi, tol=tol))
        sk_iters = results["sklearn"][1]
    if "faiss" in methods:
        timed("faiss", lambda: run_faiss(x, start, niter=max(1, sk_iters), seed=args.seed))
        timed("faiss-t", lambda: run_faiss(x, start, niter=max(1, sk_iters), seed=args.seed, assign=False))
    inertias = {name: nearest_inertia(x, res[2]) for name, res in results.items()}
    best = min(inertias.values())
    for name, (sec, it, _) in results.items():
        rel = inertias[name] / best if best > 0 else 1.0
        rows.append(Row(case, phase, name, sec, it, inertias[name], flop, rel))
    order = ["ours", "ours=sk", "ours-c", "ours-merge", "sklearn", "faiss", "faiss-t"]
    rows.sort(key=lambda row: order.index(row.method))
    return rows, ours


def synthetic_cases(args: argparse.Namespace, methods: list[str]) -> list[Row]:
    rows: list[Row] = []
    for r, f in args.shapes:
        for beta in args.betas:
            k = num_clusters(r, beta)
            if k >= r:
                continue
            g = torch.Generator().manual_seed(args.seed)
            x = torch.randn(r, f, generator=g)
            x2 = x + args.noise * x.std() * torch.randn(r, f, generator=g)
            c0 = x[choose_initial_rows(r, k, args.seed)].clone()
            case = f"{r}x{f} b={beta:g} k={k}"
            log(f"[kmeans bench] {case} cold")
            cold, ours = compare(case, x, c0, "cold", args, methods)
            log(f"[kmeans bench] {case} warm")
            warm, _ = compare(case, x2, ours.centroids, "warm", args, methods, prev_labels=ours.labels)
            rows += cold + warm
    return rows


def big_case(args: argparse.Namespace, methods: list[str]) -> list[Row]:
    """The paper's embedding shape at args.big_betas: fixed args.big_iters iterations for every method."""
    r, f = args.big_shape
    rows: list[Row] = []
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(r, f, generator=g)
    for beta in args.big_betas:
        k = num_clusters(r, beta)
        c0 = x[choose_initial_rows(r, k, args.seed)].clone()
        case = f"{r}x{f} b={beta:g} k={k}"
        flop = 2.0 * r * k * f
        found: dict[str, tuple[float, int, torch.Tensor]] = {}
        n = args.big_iters
        log(f"[kmeans bench] {case}: ours, {n} iterations")
        found["ours"] = run_ours(x, c0, max_iter=n, tol=0.0, label_tol=0.0)
        if "sklearn" in methods:
            log(f"[kmeans bench] {case}: sklearn, {n} iterations")
            found["sklearn"] = run_sklearn(x, c0, max_iter=n, tol=0.0)
        if "faiss" in methods:
            log(f"[kmeans bench] {case}: faiss (train only), {n} iterations")
            found["faiss-t"] = run_faiss(x, c0, niter=n, seed=args.seed, assign=False)
        log(f"[kmeans bench] {case}: scoring")
        inertias = {name: nearest_inertia(x, res[2]) for name, res in found.items()}
        best = min(inertias.values())
        for name, (sec, it, _) in found.items():
            rows.append(Row(case, "cold", name, sec, it, inertias[name], flop, inertias[name] / best))
    return rows


def _memory_worker(r: int, f: int, k: int, seed: int, threads: int) -> dict[str, Any]:
    """In a fresh interpreter: RSS growth during kmeans(max_iter=1), x and the init already allocated."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, f, generator=g)
    c0 = x[choose_initial_rows(r, k, seed)].clone()
    extra, res = peak_extra_rss(lambda: kmeans(x, c0, max_iter=1))
    return {"sampled": extra, "seconds": res.seconds}


def memory_case(args: argparse.Namespace) -> dict[str, Any]:
    """Peak extra resident memory of one full iteration (E-step + M-step) at 250,000×256, k = 25,000.

    Measured in a fresh process started with MALLOC_MMAP_THRESHOLD_=131072: glibc then serves every
    block of 128 KB or more by mmap and returns it on free, so the resident size follows live memory
    (with its default dynamic threshold, freed blocks stay in the heap and the resident size only grows).
    """
    import multiprocessing

    r, f = args.big_shape
    k = num_clusters(r, 0.1)
    log(f"[kmeans bench] memory: one iteration at {r}x{f}, k={k}, in a fresh process")
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            got = pool.apply(_memory_worker, (r, f, k, args.seed, torch.get_num_threads()))
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return {
        "shape": [r, f],
        "k": k,
        "peak_extra_mb": got["sampled"] / 2**20,
        "bound_mb": iteration_memory_bytes(r, k, f, workers=torch.get_num_threads()) / 2**20,
        "dense_distance_matrix_mb": r * k * 4 / 2**20,
        "x_mb": r * f * 4 / 2**20,
        "seconds": got["seconds"],
        "method": "fresh process, MALLOC_MMAP_THRESHOLD_=131072; RSS sampled every 1 ms during "
        "kmeans(max_iter=1) minus RSS before (x and init allocated)",
    }


def load_state(path: str) -> dict[str, torch.Tensor]:
    """A model state dict from a file: a plain state dict, or a client snapshot of a disk-store run
    (``r<round>-trained.pt``, whose model sits under "model")."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not any(torch.is_tensor(t) and t.is_floating_point() for t in state.values()):
        raise SystemExit(
            f"trustformer bench kmeans: {path} holds no floating-point tensors (expected a model "
            "state dict or a client snapshot r<round>-trained.pt)"
        )
    return state


def relative_drift(before: torch.Tensor, after: torch.Tensor) -> float:
    """‖AFTER − BEFORE‖ / ‖BEFORE − its row mean‖: how far a round moved the rows, in units of their spread."""
    return float((after - before).norm() / (before - before.mean(0)).norm().clamp_min(1e-30))


def weights_case(args: argparse.Namespace, methods: list[str]) -> dict[str, Any]:
    """Real weights, per β: BEFORE cold from its own rows (choose_initial_rows); AFTER warm from BEFORE's
    centroids and memberships (init_labels: what a client holds between rounds), AFTER warm from the
    centroids alone, AFTER warm capped at args.warm_max_iter iterations (empty clusters kept, and
    relocated), and AFTER cold from its own rows at the same indices, all through cluster_layers; then every method
    layer by layer on the same matrices and starts (sums over the 2-D and the 1-D layers)."""
    before, after = load_state(args.weights[0]), load_state(args.weights[1])
    names = [n for n, t in before.items() if torch.is_tensor(t) and t.is_floating_point() and n in after]
    mats_b = {n: as_matrix(before[n].float()) for n in names}
    mats_a = {n: as_matrix(after[n].float()) for n in names}
    drift = {n: relative_drift(mats_b[n], mats_a[n]) for n in names if mats_b[n].shape[0] > 1}
    out: dict[str, Any] = {
        "tensors": len(names),
        "params": sum(m.numel() for m in mats_b.values()),
        "median_relative_drift": statistics.median(drift.values()),
        "betas": {},
    }
    opts = dict(max_iter=args.max_iter, tol=args.tol, seed=args.seed)

    def timed_layers(
        mats: dict[str, torch.Tensor],
        starts: dict[str, torch.Tensor],
        labels: dict[str, torch.Tensor] | None = None,
        **over: Any,
    ) -> tuple[float, dict[str, KMeansResult]]:
        t = time.perf_counter()
        res = cluster_layers(mats, starts, init_labels=labels, **{**opts, **over})  # type: ignore[arg-type]
        return time.perf_counter() - t, res

    for beta in args.betas:
        inits = {}
        for n, m in mats_b.items():
            k = num_clusters(m.shape[0], beta)
            inits[n] = m[choose_initial_rows(m.shape[0], k, args.seed)].clone()
        log(f"[kmeans bench] weights b={beta:g}: cluster_layers cold / warm / warm-centroids / cold-after")
        t_cold, cold = timed_layers(mats_b, inits)
        prev_c = {n: res.centroids for n, res in cold.items()}
        prev_l = {n: res.labels for n, res in cold.items()}
        t_warm, warm = timed_layers(mats_a, prev_c, prev_l)
        t_warm_c, warm_c = timed_layers(mats_a, prev_c)
        cap = args.warm_max_iter
        t_cap, capped = timed_layers(mats_a, prev_c, prev_l, max_iter=cap)
        t_cap_f, capped_f = timed_layers(mats_a, prev_c, prev_l, max_iter=cap, empty="farthest")
        starts_a = {
            n: mats_a[n][choose_initial_rows(m.shape[0], inits[n].shape[0], args.seed)].clone()
            for n, m in mats_a.items()
        }  # cold on AFTER: its own rows at the same indices
        t_cold_after, cold_after = timed_layers(mats_a, starts_a)
        nontrivial = [n for n in names if 1 < inits[n].shape[0] < mats_b[n].shape[0]]
        lloyd = [n for n in nontrivial if mats_b[n].shape[1] > 1]

        def mean_it(res: dict[str, KMeansResult]) -> float:
            return statistics.mean(res[n].iterations for n in lloyd) if lloyd else math.nan

        def total(res: dict[str, KMeansResult]) -> float:
            return sum(res[n].inertia for n in names)

        entry: dict[str, Any] = {
            "cluster_s": {
                "cold": t_cold,
                "warm": t_warm,
                "warm_centroids_only": t_warm_c,
                "cold_after": t_cold_after,
                "warm_capped": t_cap,
                "warm_capped_farthest": t_cap_f,
            },
            "warm_max_iter": cap,
            "lloyd_layers": len(lloyd),
            "one_d_layers": len(nontrivial) - len(lloyd),
            "mean_iter": {
                "cold": mean_it(cold),
                "warm": mean_it(warm),
                "warm_centroids_only": mean_it(warm_c),
                "cold_after": mean_it(cold_after),
                "warm_capped": mean_it(capped),
                "warm_capped_farthest": mean_it(capped_f),
            },
            "inertia": {
                "cold": total(cold),
                "warm": total(warm),
                "warm_centroids_only": total(warm_c),
                "cold_after": total(cold_after),
                "warm_capped": total(capped),
                "warm_capped_farthest": total(capped_f),
            },
            "empty_clusters": {
                "warm": sum(
                    int((torch.bincount(warm[n].labels, minlength=inits[n].shape[0]) == 0).sum()) for n in lloyd
                ),
                "warm_centroids_only": sum(
                    int((torch.bincount(warm_c[n].labels, minlength=inits[n].shape[0]) == 0).sum()) for n in lloyd
                ),
                "clusters": sum(inits[n].shape[0] for n in lloyd),
            },
            "layer_seconds_warm": {n: warm[n].seconds for n in names},
            "methods": {},
        }
        # every method on the same matrices and starts, summed over layers (2-D and 1-D kept apart)
        for phase in ("cold", "warm"):
            for group, which in (("2-D", lloyd), ("1-D", [n for n in nontrivial if n not in lloyd])):
                if not which:
                    continue
                sums: dict[str, list[float]] = {}
                for n in which:
                    log(f"[kmeans bench] weights b={beta:g} {phase} {group} {n}")
                    if phase == "cold":
                        rows, _ = compare(n, mats_b[n], inits[n], phase, _once(args), methods)
                    else:
                        rows, _ = compare(n, mats_a[n], prev_c[n], phase, _once(args), methods, prev_l[n])
                    for row in rows:
                        acc = sums.setdefault(row.method, [0.0, 0.0, 0.0, 0.0])
                        acc[0] += row.seconds
                        acc[1] += row.iterations
                        acc[2] += row.inertia
                        acc[3] += row.iterations * row.flop_per_iter
                best = min(v[2] for v in sums.values())
                entry["methods"][f"{phase} {group}"] = {
                    m: {
                        "seconds": v[0],
                        "mean_iter": v[1] / len(which),
                        "inertia": v[2],
                        "rel_inertia": v[2] / best if best > 0 else 1.0,
                        "gflops": v[3] / v[0] / 1e9 if v[0] > 0 else math.nan,
                    }
                    for m, v in sums.items()
                }
        out["betas"][f"{beta:g}"] = entry
    return out


def drift_sweep_case(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Warm against cold as the change between rounds grows: AFTER_t = BEFORE + t·(AFTER − BEFORE) for
    t in args.drift_sweep, per β, over the 2-D layers through cluster_layers — BEFORE cold from its rows,
    then AFTER_t warm from BEFORE's centroids + memberships and cold from the same rows, each with empty
    clusters kept (the protocol's setting) and relocated to the farthest rows (empty="farthest")."""
    before, after = load_state(args.weights[0]), load_state(args.weights[1])
    names = [
        n for n, t in before.items() if torch.is_tensor(t) and t.is_floating_point() and n in after and t.dim() >= 2
    ]
    mats_b = {n: as_matrix(before[n].float()) for n in names}
    opts = dict(max_iter=args.max_iter, tol=args.tol, seed=args.seed)
    out = []
    for beta in args.betas:
        inits = {
            n: m[choose_initial_rows(m.shape[0], num_clusters(m.shape[0], beta), args.seed)].clone()
            for n, m in mats_b.items()
        }
        lloyd = [n for n in names if 1 < inits[n].shape[0] < mats_b[n].shape[0]]
        if not lloyd:
            continue
        prev = cluster_layers({n: mats_b[n] for n in lloyd}, inits, **opts)  # type: ignore[arg-type]
        for t in args.drift_sweep:
            log(f"[kmeans bench] drift sweep b={beta:g} t={t:g}")
            mats_t = {n: mats_b[n] + t * (as_matrix(after[n].float()) - mats_b[n]) for n in lloyd}
            drift = statistics.median(relative_drift(mats_b[n], mats_t[n]) for n in lloyd)
            starts = {
                n: mats_t[n][choose_initial_rows(mats_t[n].shape[0], inits[n].shape[0], args.seed)].clone()
                for n in lloyd
            }
            entry: dict[str, Any] = {"beta": beta, "t": t, "median_relative_drift": drift, "layers": len(lloyd)}
            for empty in ("keep", "farthest"):
                warm = cluster_layers(
                    mats_t,
                    {n: prev[n].centroids for n in lloyd},
                    empty=empty,
                    init_labels={n: prev[n].labels for n in lloyd},
                    **opts,
                )  # type: ignore[arg-type]
                cold = cluster_layers(mats_t, starts, empty=empty, **opts)  # type: ignore[arg-type]
                entry[empty] = {
                    "warm_mean_iter": statistics.mean(warm[n].iterations for n in lloyd),
                    "cold_mean_iter": statistics.mean(cold[n].iterations for n in lloyd),
                    "warm_inertia": sum(warm[n].inertia for n in lloyd),
                    "cold_inertia": sum(cold[n].inertia for n in lloyd),
                }
            base = max(entry["keep"]["cold_inertia"], 1e-300)
            for empty in ("keep", "farthest"):
                entry[empty]["warm_over_cold_keep_inertia"] = entry[empty]["warm_inertia"] / base
                entry[empty]["cold_over_cold_keep_inertia"] = entry[empty]["cold_inertia"] / base
            out.append(entry)
    return out


def _once(args: argparse.Namespace) -> argparse.Namespace:
    a = argparse.Namespace(**vars(args))
    a.repeats = 1
    return a


def alignment_case(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Two clients = one matrix plus independent small noise, same init: fraction of rows given the
    same cluster index (Lloyd from init vs the opt-in closest-pair merge), per β ≥ 0.5."""
    r, f = args.align_rows, 256
    out = []
    for beta in [b for b in args.betas if b >= 0.5]:
        k = num_clusters(r, beta)
        if k >= r:
            continue
        g = torch.Generator().manual_seed(args.seed + 1)
        x0 = torch.randn(r, f, generator=g)
        c0 = x0[choose_initial_rows(r, k, args.seed)].clone()
        xa = x0 + args.noise * torch.randn(r, f, generator=g)
        xb = x0 + args.noise * torch.randn(r, f, generator=g)
        for method in ("lloyd", "merge"):
            log(f"[kmeans bench] alignment {r}x{f} b={beta:g} {method}")
            ra, rb = kmeans(xa, c0, method=method), kmeans(xb, c0, method=method)
            out.append(
                {
                    "beta": beta,
                    "method": method,
                    "agreement": float((ra.labels == rb.labels).double().mean()),
                    "inertia": ra.inertia,
                    "seconds": ra.seconds,
                }
            )
    return out


# ------------------------------------------------------------------------------------- output


def print_rows(rows: list[Row], mm: float) -> None:
    head = (
        f"{'case':<28} {'phase':<5} {'method':<10} {'s':>9} {'it':>4} {'s/it':>9} {'GFLOP/s':>8} {'%mm':>5} "
        f"{'inertia/best':>13}"
    )
    print(head)
    print("-" * len(head))
    last = None
    for row in rows:
        if last is not None and (row.case, row.phase) != last:
            print()
        last = (row.case, row.phase)
        per = row.seconds / max(row.iterations, 1)
        print(
            f"{row.case:<28} {row.phase:<5} {row.method:<10} {row.seconds:>9.4f} {row.iterations:>4d} "
            f"{per:>9.5f} {row.gflops:>8.1f} {100 * row.gflops / mm:>5.0f} {row.rel_inertia:>13.6f}"
        )


def per_iteration_summary(rows: list[Row]) -> list[dict[str, Any]]:
    """Per (case, phase): ours=sk's seconds per iteration against the faster of sklearn and faiss (same
    start, same iterations), their ratio (≥ 1: ours faster) and the inertia of each relative to the best."""
    out = []
    cases: dict[tuple[str, str], dict[str, Row]] = {}
    for row in rows:
        cases.setdefault((row.case, row.phase), {})[row.method] = row
    for (case, phase), by in cases.items():
        ours = by.get("ours=sk")
        libs = [by[m] for m in ("sklearn", "faiss") if m in by]
        if ours is None or not libs:
            continue
        per = lambda row: row.seconds / max(row.iterations, 1)  # noqa: E731
        fastest = min(libs, key=per)
        out.append(
            {
                "case": case,
                "phase": phase,
                "ours_s_per_it": per(ours),
                "library": fastest.method,
                "library_s_per_it": per(fastest),
                "ratio": per(fastest) / per(ours),
                "ours_rel_inertia": ours.rel_inertia,
                "library_rel_inertia": fastest.rel_inertia,
            }
        )
    return out


def print_summary(summary: list[dict[str, Any]]) -> None:
    print(
        "\nper iteration, ours=sk against the faster library (same start, same stopping rule; ratio ≥ 0.9 is "
        "the target)"
    )
    for e in summary:
        print(
            f"  {e['case']:<28} {e['phase']:<5} ours {1e3 * e['ours_s_per_it']:8.3f} ms/it, {e['library']:<7} "
            f"{1e3 * e['library_s_per_it']:8.3f} ms/it, ratio {e['ratio']:5.2f}, inertia/best ours "
            f"{e['ours_rel_inertia']:.6f} {e['library']} {e['library_rel_inertia']:.6f}"
        )


def print_weights(w: dict[str, Any], train_s: float | None) -> None:
    print(
        f"\nreal weights: {w['tensors']} tensors, {w['params']:,} parameters; median drift between the two "
        f"files ‖AFTER − BEFORE‖ / ‖BEFORE − row mean‖ = {w['median_relative_drift']:.2f}"
    )
    print(
        "  cluster_layers (all layers, one call): warm = from BEFORE's centroids + memberships (init_labels), "
        "warm-c = centroids only, cold-A = AFTER cold from its own rows at the same indices"
    )
    for beta, e in w["betas"].items():
        cs, it, ine, emp = e["cluster_s"], e["mean_iter"], e["inertia"], e["empty_clusters"]
        print(
            f"  b={beta}: seconds cold {cs['cold']:.3f} warm {cs['warm']:.3f} warm-c {cs['warm_centroids_only']:.3f} "
            f"cold-A {cs['cold_after']:.3f} | mean Lloyd iterations ({e['lloyd_layers']} 2-D layers) cold "
            f"{it['cold']:.2f} warm {it['warm']:.2f} warm-c {it['warm_centroids_only']:.2f} cold-A "
            f"{it['cold_after']:.2f} | inertia warm / cold-A {ine['warm'] / ine['cold_after']:.4f}, warm-c / cold-A "
            f"{ine['warm_centroids_only'] / ine['cold_after']:.4f} | empty clusters warm {emp['warm']}, warm-c "
            f"{emp['warm_centroids_only']} of {emp['clusters']}"
        )
        print(
            f"        warm capped at {e['warm_max_iter']} iterations: mean {it['warm_capped']:.2f}, inertia / cold-A "
            f"{ine['warm_capped'] / ine['cold_after']:.4f} ({cs['warm_capped']:.3f} s); with empty clusters "
            f"relocated (empty='farthest'): mean {it['warm_capped_farthest']:.2f}, inertia / cold-A "
            f"{ine['warm_capped_farthest'] / ine['cold_after']:.4f} ({cs['warm_capped_farthest']:.3f} s)"
        )
        if train_s:
            print(
                f"        clustering / training ({train_s:.1f} s): warm {100 * cs['warm'] / train_s:.2f}%, "
                f"cold {100 * cs['cold'] / train_s:.2f}%"
            )
        for key, per in e["methods"].items():
            line = ", ".join(
                f"{m} {v['seconds']:.3f}s it {v['mean_iter']:.1f} "
                + (f"{v['gflops']:.0f}GF/s " if key.endswith("2-D") else "")
                + f"inertia/best {v['rel_inertia']:.4f}"
                for m, v in per.items()
            )
            print(f"    {key}: {line}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trustformer bench kmeans",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="skip the 250,000×256 timings (the memory case still runs)")
    p.add_argument("--betas", default="0.1,0.5,0.9", help="comma-separated β values (default 0.1,0.5,0.9)")
    p.add_argument("--big-betas", default="0.1", help="β values for 250,000×256 (default 0.1)")
    p.add_argument("--big-iters", type=int, default=2, help="iterations per method at 250,000×256 (default 2)")
    p.add_argument(
        "--shapes",
        default="512x256,256x512,256x256",
        help="RxF shapes timed at every β, cold and warm (default: the paper's small ones; '' = none)",
    )
    p.add_argument(
        "--big-rows",
        type=int,
        default=250_000,
        help="rows of the big shape, ×256 (default 250000; 0 = skip its timings and memory case)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument(
        "--weights",
        nargs=2,
        metavar=("BEFORE.pt", "AFTER.pt"),
        help="two state_dict files of one model saved at two consecutive rounds",
    )
    p.add_argument(
        "--drift-sweep",
        default="0.1,0.25,0.5,1",
        help="with --weights: fractions t of the change between the two files to time warm against "
        "cold at (default 0.1,0.25,0.5,1; '' = skip)",
    )
    p.add_argument(
        "--warm-max-iter",
        type=int,
        default=3,
        help="with --weights: also run the warm start capped at this many iterations (default 3)",
    )
    p.add_argument(
        "--train-seconds",
        type=float,
        default=None,
        help="local training time of one round, to print clustering as a share of it",
    )
    p.add_argument("--methods", default="ours,sklearn,faiss", help="comparison libraries to run")
    p.add_argument("--merge", action="store_true", help="also time the opt-in closest-pair merge (β ≥ 0.5)")
    p.add_argument("--align-rows", type=int, default=4000, help="rows of the alignment check (0 = skip)")
    p.add_argument("--max-iter", type=int, default=50)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--noise", type=float, default=0.01, help="warm-start perturbation, in data std (default 0.01)")
    p.add_argument("--repeats", type=int, default=3, help="timing repeats, median reported (default 3)")
    p.add_argument("--threads", type=int, default=0, help="torch/faiss/sklearn threads (0 = torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = p.parse_args(argv)
    args.betas = [float(b) for b in args.betas.split(",") if b]
    args.drift_sweep = [float(t) for t in args.drift_sweep.split(",") if t.strip()]
    args.big_betas = [float(b) for b in args.big_betas.split(",") if b]
    args.shapes = [tuple(int(v) for v in sh.lower().split("x")) for sh in args.shapes.split(",") if sh.strip()]
    args.big_shape = (args.big_rows, 256)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    finally:
        close_faiss_pool()


def _main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    requested = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods = []
    for lib, module in (("sklearn", "sklearn"), ("faiss", "faiss")):
        if lib not in requested:
            continue
        if _have(module):
            methods.append(lib)
        else:
            print(f"{lib}: not installed, skipped (pip install 'trustformer[bench]')")
    threads = torch.get_num_threads()
    mm = matmul_gflops()
    torch.set_num_threads(1)
    mm1 = matmul_gflops()
    torch.set_num_threads(threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{threads} threads; fp32 2048³ matrix product {mm:.0f} GFLOP/s ({mm1:.0f} on 1 thread)"
    )
    report: dict[str, Any] = {
        "matmul_gflops": mm,
        "matmul_gflops_1thread": mm1,
        "threads": threads,
        "torch": torch.__version__,
        "methods": ["ours", "ours=sk"] + methods,
    }
    rows = synthetic_cases(args, methods)
    if not args.quick and args.big_rows:
        rows += big_case(args, methods)
    print_rows(rows, mm)
    report["rows"] = [dict(asdict(r), gflops=r.gflops) for r in rows]
    report["per_iteration"] = per_iteration_summary(rows)
    print_summary(report["per_iteration"])
    if args.align_rows:
        al = alignment_case(args)
        print("\nalignment (two clients = same matrix + independent noise, same init): rows with the same index")
        for a in al:
            print(
                f"  {args.align_rows}x256 b={a['beta']:g} {a['method']:<6} agreement {a['agreement']:.3f} "
                f"inertia {a['inertia']:.5g} ({a['seconds']:.2f} s)"
            )
        report["alignment"] = al
    if args.weights:
        w = weights_case(args, methods)
        print_weights(w, args.train_seconds)
        report["weights"] = w
        if args.drift_sweep:
            sweep = drift_sweep_case(args)
            print(
                "\ndrift sweep (2-D layers; AFTER_t = BEFORE + t·(AFTER − BEFORE); warm from BEFORE's centroids + "
                "memberships, cold from the same rows as BEFORE's cold run)"
            )
            print(
                "  inertia relative to the cold run with empty clusters kept (the protocol's setting); "
                "'farthest' relocates empty clusters as scikit-learn does"
            )
            for e in sweep:
                kp, fa = e["keep"], e["farthest"]
                print(
                    f"  b={e['beta']:g} t={e['t']:<5g} median drift {e['median_relative_drift']:.2f}: mean Lloyd "
                    f"iterations warm {kp['warm_mean_iter']:.2f} cold {kp['cold_mean_iter']:.2f} | farthest: warm "
                    f"{fa['warm_mean_iter']:.2f} cold {fa['cold_mean_iter']:.2f} | inertia warm "
                    f"{kp['warm_over_cold_keep_inertia']:.4f}, farthest warm {fa['warm_over_cold_keep_inertia']:.4f} "
                    f"cold {fa['cold_over_cold_keep_inertia']:.4f}"
                )
            report["drift_sweep"] = sweep
    if not args.no_memory and args.big_rows:
        mem = memory_case(args)
        print(
            f"\npeak extra memory, one iteration at {mem['shape'][0]}x{mem['shape'][1]} k={mem['k']}: "
            f"{mem['peak_extra_mb']:.1f} MB (resident size, fresh process; analytic bound {mem['bound_mb']:.0f} MB; "
            f"x itself {mem['x_mb']:.0f} MB; a dense r×k distance matrix would be "
            f"{mem['dense_distance_matrix_mb']:.0f} MB); {mem['seconds']:.1f} s"
        )
        report["memory"] = mem
    mm_end = matmul_gflops()
    print(f"matrix product at the end: {mm_end:.0f} GFLOP/s (shared machine: compare the two)")
    report["matmul_gflops_end"] = mm_end
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
