"""The figure of ``trustformer bench robustness --figure``: each backdoor row's success, round by round."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def backdoor_figure(rows: list[dict[str, Any]], path: str | Path) -> Path | None:
    """One line per row with a per-round backdoor success (``backdoor_per_round``): how fast it takes, whether a
    defence stops it, how long it lasts after the attackers leave (dotted: rounds they were gone). None: no row
    has one."""
    shown = [r for r in rows if r.get("backdoor_per_round")]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.8))
    markers = "osD^vP*X"
    for k, r in enumerate(shown):
        series = [100 * v if not math.isnan(v) else math.nan for v in r["backdoor_per_round"]]
        left = r.get("attack_rounds") or 0
        label = f"{r['defence']} · {r['fault']}" + (f" · leaves after round {left}" if left else "")
        label += f" · {r['clients']}x{r['malicious']}" if "clients" in r else ""
        if r.get("adapters", "none") != "none":
            label += f" · {r['adapters']}"
        if r.get("mask"):
            label += f" · Neurotoxin mask {r['mask']:g}"
        if r.get("trigger"):
            label += f" · trigger {r['trigger']!r}"
        rounds = list(range(1, len(series) + 1))
        marker = markers[k % len(markers)]  # rows that overlap (several at 0%) stay told apart
        (line,) = ax.plot(rounds[: left or None], series[: left or None], marker=marker, label=label, alpha=0.85)
        if left:
            ax.plot(rounds[left - 1 :], series[left - 1 :], marker=marker, linestyle=":", color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel("backdoor success on triggered test sources (%)")
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot, not over its lines
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


__all__ = ["backdoor_figure"]
