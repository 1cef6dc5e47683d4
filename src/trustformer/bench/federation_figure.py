"""The figure of ``trustformer bench federation --figure``: the privacy–utility–bytes frontier."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def figure(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """The frontier: gain retained against upload (log), the server's membership advantage as colour; the front
    ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 6), sharey=False)
    shown = [r for r in rows if not math.isnan(r["upload_vs_fedavg"]) and r["upload_vs_fedavg"] > 0]
    scatter = None
    for ax, key, flag, title in (
        (axes[0], "gain_loss", "pareto", "shared test set"),
        (axes[1], "gain_own_loss", "pareto_own", "each client's own data"),
    ):
        points = [r for r in shown if not math.isnan(r[key])]
        ax.set_title(
            f"gain on {title}\nred ring: Pareto front"
            + (
                "; DP runs (far below) sit on the bottom edge"
                if any(r["run"].startswith("dp-") for r in points)
                else ""
            ),
            fontsize=9,
        )
        if not points:  # no gain to show: FedAvg and training alone tie on this measure, or it was not measured
            ax.text(0.5, 0.5, "gain undefined (FedAvg ≈ training alone)", ha="center", transform=ax.transAxes)
            continue
        low, high = -0.6, max([1.4] + [r[key] + 0.1 for r in points])
        clipped = [max(low + 0.05, r[key]) for r in points]  # far below training alone (the DP runs): at the edge
        scatter = ax.scatter(
            [r["upload_vs_fedavg"] for r in points],
            clipped,
            c=[r["mia_advantage"] for r in points],
            cmap="viridis_r",
            vmin=0,
            vmax=max([0.3] + [r["mia_advantage"] for r in points if not math.isnan(r["mia_advantage"])]),
            s=60,
            edgecolors=["red" if r[flag] else "none" for r in points],
            linewidths=1.8,
        )
        for r, y in zip(points, clipped):
            finetuned, dp = r["run"].endswith(" + fine-tuning"), r["run"].startswith("dp-")
            if not r[flag] and (finetuned or dp):  # named: the front, and runs before fine-tuning but DP's
                continue
            text = r["run"].replace(" + fine-tuning", " +ft") + (f" ({r[key]:.0f})" if r[key] < low else "")
            ax.annotate(text, (r["upload_vs_fedavg"], y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set_ylim(low, high)
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.6, ls="--")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":")
        ax.set_xlabel("upload per client per round / FedAvg's (log)")
        ax.set_ylabel("gain retained over training alone (test loss)")
    if scatter is not None:
        fig.colorbar(scatter, ax=axes, label="server's membership advantage (AUC − 0.5)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


__all__ = ["figure"]
