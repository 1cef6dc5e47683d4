"""Classification and segmentation scores against hand-computed small cases."""

from __future__ import annotations

import pytest
import torch

from trustformer.tasks import image_metrics as M


def test_accuracy_and_per_class():
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    preds = torch.tensor([0, 1, 1, 1, 0, 2])
    assert M.accuracy(preds, labels) == pytest.approx(4 / 6)
    # class 0: 1 of 2, class 1: 2 of 3, class 2: 1 of 1, class 3: absent
    assert M.per_class_accuracy(preds, labels, 4) == [0.5, pytest.approx(2 / 3), 1.0, None]
    cm = M.confusion_matrix(preds, labels, 3)
    assert cm.tolist() == [[1, 1, 0], [1, 2, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match="differ in shape"):
        M.accuracy(preds[:3], labels)


def test_dice_iou_pixel_accuracy_hand_computed():
    truth = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])
    pred = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    # TP = 3, FP = 1, FN = 1, TN = 3
    assert M.mask_counts(pred, truth) == (3, 1, 1, 3)
    assert M.dice(pred, truth) == pytest.approx(6 / 8)
    assert M.iou(pred, truth) == pytest.approx(3 / 5)
    assert M.pixel_accuracy(pred, truth) == pytest.approx(6 / 8)
    empty = torch.zeros(2, 2)
    assert M.dice(empty, empty) == 1.0 and M.iou(empty, empty) == 1.0
    assert M.dice(torch.ones(2, 2), empty) == 0.0


def test_pixel_accuracy_is_high_for_an_all_background_prediction():
    # a small tumour: predicting nothing scores 0.99 pixel accuracy but Dice 0 (why both are reported)
    truth = torch.zeros(10, 10)
    truth[0, 0] = 1
    pred = torch.zeros(10, 10)
    assert M.pixel_accuracy(pred, truth) == pytest.approx(0.99)
    assert M.dice(pred, truth) == 0.0


def test_pooled_and_per_image_scores():
    truth = torch.zeros(3, 1, 2, 2, dtype=torch.bool)
    pred = torch.zeros(3, 1, 2, 2, dtype=torch.bool)
    truth[0, 0, 0, :] = True  # image 0: truth 2 px, prediction 1 of them → Dice 2/3
    pred[0, 0, 0, 0] = True
    truth[1, 0] = True  # image 1: 4 px, all found → Dice 1
    pred[1, 0] = True
    # image 2: both empty → left out of the per-image mean
    scores = M.SegmentationScores()
    scores.update(pred[:2], truth[:2])
    scores.update(pred[2:], truth[2:])
    r = scores.result()
    # pooled: TP 5, FP 0, FN 1, TN 6
    assert r["dice"] == pytest.approx(10 / 11)
    assert r["iou"] == pytest.approx(5 / 6)
    assert r["pixel_accuracy"] == pytest.approx(11 / 12)
    assert r["dice_per_image"] == pytest.approx((2 / 3 + 1) / 2)
    assert r["iou_per_image"] == pytest.approx((1 / 2 + 1) / 2)
    assert r["foreground_fraction"] == pytest.approx(6 / 12)
    assert M.segmentation_scores(pred, truth) == r
