"""Privacy auditing: the exact binomial bounds against known values, and the ε lower bounds against mechanisms
whose ε is known (a Gaussian mechanism calibrated for ε = 1 must never be audited above 1)."""

import math

import numpy as np
import pytest
from scipy import stats

from trustformer_lab.attack.audit import clopper_pearson, epsilon_lower_bound, one_run_epsilon_lower_bound

DELTA = 1e-5
SIGMA_EPS1 = math.sqrt(2 * math.log(1.25 / DELTA))  # the classic Gaussian calibration for ε = 1 (conservative)


def test_clopper_pearson_known_values():
    # k = 0 of n: the upper bound solves (1 − p)^n = α; k = n: the lower bound solves p^n = α
    assert clopper_pearson(0, 10, 0.95, "upper") == pytest.approx(1 - 0.05 ** (1 / 10))
    assert clopper_pearson(10, 10, 0.95, "lower") == pytest.approx(0.05 ** (1 / 10))
    assert clopper_pearson(0, 10, 0.95, "lower") == 0.0 and clopper_pearson(10, 10, 0.95, "upper") == 1.0
    # the bound is where the binomial tail equals 1 − confidence
    lo, hi = clopper_pearson(37, 100, 0.9, "lower"), clopper_pearson(37, 100, 0.9, "upper")
    assert stats.binom.sf(36, 100, lo) == pytest.approx(0.1) and stats.binom.cdf(37, 100, hi) == pytest.approx(0.1)
    assert lo < 0.37 < hi
    with pytest.raises(ValueError):
        clopper_pearson(11, 10)
    with pytest.raises(ValueError):
        clopper_pearson(1, 10, side="two")


def test_identical_distributions_audit_to_zero():
    rng = np.random.default_rng(0)
    bounds = [epsilon_lower_bound(rng.normal(size=2000), rng.normal(size=2000), DELTA)["epsilon_lb"] for _ in range(5)]
    assert max(bounds) < 0.1 and sum(b == 0.0 for b in bounds) >= 4


def test_well_separated_scores_audit_high_and_fast():
    rng = np.random.default_rng(1)
    result = epsilon_lower_bound(rng.normal(4, 1, 10_000), rng.normal(0, 1, 10_000), DELTA)
    assert result["epsilon_lb"] > 4 and result["members"] == result["non_members"] == 10_000
    # a fixed threshold evaluates that threshold only, and never beats the best one
    fixed = epsilon_lower_bound(rng.normal(4, 1, 1000), rng.normal(0, 1, 1000), DELTA, threshold=2.0)
    assert fixed["threshold"] == 2.0 and 0 < fixed["epsilon_lb"] <= result["epsilon_lb"] + 1


def test_one_run_perfect_guesses_match_the_pure_epsilon_closed_form():
    m = 1000
    scores, included = np.arange(m, dtype=float), np.arange(m) >= m // 2
    pure = one_run_epsilon_lower_bound(scores, included, 0.0, guesses=m // 2)
    p = 0.05 ** (1 / m)  # the Clopper-Pearson lower bound of m correct of m guesses
    assert pure["correct"] == pure["guesses"] == m and pure["epsilon_lb"] == pytest.approx(math.log(p / (1 - p)))
    assert pure["epsilon_lb"] > 3
    approx = one_run_epsilon_lower_bound(scores, included, DELTA, guesses=m // 2)["epsilon_lb"]
    assert 3 < approx <= pure["epsilon_lb"]  # δ only weakens the bound
    # the grid's Bonferroni correction costs a little
    assert 3 < one_run_epsilon_lower_bound(scores, included, 0.0)["epsilon_lb"] < pure["epsilon_lb"]


def test_one_run_random_scores_audit_to_about_zero():
    bounds = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        bounds.append(one_run_epsilon_lower_bound(rng.normal(size=1000), rng.random(1000) < 0.5, DELTA)["epsilon_lb"])
    assert max(bounds) < 0.5 and sum(b == 0.0 for b in bounds) >= 6


def test_one_run_gaussian_mechanism_is_never_audited_above_its_epsilon():
    """score = included + N(0, σ²) is a Gaussian mechanism of sensitivity 1 per canary: (1, 1e-5)-DP at
    σ = √(2 ln(1.25/δ)); the audit must stay ≤ 1 there, and exceed 1 when σ is ten times smaller."""
    for seed in range(5):
        rng = np.random.default_rng(100 + seed)
        included = rng.random(1000) < 0.5
        noise = rng.normal(size=1000)
        private = one_run_epsilon_lower_bound(included + SIGMA_EPS1 * noise, included, DELTA)
        leaky = one_run_epsilon_lower_bound(included + SIGMA_EPS1 / 10 * noise, included, DELTA)
        assert private["epsilon_lb"] <= 1.0 and leaky["epsilon_lb"] > 1.0, (seed, private, leaky)
        assert leaky["m"] == 1000 and leaky["correct"] <= leaky["guesses"]


def test_one_run_rejects_inconsistent_inputs():
    with pytest.raises(ValueError):
        one_run_epsilon_lower_bound([0.0, 1.0, 2.0], [True, False], DELTA)
    with pytest.raises(ValueError):
        one_run_epsilon_lower_bound([0.0, 1.0, 2.0], [True, False, True], DELTA, guesses=(2, 2))


def _grouped_scores(mu: float, seed: int, m: int = 5000, groups: int = 47):
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    labels = [f"g{i % groups}" for i in range(m)]
    return mu * included + rng.normal(size=m), included, labels


def test_groups_cost_a_leak_on_every_canary_little_power_and_keep_the_bound_valid():
    """The weighted Bonferroni: the guesses over all canaries keep half of the 5% (an even split would leave them 8 of
    the 149 guess sets' shares), so a bug that reaches every canary (clipping, sampling, accounting) loses little to
    the group audits; the even split loses half of it and more. The levels still sum to 5%: an honest Gaussian
    mechanism, groups and all, stays under its ε."""
    for seed in range(3):
        scores, included, labels = _grouped_scores(0.9, seed)
        alone = one_run_epsilon_lower_bound(scores, included, DELTA)
        grouped = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=[labels])
        assert grouped["tried"] > 100 and grouped["epsilon_lb"] > 1.0
        assert grouped["epsilon_lb"] >= 0.8 * alone["epsilon_lb"], (alone, grouped)
        even = one_run_epsilon_lower_bound(
            scores, included, DELTA, groupings=[labels], share_all=alone["tried"] / grouped["tried"]
        )
        assert even["epsilon_lb"] < 0.6 * grouped["epsilon_lb"] and even["epsilon_lb"] < 1.0, (even, grouped)
        rng = np.random.default_rng(200 + seed)
        honest = included + SIGMA_EPS1 * rng.normal(size=len(included))
        assert one_run_epsilon_lower_bound(honest, included, DELTA, groupings=[labels])["epsilon_lb"] <= 1.0
    with pytest.raises(ValueError):
        one_run_epsilon_lower_bound(scores, included, DELTA, groupings=[labels], share_all=0.0)


def test_group_guess_sets_that_cannot_exceed_the_target_are_not_tried():
    """``target``: a 32-canary group cannot bound ε above 1 even with every guess right, so its guess sets are dropped
    before looking, and their share of the 5% goes to the groups that can: a leak in one 234-canary group then shows
    more clearly. The honest Gaussian mechanism stays under its ε either way."""
    sizes = [234] * 17 + [64] * 2 + [32] * 28
    labels = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    m = len(labels)
    for seed in range(3):
        rng = np.random.default_rng(300 + seed)
        included = rng.random(m) < 0.5
        leak = np.where(np.asarray(labels) == "g0", 4.0, 0.25)
        scores = leak * included + rng.normal(size=m)
        everything = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=[labels])
        reachable = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=[labels], target=1.0)
        assert reachable["tried"] < everything["tried"] - 80
        assert reachable["epsilon_lb"] > max(1.0, everything["epsilon_lb"] + 0.2) and reachable["group"] == "g0"
        honest = included + SIGMA_EPS1 * rng.normal(size=m)
        assert one_run_epsilon_lower_bound(honest, included, DELTA, groupings=[labels], target=1.0)["epsilon_lb"] <= 1
