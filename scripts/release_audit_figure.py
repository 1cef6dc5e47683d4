"""The release audit's figure (docs/bench/release-audit.png) from the JSON of scripts/release_audit_plants.py: left,
honest runs, ε_lb against the ceiling (the ideal mechanism's ε_lb at the same σ, q, T and canaries) and against ε;
right, each planted bug's ε_lb against its true ε, marked by whether the conformance failed it.

    python scripts/release_audit_figure.py docs/bench/release-audit-honest.json docs/bench/release-audit-plants.json \
        --out docs/bench/release-audit.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("honest")
    parser.add_argument("plants")
    parser.add_argument("--out", default="docs/bench/release-audit.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    honest = json.loads(Path(args.honest).read_text(encoding="utf-8"))
    plants = json.loads(Path(args.plants).read_text(encoding="utf-8"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"{r['setting']}\nε = {r['epsilon']:.0f}" for r in honest]
    x = range(len(honest))
    means = [sum(r["epsilon_lb"]) / len(r["epsilon_lb"]) for r in honest]
    low = [m - min(r["epsilon_lb"]) for m, r in zip(means, honest)]
    high = [max(r["epsilon_lb"]) - m for m, r in zip(means, honest)]
    left.bar([i - 0.2 for i in x], [r["epsilon"] for r in honest], 0.2, label="ε reported", color="#bbbbbb")
    left.bar(x, [r["ceiling"] for r in honest], 0.2, label="ceiling (ideal mechanism)", color="#8fb3d9")
    left.bar([i + 0.2 for i in x], means, 0.2, yerr=[low, high], label="ε_lb (mean, range)", color="#2b6cb0")
    left.set_xticks(list(x), labels, fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("ε")
    left.set_title("honest runs: one run's bound against its ceiling")
    left.legend(fontsize=8)
    for caught, marker, color, name in (
        (True, "o", "#c53030", "conformance fails it"),
        (False, "x", "#2f855a", "conformance passes it"),
    ):
        rows = [r for r in plants if (r["failed_by_conformance"] == r["seeds"]) == caught]
        truth = [min(float(r["true_epsilon"]), 100.0) for r in rows]
        lbs = [sum(r["epsilon_lb"]) / len(r["epsilon_lb"]) for r in rows]
        right.scatter(truth, lbs, marker=marker, color=color, label=f"{name} on every seed ({len(rows)} rows)")
    reported = plants[0]["epsilon"] if plants else 1.0
    right.axhline(reported, color="#555555", linestyle="--", linewidth=1, label="ε reported: the bound fails it above")
    right.set_xscale("log")
    right.set_xlabel("true ε of the planted bug (∞ drawn at 100)")
    right.set_ylabel("ε_lb, mean over seeds")
    right.set_title("planted bugs: the bound alone, and the conformance")
    right.legend(fontsize=8)
    if any(math.isinf(float(r["true_epsilon"])) for r in plants):
        right.annotate("noise repeated (∞)", (100, 0.05), fontsize=8, ha="right")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
