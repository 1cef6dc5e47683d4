"""Offline LiRA (Carlini et al. 2022): its score on synthetic statistics, where per-example calibration is what
separates members from non-members, and the attack end to end through the real round loop on translation."""

import math

import numpy as np
import pytest

from trustformer.config import load_config
from trustformer_lab.attack.lira import offline_scores, statistic
from trustformer_lab.attack.membership import auc, run_membership


def difficulty_case(seed: int = 0, n: int = 400, models: int = 8):
    """Examples whose OUT statistic differs widely (some hard, some easy); training shifts a member's statistic by
    a constant far smaller than that spread. The loss alone cannot tell members; the calibrated z can."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(-10.0, 0.0, size=2 * n)  # each example's own difficulty
    reference = mu + rng.normal(0.0, 0.1, size=(models, 2 * n))  # the reference models: every example OUT
    member = np.arange(2 * n) < n
    observed = mu + 0.5 * member + rng.normal(0.0, 0.1, size=2 * n)
    return observed, reference, member


def test_lira_calibrates_each_example_where_the_loss_cannot():
    observed, reference, member = difficulty_case()
    z = offline_scores(observed, reference)
    assert auc(z[member], z[~member]) > 0.97
    # the same statistic uncalibrated (the loss score): about chance
    assert abs(auc(observed[member], observed[~member]) - 0.5) < 0.1
    assert auc(z[member], z[~member]) - auc(observed[member], observed[~member]) > 0.35


def test_global_and_per_example_variance():
    observed, reference, _ = difficulty_case(models=8)
    mu = reference.mean(axis=0)
    pooled = math.sqrt(((reference - mu) ** 2).sum() / (reference.shape[1] * 7))
    assert offline_scores(observed, reference) == pytest.approx((observed - mu) / pooled)  # N < 64: global σ
    per_example = offline_scores(observed, reference, sigma="per-example")
    assert per_example == pytest.approx((observed - mu) / reference.std(axis=0, ddof=1))
    many = np.repeat(reference, 8, axis=0)  # 64 models: each example's own σ by default
    assert offline_scores(observed, many) == pytest.approx(offline_scores(observed, many, sigma="per-example"))
    with pytest.raises(ValueError):
        offline_scores(observed[:3], reference)


def test_the_statistic_is_carlinis_logit_scaled_confidence():
    # cross-entropy L = ln 2: p = ½, logit 0; L = ln(4/3): p = ¾, logit ln 3
    assert statistic("image-classification", [math.log(2), math.log(4 / 3)]) == pytest.approx([0.0, math.log(3)])
    assert np.isfinite(statistic("image-classification", [0.0]))[0]
    assert statistic("translation", [1.5, 0.25]) == pytest.approx([-1.5, -0.25])  # mean token log-likelihood


def test_lira_end_to_end_on_training_alone(tmp_path):
    """``local``: each client trains alone from the initial model; the server's reference models are trained the
    same way (every round, from the initial model) on halves of the public split. On the true local models LiRA
    does at least as well as the loss; the server, which receives nothing, learns nothing."""
    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path / "runs" / "local"),
            "runtime.progress": False,
            "runtime.threads": 1,
            "eval.bleu_size": 4,
            "eval.meteor": False,
            "eval.bertscore": False,
            "data.client_size": 60,
            "data.own_test_size": 60,
            "train.local_epochs": 2,
            "train.lr": 2e-2,
            "federation.rounds": 2,
            "federation.strategy": "local",
        },
    )
    result = run_membership(cfg, candidates=60, reference_models=2)
    assert result["lira"]["reference_models"] == 2 and result["lira"]["start"] == "initial"
    assert result["lira"]["rounds"] == 2 and set(result["lira"]["pool"].values()) == {120}
    true_local = result["true-local"]
    assert true_local["lira"]["candidates"] == [60, 60, 60]
    assert true_local["lira"]["auc_mean"] >= true_local["loss"]["auc_mean"] - 0.02
    assert true_local["lira"]["auc_mean"] > 0.7 and true_local["lira"]["auc"] != true_local["loss"]["auc"]
    assert abs(result["server"]["lira"]["auc_mean"] - 0.5) < 0.15
    assert "lira" not in result["final"]
    # the reference models are cached beside the run's folder: one setting, one file
    assert len(list((tmp_path / "runs" / "lira-cache").glob("*.pt"))) == 1
