"""Figures of the image tasks for the report: predicted masks beside the truth, and how the classes
are spread over the clients (FedPC's Figures 2, 3 and 5)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mask_figure(samples: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """One column per sample (from ``SegmentationTask.sample_predictions``): the image, the true
    mask, the predicted mask, and the overlay (green: both, red: missed, blue: false positive)."""
    if not samples:
        raise ValueError("mask_figure needs at least one sample")
    plt = _pyplot()
    n = len(samples)
    fig, axes = plt.subplots(4, n, figsize=(2.2 * n, 8.4), squeeze=False)
    for j, s in enumerate(samples):
        image = np.asarray(s["image"], dtype=np.float32)
        truth = np.asarray(s["truth"]).astype(bool)
        pred = np.asarray(s["prediction"]).astype(bool)
        lo, hi = float(image.min()), float(image.max())
        gray = (image - lo) / (hi - lo) if hi > lo else np.zeros_like(image)
        overlay = np.stack([gray] * 3, axis=-1) * 0.6
        overlay[truth & pred] = (0.1, 0.8, 0.1)
        overlay[truth & ~pred] = (0.9, 0.1, 0.1)
        overlay[~truth & pred] = (0.1, 0.3, 0.9)
        inter = int((truth & pred).sum())
        denom = int(truth.sum() + pred.sum())
        dice = 1.0 if denom == 0 else 2 * inter / denom
        for i, (img, label) in enumerate(
            [
                (gray, str(s.get("unit", ""))),
                (truth, "truth"),
                (pred, f"prediction (Dice {dice:.3f})"),
                (overlay, "overlay"),
            ]
        ):
            ax = axes[i, j]
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="nearest")
            ax.set_title(label, fontsize=8)
            ax.axis("off")
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def partition_figure(
    counts: Sequence[Sequence[int]], classes: Sequence[str], path: str | Path, *, title: str = ""
) -> Path:
    """Stacked bars: examples of each class held by each client (``counts`` is clients × classes)."""
    table = np.asarray(counts)
    if table.ndim != 2 or table.shape[1] != len(classes):
        raise ValueError(f"counts must be clients × {len(classes)} classes; got shape {table.shape}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * table.shape[0], 3.5))
    bottom = np.zeros(table.shape[0])
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "tab20")
    for c, name in enumerate(classes):
        ax.bar(np.arange(table.shape[0]), table[:, c], bottom=bottom, color=cmap(c % cmap.N), label=name)
        bottom += table[:, c]
    ax.set_xticks(np.arange(table.shape[0]), [f"client {k}" for k in range(table.shape[0])], fontsize=8)
    ax.set_ylabel("examples")
    ax.legend(fontsize=6, bbox_to_anchor=(1.01, 1), loc="upper left")
    if title:
        ax.set_title(title)
    return _save(plt, fig, path)


def _save(plt, fig, path: str | Path) -> Path:
    """Lay out, write as PNG and close a figure."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["mask_figure", "partition_figure"]
