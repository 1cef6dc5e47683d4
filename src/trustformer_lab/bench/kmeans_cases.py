"""The cases of ``trustformer bench kmeans`` (module docstring of :mod:`trustformer.bench.kmeans_bench`): every
method from the same start on the paper's shapes (cold and warm), the big shape, the peak memory of one iteration,
real weights (``--weights``) with the drift sweep, and the alignment of two clients."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from trustformer.core.kmeans import KMeansResult, as_matrix, choose_initial_rows, cluster_layers, kmeans
from trustformer.core.kmeans_lloyd import iteration_memory_bytes, lloyd_update

from .kmeans_methods import (
    Row,
    log,
    nearest_inertia,
    num_clusters,
    peak_extra_rss,
    run_faiss,
    run_ours,
    run_sklearn,
)


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

        def mean_it(res: dict[str, KMeansResult], lloyd: list[str] = lloyd) -> float:
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


__all__ = [
    "alignment_case",
    "big_case",
    "compare",
    "drift_sweep_case",
    "load_state",
    "memory_case",
    "relative_drift",
    "synthetic_cases",
    "weights_case",
]
