"""The printed output of ``trustformer bench kmeans``: the timing table, the per-iteration summary against the
libraries, and the real-weights figures."""

from __future__ import annotations

from typing import Any

from .kmeans_methods import Row


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


__all__ = ["per_iteration_summary", "print_rows", "print_summary", "print_weights"]
