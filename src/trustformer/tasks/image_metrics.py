"""Scores of the image tasks: classification accuracy (overall and per class); segmentation Dice,
IoU and pixel accuracy.

FedPC reports classification accuracy on CIFAR-10 (Tables 1, 2, 4) and, for U-Net on LGG, an
"accuracy" of about 0.99 (Tables 1, 3): with a brain-tumour mask covering a few percent of a slice,
that can only be pixel accuracy, which a network predicting "background" everywhere nearly reaches.
Dice is reported beside it; both are computed here from confusion counts.

- Dice (Sørensen-Dice) = 2·TP / (2·TP + FP + FN)
- IoU (Jaccard) = TP / (TP + FP + FN)
- pixel accuracy = (TP + TN) / (TP + TN + FP + FN)

Pooled scores count TP/FP/FN over every pixel of the whole test set (one score per set); per-image
means average the per-image score over the images whose truth or prediction is non-empty (an image
empty in both is a perfect, uninformative match and is left out). When both truth and prediction
are empty over everything counted, Dice and IoU are defined as 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch


def accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of predicted class ids equal to the labels."""
    predictions, labels = torch.as_tensor(predictions), torch.as_tensor(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ in shape")
    if labels.numel() == 0:
        raise ValueError("accuracy of an empty set")
    return float((predictions == labels).double().mean())


def per_class_accuracy(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> list[float | None]:
    """Recall of each class (correct / examples of that class); ``None`` for a class absent from labels."""
    predictions, labels = torch.as_tensor(predictions).long(), torch.as_tensor(labels).long()
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ in shape")
    totals = torch.bincount(labels, minlength=num_classes)
    correct = torch.bincount(labels[predictions == labels], minlength=num_classes)
    return [
        None if int(t) == 0 else float(c) / float(t) for c, t in zip(correct.tolist(), totals.tolist(), strict=True)
    ]


def confusion_matrix(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``num_classes × num_classes`` counts, rows = true class, columns = predicted class."""
    predictions, labels = torch.as_tensor(predictions).long(), torch.as_tensor(labels).long()
    flat = labels * num_classes + predictions
    return torch.bincount(flat, minlength=num_classes * num_classes).view(num_classes, num_classes)


def mask_counts(pred: torch.Tensor, truth: torch.Tensor) -> tuple[int, int, int, int]:
    """(TP, FP, FN, TN) of two binary masks of the same shape (any non-zero value is foreground)."""
    pred, truth = torch.as_tensor(pred).bool(), torch.as_tensor(truth).bool()
    if pred.shape != truth.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and truth {tuple(truth.shape)} differ in shape")
    tp = int((pred & truth).sum())
    fp = int((pred & ~truth).sum())
    fn = int((~pred & truth).sum())
    tn = int(pred.numel()) - tp - fp - fn
    return tp, fp, fn, tn


def dice_from_counts(tp: int, fp: int, fn: int) -> float:
    denom = 2 * tp + fp + fn
    return 1.0 if denom == 0 else 2.0 * tp / denom


def iou_from_counts(tp: int, fp: int, fn: int) -> float:
    denom = tp + fp + fn
    return 1.0 if denom == 0 else tp / denom


def dice(pred: torch.Tensor, truth: torch.Tensor) -> float:
    """Dice = 2·TP / (2·TP + FP + FN) over all pixels given (1 when both masks are empty)."""
    tp, fp, fn, _ = mask_counts(pred, truth)
    return dice_from_counts(tp, fp, fn)


def iou(pred: torch.Tensor, truth: torch.Tensor) -> float:
    """IoU = TP / (TP + FP + FN) over all pixels given (1 when both masks are empty)."""
    tp, fp, fn, _ = mask_counts(pred, truth)
    return iou_from_counts(tp, fp, fn)


def pixel_accuracy(pred: torch.Tensor, truth: torch.Tensor) -> float:
    """(TP + TN) / all pixels."""
    tp, fp, fn, tn = mask_counts(pred, truth)
    total = tp + fp + fn + tn
    if total == 0:
        raise ValueError("pixel accuracy of empty masks")
    return (tp + tn) / total


class SegmentationScores:
    """Accumulates confusion counts over batches of N×H×W (or N×1×H×W) binary masks."""

    def __init__(self) -> None:
        self.tp = self.fp = self.fn = self.tn = 0
        self._dice: list[float] = []
        self._iou: list[float] = []

    def update(self, pred: torch.Tensor, truth: torch.Tensor) -> None:
        pred, truth = torch.as_tensor(pred).bool(), torch.as_tensor(truth).bool()
        if pred.shape != truth.shape:
            raise ValueError(f"prediction {tuple(pred.shape)} and truth {tuple(truth.shape)} differ in shape")
        p, t = pred.reshape(pred.shape[0], -1), truth.reshape(truth.shape[0], -1)
        tp = (p & t).sum(1)
        fp = (p & ~t).sum(1)
        fn = (~p & t).sum(1)
        tn = p.shape[1] - tp - fp - fn
        self.tp += int(tp.sum())
        self.fp += int(fp.sum())
        self.fn += int(fn.sum())
        self.tn += int(tn.sum())
        for a, b, c in zip(tp.tolist(), fp.tolist(), fn.tolist(), strict=True):
            if a + b + c:
                self._dice.append(dice_from_counts(a, b, c))
                self._iou.append(iou_from_counts(a, b, c))

    def result(self) -> dict[str, float]:
        total = self.tp + self.fp + self.fn + self.tn
        if total == 0:
            raise ValueError("no pixels scored")
        return {
            "dice": dice_from_counts(self.tp, self.fp, self.fn),
            "iou": iou_from_counts(self.tp, self.fp, self.fn),
            "pixel_accuracy": (self.tp + self.tn) / total,
            "dice_per_image": sum(self._dice) / len(self._dice) if self._dice else 1.0,
            "iou_per_image": sum(self._iou) / len(self._iou) if self._iou else 1.0,
            "foreground_fraction": (self.tp + self.fn) / total,
        }


def segmentation_scores(
    preds: Sequence[torch.Tensor] | torch.Tensor, truths: Sequence[torch.Tensor] | torch.Tensor
) -> dict[str, float]:
    """Pooled Dice, IoU, pixel accuracy and per-image means of masks (N×H×W tensors or lists of them)."""
    scores = SegmentationScores()
    if isinstance(preds, torch.Tensor):
        # both are tensors here, or both lists (the docstring's contract)
        preds, truths = [preds], [cast(torch.Tensor, truths)]
    for p, t in zip(preds, truths, strict=True):
        scores.update(p, t)
    return scores.result()


__all__ = [
    "SegmentationScores",
    "accuracy",
    "confusion_matrix",
    "dice",
    "dice_from_counts",
    "iou",
    "iou_from_counts",
    "mask_counts",
    "per_class_accuracy",
    "pixel_accuracy",
    "segmentation_scores",
]
