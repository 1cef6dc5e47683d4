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
    numbers: dict[str, int] = {}
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
        advantages = [r["mia_advantage"] for r in points]
        measured = [a for a in advantages if not math.isnan(a)]
        colour = (  # without the attacks (--no-attacks) every point is drawn in one colour, with no colour bar
            {"c": [0.5 if math.isnan(a) else a for a in advantages], "cmap": "viridis_r", "vmin": 0}
            if measured
            else {"color": "tab:blue"}
        )
        drawn = ax.scatter(
            [r["upload_vs_fedavg"] for r in points],
            clipped,
            **colour,
            vmax=max([0.3, *measured]) if measured else None,
            s=60,
            edgecolors=["red" if r[flag] else "none" for r in points],
            linewidths=1.8,
        )
        scatter = drawn if measured else scatter
        for r, y in zip(points, clipped, strict=True):
            finetuned, dp = r["run"].endswith(" + fine-tuning"), r["run"].startswith("dp-")
            if not r[flag] and (finetuned or dp):  # named: the front, and runs before fine-tuning but DP's
                continue
            number = numbers.setdefault(r["run"], len(numbers) + 1)  # a number by the point, its name in the key
            ax.annotate(str(number), (r["upload_vs_fedavg"], y), fontsize=7, xytext=(3, 2), textcoords="offset points")
        ax.set_ylim(low, high)
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.6, ls="--")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":")
        ax.set_xlabel("upload per client per round / FedAvg's (log)")
        ax.set_ylabel("gain retained over training alone (test loss)")
    if scatter is not None:
        fig.colorbar(scatter, ax=axes, label="server's membership advantage (AUC − 0.5)")
    values = {r["run"]: r for r in shown}
    key_text = "\n".join(
        f"{n:>2}  {name.replace(' + fine-tuning', ' +ft')}"
        + (f"  (gain {values[name]['gain_loss']:.1f})" if values[name]["gain_loss"] < -0.6 else "")
        for name, n in numbers.items()
    )
    fig.text(1.0, 0.5, key_text, fontsize=7, family="monospace", va="center", ha="left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


FAMILIES = (  # (label prefix, colour map): one colour family per protocol, a shade per upload width
    ("public + fedavg lora r", "Greens"),
    ("public-ui + fedavg lora r", "Purples"),  # the public start with the UI catalogs (train.public_source)
    ("public + trustformer", "YlOrBr"),
    ("public", "Greys"),
    ("trustformer", "Oranges"),
    ("fedavg", "Blues"),
)
DOWN_STYLES = {32: "-", 16: (0, (5, 1)), 8: "--", 4: "-.", 2: ":"}


def curves_figure(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Each run's mean shared-test loss against its cumulative bytes (up + down, all clients; log axis), seeds
    averaged round by round: one colour family per protocol, the line style by download width, the key beside the
    axes; the 90%-of-FedAvg's-gain target as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .federation_plan import DOWN
    from .federation_table import TARGET_SHARE

    shown = [r for r in rows if not r["run"].endswith(" + fine-tuning") and any(r["curves"]) and r["total_bytes"] > 0]
    shown = [r for r in shown if r["run"] not in ("local", "public + local")]
    fig, ax = plt.subplots(figsize=(11, 6))
    family_rows: dict[str, list[dict[str, Any]]] = {}
    for r in shown:
        family = next((name for name, _ in FAMILIES if r["run"].startswith(name)), "other")
        family_rows.setdefault(family, []).append(r)
    for family, members in family_rows.items():
        cmap = plt.get_cmap(dict(FAMILIES).get(family, "Purples"))
        bases = sorted({m["run"].partition(DOWN)[0] for m in members})
        for r in members:
            base, _, down = r["run"].partition(DOWN)
            shade = 0.45 + 0.5 * (bases.index(base) + 1) / (len(bases) + 1)
            points = _mean_curve([c for c in r["curves"] if c])
            ax.plot(
                [b for _, b in points],
                [loss for loss, _ in points],
                color=cmap(shade),
                ls=DOWN_STYLES.get(int(down) if down else 32, "-"),
                lw=1.6,
                marker="o",
                ms=2.5,
                label=r["run"],
            )
    local = next(r for r in rows if r["run"] == "local")
    fedavg = next(r for r in rows if r["run"] == "fedavg")
    target = local["loss"] - TARGET_SHARE * (local["loss"] - fedavg["loss"])
    ax.axhline(target, color="grey", lw=1, ls="--", label=f"{TARGET_SHARE:.0%} of FedAvg's gain")
    ax.axhline(local["loss"], color="grey", lw=0.8, ls=":", label="training alone (final)")
    ax.set_xscale("log")
    ax.set_xlabel("bytes up + down, all clients, so far (log)")
    ax.set_ylabel("mean shared-test loss")
    ax.set_title("quality against total bytes; line style: download width (solid 32, -- 8, -. 4, : 2)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _mean_curve(curves: list[list[list[float]]]) -> list[tuple[float, float]]:
    """(loss, cumulative bytes) per round, averaged over the seeds' curves (to the shortest)."""
    n = min(len(c) for c in curves)
    return [(sum(c[i][1] for c in curves) / len(curves), sum(c[i][2] for c in curves) / len(curves)) for i in range(n)]


__all__ = ["curves_figure", "figure"]
