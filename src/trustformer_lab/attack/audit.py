"""Empirical lower bounds on the ε of (ε, δ)-differential privacy from membership scores (privacy auditing).

A mechanism that is (ε, δ)-DP bounds every membership test: TPR ≤ e^ε · FPR + δ and TNR ≤ e^ε · FNR + δ
(Kairouz et al. 2015; the hypothesis-testing view). An auditor who observes a test's error rates on
finitely many examples bounds them with exact binomial intervals and turns them into an ε the mechanism
cannot have — a **lower** bound, valid with the stated confidence, on whatever ε the mechanism claims.

- :func:`clopper_pearson`: the exact one-sided binomial bound (Clopper & Pearson 1934);
- :func:`epsilon_lower_bound`: from member and non-member scores, every threshold (Jagielski et al. 2020,
  "Auditing differentially private machine learning: how private is private SGD?", NeurIPS; Nasr et al. 2021,
  "Adversary instantiation: lower bounds for differentially private machine learning", IEEE S&P);
- :func:`one_run_epsilon_lower_bound`: from one training run with m canaries, each included independently
  with probability ½ (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run",
  NeurIPS, arXiv 2305.08846).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

GUESS_GRID = (10, 25, 50, 100, 200, 400)  # k+ = k− tried by one_run_epsilon_lower_bound, besides m/4 and m/2


# ------------------------------------------------------------------------------ binomial bounds


def _cp_lower(successes: np.ndarray | int, trials: np.ndarray | int, confidence: float) -> np.ndarray:
    """Clopper-Pearson one-sided lower bound: the p with P[Bin(n, p) ≥ k] = 1 − confidence (0 when k = 0)."""
    k, n = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = stats.beta.ppf(1.0 - confidence, k, n - k + 1)
    return np.where(k <= 0, 0.0, bound)


def _cp_upper(successes: np.ndarray | int, trials: np.ndarray | int, confidence: float) -> np.ndarray:
    """Clopper-Pearson one-sided upper bound: the p with P[Bin(n, p) ≤ k] = 1 − confidence (1 when k = n)."""
    k, n = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = stats.beta.ppf(confidence, k + 1, n - k)
    return np.where(k >= n, 1.0, bound)


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95, side: str = "lower") -> float:
    """The exact one-sided ``confidence`` bound on a binomial proportion from ``successes`` of ``trials``
    (Clopper & Pearson 1934): ``lower`` is the Beta(k, n − k + 1) quantile at 1 − confidence, ``upper`` the
    Beta(k + 1, n − k) quantile at confidence; the true proportion lies beyond it with probability at most
    1 − confidence."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 ≤ successes ≤ trials and trials ≥ 1; got {successes} of {trials}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if side == "lower":
        return float(_cp_lower(np.asarray(successes), np.asarray(trials), confidence))
    if side == "upper":
        return float(_cp_upper(np.asarray(successes), np.asarray(trials), confidence))
    raise ValueError(f"side must be 'lower' or 'upper'; got {side!r}")


# ------------------------------------------------------------------------------ two-sample audit


def epsilon_lower_bound(
    member_scores: Sequence[float],
    non_member_scores: Sequence[float],
    delta: float,
    confidence: float = 0.95,
    *,
    threshold: float | None = None,
) -> dict[str, Any]:
    """The largest ε an (ε, δ)-DP mechanism cannot have given a membership test's scores (Jagielski et al. 2020,
    Nasr et al. 2021): guessing "member" when score ≥ t, with TP of m members and FP of n non-members above t,

        ε(t) = max( ln((TPR_lo − δ) / FPR_hi),  ln((TNR_lo − δ) / FNR_hi) ),

    TPR_lo the Clopper-Pearson lower bound of TP of m, FPR_hi the upper bound of FP of n, TNR_lo = 1 − FPR_hi and
    FNR_hi = 1 − TPR_lo (the same two bounds: the Beta quantiles are symmetric); a ratio with a non-positive
    numerator is undefined and skipped. Returns the maximum over every distinct score as t (0.0 when none is
    positive), the threshold, its counts and bounds.

    Confidence, explicitly: each of the two Clopper-Pearson bounds is one-sided at ``confidence``. For **one
    fixed** threshold both hold together with probability ≥ 1 − 2(1 − confidence) by the union bound (valid and
    conservative; members and non-members being independent samples, the joint is in fact ≥ confidence²).
    Taking the maximum over thresholds chosen on the same scores, as Jagielski et al. and Nasr et al. do, is
    optimistic (no correction for the choice). For a strictly valid bound choose the threshold on other scores
    and pass it as ``threshold``: only that one is then evaluated.
    """
    members = np.sort(np.asarray(member_scores, dtype=np.float64))
    non_members = np.sort(np.asarray(non_member_scores, dtype=np.float64))
    m, n = len(members), len(non_members)
    if not m or not n:
        raise ValueError("need at least one member and one non-member score")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1); got {delta}")
    thresholds = (
        np.unique(np.concatenate([members, non_members]))
        if threshold is None
        else np.asarray([threshold], dtype=np.float64)
    )
    tp = m - np.searchsorted(members, thresholds, side="left")  # members with score ≥ t
    fp = n - np.searchsorted(non_members, thresholds, side="left")
    tpr_lo, fpr_hi = _cp_lower(tp, m, confidence), _cp_upper(fp, n, confidence)
    tnr_lo, fnr_hi = _cp_lower(n - fp, n, confidence), _cp_upper(m - tp, m, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        forward = np.where((tpr_lo > delta) & (fpr_hi > 0), np.log((tpr_lo - delta) / fpr_hi), -np.inf)
        backward = np.where((tnr_lo > delta) & (fnr_hi > 0), np.log((tnr_lo - delta) / fnr_hi), -np.inf)
    eps = np.maximum(forward, backward)
    best = int(np.argmax(eps))
    value = float(eps[best]) if np.isfinite(eps[best]) and eps[best] > 0 else 0.0
    return {
        "epsilon_lb": value,
        "threshold": float(thresholds[best]),
        "direction": "tpr/fpr" if forward[best] >= backward[best] else "tnr/fnr",
        "tp": int(tp[best]),
        "fp": int(fp[best]),
        "members": m,
        "non_members": n,
        "tpr_lo": float(tpr_lo[best]),
        "fpr_hi": float(fpr_hi[best]),
        "delta": delta,
        "confidence": confidence,
    }


# ------------------------------------------------------------------------------ one training run


EPSILON_RESOLUTION = 1e-6  # the one-run bound's bisection stops at this relative width (the bound: its lower end)


def _one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[≥ v correct of r guesses] allowed by (ε, δ)-DP (Steinke et al. 2023, Theorem 5.2 as computed in their
    Appendix algorithm): with q = e^ε / (1 + e^ε) and B ~ Bin(r, q),

        P[B ≥ v] + 2mδ · max_{1 ≤ i ≤ v} P[v − i ≤ B < v] / i;

    for δ = 0 it is Theorem 3.1's pure-ε tail P[B ≥ v]."""
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v − i], i = 1..v
    slack = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * slack, 1.0)


def _one_run_epsilon(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """The largest ε whose p-value for v correct of r guesses is still below ``alpha`` (0 if ε = 0 is not
    rejected): every ε below it is rejected at level alpha. Pure ε (δ = 0) in closed form: the logit of the
    Clopper-Pearson lower bound of v of r; otherwise a bisection (the p-value grows with ε)."""
    if r == 0 or _one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    if delta == 0.0:
        p = float(_cp_lower(np.asarray(v), np.asarray(r), 1.0 - alpha))
        return math.log(p / (1.0 - p)) if p < 1.0 else math.inf
    lo, hi = 0.0, 1.0
    while _one_run_p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return math.inf
    while hi - lo > EPSILON_RESOLUTION * max(1.0, lo):  # far below any ε an audit can resolve
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _one_run_p_value(m, r, v, mid, delta) < alpha else (lo, mid)
    return lo


def _quarters(label: str, members: np.ndarray) -> list[tuple[str | None, np.ndarray, int, int]]:
    """A group's three guess sets: k+ = k− = n/4, k+ = n/4 alone, k− = n/4 alone (n = its canaries)."""
    quarter = len(members) // 4
    return [(label, members, quarter, quarter), (label, members, quarter, 0), (label, members, 0, quarter)]


def _pool_candidates(
    pools: Sequence[Sequence[bool] | np.ndarray], m: int
) -> list[tuple[str | None, np.ndarray, int, int]]:
    """The pools' guess sets, three per pool whatever its size (an empty or tiny pool guesses nothing)."""
    out: list[tuple[str | None, np.ndarray, int, int]] = []
    for j, pool in enumerate(pools):
        flags = np.asarray(pool, dtype=bool)
        if len(flags) != m:
            raise ValueError(f"need one pool flag per canary; got {len(flags)} for {m}")
        out += _quarters(f"pool {j}", np.flatnonzero(flags))
    return out


def one_run_epsilon_lower_bound(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    delta: float,
    *,
    confidence: float = 0.95,
    guesses: int | tuple[int, int] | None = None,
    groupings: Sequence[Sequence[str]] = (),
    share_all: float = 0.5,
    target: float | None = None,
    pools: Sequence[Sequence[bool] | np.ndarray] = (),
) -> dict[str, Any]:
    """ε lower bound from ONE training run (Steinke, Nasr & Jagielski 2023, arXiv 2305.08846): m canaries,
    each included in training independently with probability ½ (``included``); the auditor guesses "in" for
    the k+ highest scores, "out" for the k− lowest and abstains on the rest. If the mechanism is (ε, δ)-DP the
    number of correct guesses v of r = k+ + k− is stochastically dominated as in their Theorem 5.2 (δ = 0:
    Theorem 3.1, Bin(r, e^ε/(1 + e^ε))); the bound is the largest ε at which v is still significant at level
    1 − confidence. The δ > 0 version is the paper's, with the 2mδ term of Theorem 5.2 computed as in their
    Appendix algorithm; δ = 0 gives the pure-ε bound exactly (the logit of a Clopper-Pearson bound).

    ``guesses``: k (k+ = k− = k) or (k+, k−). If None, k+ = k− ∈ :data:`GUESS_GRID` ∪ {m/4, m/2} (clipped to m/2,
    deduplicated) are all tried and the best is returned **with a Bonferroni correction**: each is tested at
    level (1 − confidence) / (number tried), so choosing k after looking keeps the bound valid at
    ``confidence``. The guesses depend on the scores alone (ties broken by position), never on ``included``.

    ``groupings`` (each one label per canary; with ``guesses`` None): the canaries of each group are also guessed
    on their own, ranked within the group: k+ = k− = n/4, k+ = n/4 alone and k− = n/4 alone for a group of n.
    Abstaining on every other canary is allowed (the guesses still depend on scores and labels alone), and a
    mechanism whose noise is missing from one group shows there even when the other groups' noise drowns it in the
    ranking of all. Given the coins of the canaries outside the group (fixed, independent of the group's), the
    group's n canaries are an audit of their own: its 2mδ term takes m = n. The correction is then a **weighted**
    Bonferroni (the levels of all guess sets sum to 1 − confidence, as the union bound needs): the guesses over all
    canaries share ``share_all`` of it, the groups' guess sets the rest, each family evenly. With the ~150 group
    guess sets of a transformer an even split would test every guess over all canaries at a level 25 times
    smaller, and a bug that touches every canary (clipping, sampling, accounting) would pass for lack of power.
    ``target`` (the ε the run reports): a group guess set that could not bound ε above it even if every one of its
    guesses were right (its n, k and δ alone decide, at the level it would get with every guess set kept) is not
    tried, and leaves its share of the level to the others; the choice depends on neither scores nor coins. A
    32-canary group, whose 16 guesses bound ε at 0.4 at best, then costs nothing to the audit of ε = 1.

    ``pools`` (with ``guesses`` None): subsets of the canaries (one flag per canary) that the caller chose from the
    **scores alone** (never the coins), e.g. the canaries of the tensors whose scores spread least, where a bug left
    less noise. Each is guessed on like a group (the same three guess sets), with abstention on every other canary,
    which Steinke et al.'s theorem allows for guesses that depend on the output only; as the subset depends on the
    output, its 2mδ term keeps the whole m. Its guess sets are always kept (their number fixed in advance, their
    levels shared with the groups' as above), so that the split of the level depends on neither scores nor coins.
    Returns ``epsilon_lb``, the ``k`` = (k+, k−) used, ``correct``, ``guesses`` (r), the ``group`` that gave it
    (None: all canaries), ``m``, the level of that guess set and the number of guess sets ``tried``.
    """
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    m = len(s)
    if m != len(inc) or m < 2:
        raise ValueError(f"need as many inclusion flags as scores (≥ 2); got {len(inc)} and {m}")
    if not 0.0 <= delta < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"need 0 ≤ delta < 1 and 0 < confidence < 1; got {delta}, {confidence}")
    everyone = np.arange(m)
    if guesses is None:
        grid = sorted({min(max(k, 1), m // 2) for k in (*GUESS_GRID, m // 4, m // 2)})
        candidates: list[tuple[str | None, np.ndarray, int, int]] = [(None, everyone, k, k) for k in grid]
    elif isinstance(guesses, int):
        candidates = [(None, everyone, guesses, guesses)]
    else:
        k_plus, k_minus = guesses
        candidates = [(None, everyone, int(k_plus), int(k_minus))]
    for grouping in groupings if guesses is None else ():
        labels = np.asarray(grouping)
        if len(labels) != m:
            raise ValueError(f"need one group label per canary; got {len(labels)} for {m}")
        for label in dict.fromkeys(labels.tolist()):
            members = np.flatnonzero(labels == label)
            if len(members) // 4 and len(members) < m:
                candidates += _quarters(label, members)
    if not 0.0 < share_all <= 1.0:
        raise ValueError(f"need 0 < share_all <= 1; got {share_all}")
    pooled = [] if guesses is not None else _pool_candidates(pools, m)
    overall = sum(1 for c in candidates if c[0] is None)
    grouped = len(candidates) - overall + len(pooled)
    if target is not None and len(candidates) > overall:  # drop the group guess sets that cannot exceed the target
        floor = (1.0 - confidence) * (1.0 - share_all) / grouped  # their level if all were kept
        candidates = [
            c
            for c in candidates
            # all r guesses right and still not significant at the target: ε_lb ≤ target (p grows with ε)
            if c[0] is None or _one_run_p_value(len(c[1]), c[2] + c[3], c[2] + c[3], target, delta) < floor
        ]
    pool_labels = {c[0] for c in pooled}
    candidates += pooled
    share = 1.0 if overall == len(candidates) else share_all
    best: dict[str, Any] | None = None
    for label, members, k_plus, k_minus in candidates:
        n = len(members)
        if k_plus < 0 or k_minus < 0 or k_plus + k_minus > n:
            raise ValueError(f"need k+ + k− ≤ m = {n}; got {k_plus} + {k_minus}")
        alpha = (1.0 - confidence) * (share / overall if label is None else (1.0 - share) / (len(candidates) - overall))
        order = members[np.argsort(-s[members], kind="stable")]  # highest first
        v = int(inc[order[:k_plus]].sum() + (~inc[order[n - k_minus :]]).sum())
        r = k_plus + k_minus
        # given the other canaries' coins, a group's n canaries are audited; a pool, chosen from the output, keeps m
        audited = m if label in pool_labels else n
        if best is not None and _one_run_p_value(audited, r, v, best["epsilon_lb"], delta) >= alpha:
            continue  # not significant at the best ε so far: its own bound is no higher (p grows with ε)
        eps = _one_run_epsilon(audited, r, v, delta, alpha)
        if best is None or eps > best["epsilon_lb"]:
            best = {"epsilon_lb": eps, "k": (k_plus, k_minus), "correct": v, "guesses": r, "group": label}
            best["level_per_guess"] = alpha
    assert best is not None
    return {
        **best,
        "m": m,
        "delta": delta,
        "confidence": confidence,
        "tried": len(candidates),
    }


__all__ = ["clopper_pearson", "epsilon_lower_bound", "one_run_epsilon_lower_bound"]
