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
import os
import platform
from dataclasses import asdict
from typing import Any

import torch

from .kmeans_cases import (
    alignment_case,
    big_case,
    drift_sweep_case,
    load_state,
    memory_case,
    synthetic_cases,
    weights_case,
)
from .kmeans_methods import close_faiss_pool, have, matmul_gflops
from .kmeans_report import per_iteration_summary, print_rows, print_summary, print_weights


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
        if have(module):
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


__all__ = ["load_state", "main", "parse_args"]


if __name__ == "__main__":
    raise SystemExit(main())
