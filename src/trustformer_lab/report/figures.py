"""The paper's figures from our runs, as PNG (matplotlib, no display needed).

- ``fig4-5_loss_per_round.png``: test loss of every client after every round, one panel per method
  (Fig. 4/5: do the clients converge to one model?).
- ``fig4-5_final_loss_vs_beta.png``: final test loss against β for Trustformer with FedAvg,
  no aggregation, centralized and DP runs as references; and the distance to FedAvg against β
  (Theorem 1: → 0 as β → 1).
- ``fig6_quality.png``: BLEU, METEOR and BERTScore F1 per client and method (Fig. 6); for image runs
  only, accuracy or Dice, IoU and pixel accuracy instead.
- ``data_per_client.png``: training pairs per client and domain (when the corpus names domains).
- ``class_counts_per_client.png``: image classification, examples per client and class.
- ``masks-<run>.png``: segmentation, a few test slices with the true and the predicted mask (drawn
  by the run's first client).
- ``table3_bytes_vs_beta.png``: bytes per round against β relative to a FedAvg model, ours and the
  paper's (Table III as a chart).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from . import paper
from .runs import RunResult
from .tables import TASK_QUALITY

DPI = 130
_CLIENT_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_REF_STYLES = {
    "fedavg": ("black", "-"),
    "local": ("#7f7f7f", "--"),
    "centralized": ("#8c564b", ":"),
    "dp-fedavg": ("#9467bd", "-."),
    "dp-fedsam": ("#e377c2", "-."),
    "dp-blur-lus": ("#bcbd22", "-."),
}


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _client_color(c: int) -> str:
    return _CLIENT_COLORS[c % len(_CLIENT_COLORS)] if c >= 0 else "#444444"


def _client_name(c: int) -> str:
    return f"client {c}" if c >= 0 else "all shards (one client)"


def loss_per_round(runs: Sequence[RunResult], path: Path) -> Path:
    plt = pyplot()
    runs = [r for r in runs if r.loss_curves()]
    n = max(len(runs), 1)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows + 0.7), squeeze=False)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, runs, strict=False):
        for client, curve in run.loss_curves().items():
            xs, ys = zip(*curve, strict=True)
            ax.plot(
                xs, ys, marker="o", ms=3, lw=1.4, color=_client_color(client), label=_client_name(client), alpha=0.85
            )
        ax.set_title(run.label)
        ax.set_xlabel("round (epoch)")
        ax.set_ylabel("test loss (nats/token)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7, loc="upper right")
    if not runs:
        axes.flat[0].set_visible(True)
        axes.flat[0].text(0.5, 0.5, "no per-round records", ha="center", va="center")
    fig.suptitle(
        "Test loss of every client's model on the shared held-out test set, per round (Fig. 4/5)\n"
        "each panel has its own scale; lines that coincide: the clients hold the same model",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def final_loss_vs_beta(runs: Sequence[RunResult], path: Path) -> Path:
    plt = pyplot()
    sweep = sorted(
        (r for r in runs if r.strategy == "trustformer" and r.agg_every == 1 and r.beta is not None),
        key=lambda r: cast(float, r.beta),  # runs with a β (the filter above)
    )
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.6, 1]})
    clients = sorted({c for r in sweep for c in r.client_ids})
    _loss_against_beta(ax, runs, sweep, clients)
    _distance_against_beta(ax2, sweep, clients)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _loss_against_beta(ax: Any, runs: Sequence[RunResult], sweep: list[RunResult], clients: list[int]) -> None:
    """Each client's final test loss along the β sweep, the references (local, FedAvg, DP…) as lines."""
    for c in clients:
        pts = [(r.beta, r.per_client("test_loss")[r.client_ids.index(c)]) for r in sweep if c in r.client_ids]
        pts = [(b, v) for b, v in pts if v is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", lw=1.5, color=_client_color(c), label=f"Trustformer, {_client_name(c)}")
    refs: list[tuple[RunResult, list[tuple[int, float]]]] = []
    for r in runs:
        if r.strategy == "trustformer" or (r.exchanges and r.agg_every != 1):
            continue
        pairs = [(c, v) for c, v in zip(r.client_ids, r.per_client("test_loss"), strict=True) if v is not None]
        if pairs:
            refs.append((r, pairs))
    # the y range shows the sweep and the plain references; far-off lines (e.g. DP runs whose noise
    # ruined the model) are named in the legend with their value instead of squashing the sweep
    core = [v for r in sweep for v in r.per_client("test_loss") if v is not None]
    core += [v for r, pairs in refs if not r.strategy.startswith("dp-") for _c, v in pairs]
    lo, hi = (min(core), max(core)) if core else (0.0, 1.0)
    pad = max(hi - lo, 0.05) * 0.15
    ylim = (lo - pad, hi + pad)
    for r, pairs in refs:
        color, style = _REF_STYLES.get(r.strategy, ("#333333", "-."))
        if r.strategy == "local":  # clients differ: one line each
            for c, v in pairs:
                ax.axhline(v, color=_client_color(c), ls=style, lw=1, alpha=0.8, label=f"{r.label}, {_client_name(c)}")
            continue
        mean = sum(v for _c, v in pairs) / len(pairs)
        name = r.label if len(pairs) == 1 else f"{r.label} (mean of {len(pairs)} clients)"
        if not ylim[0] <= mean <= ylim[1]:
            name += f": {mean:.2f}, off the scale"
        ax.axhline(mean, color=color, ls=style, lw=1.3, label=name)
    ax.set_ylim(*ylim)
    ax.set_xlabel("β (clusters per layer / rows of the layer)")
    ax.set_ylabel("final test loss (nats/token)")
    ax.set_title("Final test loss against β (Fig. 4/5)")
    if sweep:
        ax.set_xlim(0, 1.02)
    else:
        ax.text(0.5, 0.5, "no Trustformer β sweep in these runs", ha="center", va="center", transform=ax.transAxes)
    ax.legend(fontsize=7, loc="best")


def _distance_against_beta(ax2: Any, sweep: list[RunResult], clients: list[int]) -> None:
    """Each client's relative distance to FedAvg after the last exchange along the β sweep (Theorem 1)."""
    plotted = False
    for c in clients:
        pts = []
        for r in sweep:
            d = r.summary.get("fedavg_distance")
            if d and c in r.client_ids and d[r.client_ids.index(c)] is not None:
                pts.append((r.beta, float(d[r.client_ids.index(c)])))
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax2.plot(xs, ys, marker="o", lw=1.5, color=_client_color(c), label=_client_name(c))
            plotted = True
    ax2.set_xlabel("β (clusters per layer / rows of the layer)")
    ax2.set_ylabel("‖W_i − W_FedAvg‖ / ‖W_FedAvg‖ (relative, unitless)")
    ax2.set_title("Distance to FedAvg after the last exchange")
    if plotted:
        ax2.set_xlim(0, 1.02)
        ax2.set_ylim(bottom=0)
        ax2.legend(fontsize=7)
    else:
        ax2.text(0.5, 0.5, "no distance recorded", ha="center", va="center", transform=ax2.transAxes)


def quality(runs: Sequence[RunResult], path: Path) -> Path:
    plt = pyplot()
    metrics = [
        ("bleu", "BLEU (sacreBLEU, 0–100)", 100.0),
        ("meteor", "METEOR (0–1)", 1.0),
        ("bertscore_f1", "BERTScore F1 (0–1)", 1.0),
    ]
    translation = any(r.task == "translation" for r in runs) or not runs
    if not translation:  # image runs only: their own scores
        metrics = [
            (key, f"{title} (0–1)", 1.0)
            for task in ("image-classification", "segmentation")
            if any(r.task == task for r in runs)
            for key, title, _ in TASK_QUALITY[task]
        ]
    bert = next((r.summary.get("bertscore_model") for r in runs if r.summary.get("bertscore_model")), None)
    width = max(9.0, 1.1 * len(runs) + 3)
    fig, axes = plt.subplots(1, len(metrics), figsize=(min(width, 22), 4.6), squeeze=False)
    axes = axes[0]
    clients = sorted({c for r in runs for c in r.client_ids})
    n_c = max(len(clients), 1)
    bar = 0.8 / n_c
    for ax, (key, title, top) in zip(axes, metrics, strict=False):
        missing = True
        for j, c in enumerate(clients):
            xs, ys = [], []
            for i, r in enumerate(runs):
                if c not in r.client_ids:
                    continue
                v = r.per_client(key)[r.client_ids.index(c)]
                if v is not None:
                    xs.append(i - 0.4 + bar * (j + 0.5))
                    ys.append(v)
            if xs:
                missing = False
                ax.bar(xs, ys, width=bar, color=_client_color(c), label=_client_name(c))
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([r.label for r in runs], rotation=40, ha="right", fontsize=7)
        ax.set_ylabel(title)
        label = title.split(" (")[0]
        if key == "bertscore_f1" and bert:
            ax.set_title(
                f"{label}\n({bert.split(' (')[0]}, not roberta-large)" if "MiniLM" in bert else f"{label}\n({bert})",
                fontsize=9,
            )
        else:
            ax.set_title(label)
        ymax = max([0.0] + [v for r in runs for v in r.per_client(key) if v is not None])
        ax.set_ylim(0, max(ymax * 1.15, top * 0.01))
        if missing:
            ax.text(0.5, 0.5, "not computed", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(
        "Translation quality of every client's final model on the held-out test sentences (Fig. 6)"
        if translation
        else "Quality of every client's final model on the held-out test images"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def bytes_vs_beta(runs: Sequence[RunResult], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    sweep = sorted(
        (r for r in runs if r.strategy == "trustformer" and r.agg_every == 1 and r.beta is not None),
        key=lambda r: cast(float, r.beta),  # runs with a β (the filter above)
    )
    pts = []
    for r in sweep:
        up, _ = r.bytes_per_exchange()
        model = r.model_bytes()
        if up is not None and model:
            pts.append((r.beta, 100 * up / model))
    if pts:
        xs, ys = zip(*pts, strict=True)
        ax.plot(
            xs,
            ys,
            marker="o",
            ms=10,
            mfc="none",
            mew=2,
            lw=1.8,
            color="#1f77b4",
            zorder=3,
            label="Trustformer, ours (measured)",
        )
    pb = sorted(
        (float(k.split("@")[1]), 100 * v / paper.PAPER_MODEL_KIB)
        for k, v in paper.TABLE3_KIB.items()
        if k.startswith("trustformer@")
    )
    ax.plot(
        *zip(*pb, strict=True),
        marker="s",
        ms=4,
        lw=1.0,
        ls="--",
        color="#ff7f0e",
        zorder=2,
        label="Trustformer, paper (Table III)",
    )
    ax.axhline(100, color="black", lw=1.2, label="FedAvg: one whole model")
    for r in runs:
        if r.strategy.startswith("dp-") and r.agg_every == 1:
            up, _ = r.bytes_per_exchange()
            model = r.model_bytes()
            if up is not None and model:
                color, style = _REF_STYLES.get(r.strategy, ("#333333", "-."))
                ax.axhline(100 * up / model, color=color, ls=style, lw=1.1, label=f"{r.label}, ours")
    ax.plot([0, 1], [0, 100], color="#999999", lw=0.8, ls=":", label="β × model (proportional)")
    ax.set_xlabel("β (clusters per layer / rows of the layer)")
    ax.set_ylabel("bytes sent per client per round (% of a FedAvg model)")
    ax.set_title("Communication per round against β (Table III)")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 115)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def data_per_client(runs: Sequence[RunResult], path: Path) -> Path | None:
    """Pairs of every domain held by each client (stacked bars), and the shared test set's mix; None when
    no run recorded domains (a corpus without them)."""
    run = next(
        (r for r in runs if any("domains" in c for c in r.summary.get("data", {}).get("clients", {}).values())), None
    )
    if run is None:
        return None
    plt = pyplot()
    data = run.summary["data"]
    clients = {k: v for k, v in data["clients"].items() if "domains" in v}
    names = sorted(
        {d for c in clients.values() for d in c["domains"]} | set(next(iter(clients.values())).get("test_domains", {}))
    )
    bars = [(f"client {k}" if k != "-1" else "all shards", v["domains"]) for k, v in sorted(clients.items())]
    test = next(iter(clients.values())).get("test_domains")
    if test:
        bars.append(("test set", test))
    fig, ax = plt.subplots(figsize=(1.2 * len(bars) + 3.5, 3.4))
    bottom = [0.0] * len(bars)
    for i, name in enumerate(names):
        heights = [float(counts.get(name, 0)) for _, counts in bars]
        ax.bar(
            [label for label, _ in bars],
            heights,
            bottom=bottom,
            label=name,
            color=_CLIENT_COLORS[i % len(_CLIENT_COLORS)],
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("pairs")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), title="domain")
    ax.set_title(f"Training pairs per client and domain — partition {data.get('partition', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def class_counts(runs: Sequence[RunResult], path: Path) -> Path | None:
    """Image classification: examples of each class held by each client (FedPC's Figures 2 and 3), from
    the first classification run whose clients recorded ``class_counts``; None without one."""
    from trustformer.tasks.figures import partition_figure

    for r in runs:
        clients = r.summary.get("data", {}).get("clients", {})
        rows = [(k, v) for k, v in sorted(clients.items(), key=lambda kv: int(kv[0])) if "class_counts" in v]
        if r.task == "image-classification" and rows and all(k != "-1" for k, _ in rows):
            classes = [str(c) for c in rows[0][1].get("classes", range(len(rows[0][1]["class_counts"])))]
            return partition_figure(
                [v["class_counts"] for _, v in rows],
                classes,
                path,
                title=f"Examples per client and class — {r.label}, partition {r.summary['data'].get('partition', '?')}",
            )
    return None


def mask_figures(runs: Sequence[RunResult], folder: Path) -> dict[str, Path]:
    """Segmentation: the predicted-beside-true masks each run's first client drew (``masks.png``),
    copied into the report's figures as ``masks-<run folder>.png``."""
    out = {}
    for r in runs:
        masks = (r.summary.get("figures") or {}).get("masks") or {}
        first = next(iter(masks.values()), None)
        if r.task == "segmentation" and first and (r.path / first).is_file():
            target = folder / f"masks-{r.path.name}.png"
            shutil.copyfile(r.path / first, target)
            out[r.label] = target
    return out


def all_figures(runs: Sequence[RunResult], folder: Path) -> dict[str, Path]:
    """Every figure of the report by name (``masks:<method>``: one per segmentation run)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = data_per_client(runs, folder / "data_per_client.png")
    counts = class_counts(runs, folder / "class_counts_per_client.png")
    masks = {f"masks:{label}": path for label, path in mask_figures(runs, folder).items()}
    return {
        **({"data_per_client": data} if data is not None else {}),
        **({"class_counts": counts} if counts is not None else {}),
        **masks,
        "loss_per_round": loss_per_round(runs, folder / "fig4-5_loss_per_round.png"),
        "loss_vs_beta": final_loss_vs_beta(runs, folder / "fig4-5_final_loss_vs_beta.png"),
        "quality": quality(runs, folder / "fig6_quality.png"),
        "bytes_vs_beta": bytes_vs_beta(runs, folder / "table3_bytes_vs_beta.png"),
    }
