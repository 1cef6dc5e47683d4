"""The white-box record-level audit (``trustformer attack audit --view release``, the default): the ε a run reports,
checked against what each DP-SGD step **released**, and the mechanism checked against what the accountant charged.

The audited client (client 0) holds ``privacy.audit_canaries`` = m gradient canaries (``core/dpsgd.py``), each in its
data with probability ½, drawn by the records' own Poisson sampler and clipped by the same per-record clipping. In an
audit run its DP-SGD logs every step's release (``core/release_log.py``): at each canary's coordinate, the canary's
signed contribution plus the noise, x_i,t (units of C), and the noise away from the canaries. This module reads
that log.

**The bound.** Each canary's score is the log-likelihood ratio of its readings, Σ_t log(1 − q + q·exp((x_i,t − ½)/σ̂²)),
the most powerful test of "drawn at rate q with contribution C" against "absent" per step (σ̂: the noise measured on
the canary's tensor, from the release alone; q the accounted rate). The scores and coins give ε_lb at 95% in one run
(Steinke, Nasr & Jagielski 2023; ``attack/audit.py``). Beside it: μ̂, the Gaussian-DP parameter estimated from the in
and out distributions of the normalised sum Σ_t x_i,t / √(Σ_t σ̂_t²) (Andrew et al. 2024's estimate: exact for full
batches, the CLT for Poisson), against the accountant's μ (√T/σ, or q·√(T(e^{1/σ²} − 1)) for Poisson; Dong, Roth & Su
2022), and the ``ceiling``: the ε_lb the same bound reaches on the ideal mechanism at the accounted σ, q, T with the
same m canaries (simulated), which shows how tight one run can be at all.

**Conformance** (from the same log; each an interval at the audit's level, its claim outside fails the audit, naming
the step of DP-SGD): ``steps`` (the releases logged = the steps charged); ``noise`` (σ̂/σ per tensor and per step, a χ²
interval); ``noise_fresh`` (no two steps' noise alike: the correlation of their fingerprints); ``clipping`` (Ĉ/C, the
contribution a drawn canary makes) and ``sampling`` (q̂, how often an included canary shows), from the included
canaries' first two moments, E x = q·C and E x² − σ̂² = q·C², each held to the claim by a z-test, the step named
by which of Ĉ = m₂/m₁ and q̂ = m₁²/m₂ is further off; ``accountant`` (the ε of the
σ and q it charged, which the checks above hold against the release, over the steps released, above the reported ε
fails). ``epsilon_measured``: the ε of the point estimates σ̂/Ĉ, q̂ and T, beside the reported one.

Reading the log, the secure sum of distributed noise's shares and the decoding of banded noise: ``release_view.py``.
"""

from __future__ import annotations

import math
import shutil
from typing import Any

import numpy as np
from scipy import stats

from trustformer.config import ConfigError, RunConfig
from trustformer.core.dpsgd import epsilon_spent
from trustformer.core.grad_canaries import Canaries

from .audit import one_run_epsilon_lower_bound
from .client_dp_audit import epsilon_estimate, gaussian_epsilon
from .release_view import Release, decode_banded, read_release, read_run, reading_variance

CONFORMANCE_ALPHA = 0.01  # the conformance's false-alarm rate per audit, split evenly over its four families
FRESH_BOUND = 0.5  # noise fingerprints of two steps correlated above this are one noise (honest: |r| ~ 1/√512)


def release_scores(rel: Release, rate: float) -> np.ndarray:
    """Each canary's log-likelihood ratio (see the module docstring): a function of the release alone."""
    a = (rel.readings - 0.5) / reading_variance(rel)
    if rate >= 1.0:
        return a.sum(axis=0)
    return np.logaddexp(math.log1p(-rate), math.log(rate) + a).sum(axis=0)


def normalised_sums(rel: Release) -> np.ndarray:
    """Σ_t (x_i,t / σ̂_t²) / √(Σ_t 1/σ̂_t²) (Σ_t x_i,t / √(T σ̂²) at a constant σ̂): N(0, 1) for a canary that is out,
    N(μ, 1) in (full batches)."""
    var = reading_variance(rel)
    return (rel.readings / var).sum(axis=0) / np.sqrt((1.0 / var).sum(axis=0))


def accountant_mu(sigma: float, rate: float, steps: int) -> float:
    """The mechanism's μ-GDP: √T/σ for full batches, the CLT's q·√(T(e^{1/σ²} − 1)) under Poisson sampling."""
    if sigma <= 0:
        return math.inf
    if rate >= 1.0:
        return math.sqrt(steps) / sigma
    return rate * math.sqrt(steps * math.expm1(1.0 / sigma**2))


def ceiling(
    sigma: float, rate: float, steps: int, canaries: int, delta: float, seed: int = 0, repeats: int = 3
) -> float:
    """The ε_lb this audit reaches on the ideal mechanism (its accounted σ, q, T; m canaries, half in; no model),
    the mean of ``repeats`` simulations: the most one run can show, whatever the implementation (simulation seeds
    from ``seed``: not privacy randomness)."""
    return float(np.mean([_ideal(sigma, rate, steps, canaries, delta, seed + i) for i in range(repeats)]))


def _ideal(sigma: float, rate: float, steps: int, canaries: int, delta: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    included = rng.random(canaries) < 0.5
    drawn = rng.random((steps, canaries)) < rate
    readings = (drawn & included).astype(np.float64) + sigma * rng.standard_normal((steps, canaries))
    ideal = Release(
        readings=readings,
        noise_var=np.full((steps, 1), sigma**2),
        counts=np.ones(1),
        free_var=np.full((steps, 1), sigma**2),
        prints=np.zeros((steps, 0)),
        tensor_names=["ideal"],
        canary_tensor=np.zeros(canaries, dtype=int),
        sigma=sigma,
        clip=1.0,
        rate=rate,
        batch=1.0,
    )
    return float(one_run_epsilon_lower_bound(release_scores(ideal, rate), included, delta)["epsilon_lb"])


# ------------------------------------------------------------------------------ conformance


def _check(name: str, step: str, estimate: float, low: float, high: float, claimed: float, **more: Any) -> dict:
    ok = bool(low <= claimed <= high)
    return {
        "check": name,
        "step": step,
        "estimate": estimate,
        "interval": [low, high],
        "claimed": claimed,
        "verdict": "pass" if ok else "fail",
        **more,
    }


def _noise_checks(rel: Release, alpha: float) -> list[dict]:
    """σ̂/σ per tensor (pooled over the steps) and per step (pooled over the tensors), each a two-sided χ² interval,
    Bonferroni over the K + T of them: the worst of each is reported."""
    steps = rel.noise_var.shape[0]
    tests = len(rel.counts) + steps
    level = alpha / max(tests, 1)
    out = []
    sq = rel.noise_var * rel.counts  # Σ noise² per step and tensor, units of C²
    for axis, what in ((0, "tensor"), (1, "step")):
        n = rel.counts.sum() if axis == 1 else rel.counts * steps
        n = np.broadcast_to(n, sq.sum(axis=axis).shape).astype(np.float64)
        seen = n > 0  # a tensor whose every coordinate holds a canary has no noise of its own to measure
        n = np.maximum(n, 1.0)
        ratio = np.where(seen, np.sqrt(sq.sum(axis=axis) / n) / rel.sigma, 1.0)
        lo = np.where(seen, np.sqrt(stats.chi2.ppf(level / 2, n) / n), 0.0)  # σ̂/σ's range under the claim
        hi = np.where(seen, np.sqrt(stats.chi2.isf(level / 2, n) / n), np.inf)
        bad = np.flatnonzero((ratio < lo) | (ratio > hi))
        worst = int(bad[np.argmax(np.abs(np.log(ratio[bad])))]) if len(bad) else int(np.argmin(ratio))
        label = rel.tensor_names[worst] if what == "tensor" else f"step {worst}"
        # the interval of σ̂/σ itself at the worst: the claim (1) must lie in [ratio / hi, ratio / lo]
        out.append(
            _check(
                f"noise per {what}",
                "noise",
                float(ratio[worst]),
                float(ratio[worst] / hi[worst]),
                float(ratio[worst] / lo[worst]),
                1.0,
                where=label,
                failing=[rel.tensor_names[i] if what == "tensor" else int(i) for i in bad[:8]],
            )
        )
    return out


def _fresh_check(rel: Release, alpha: float) -> dict:
    """The largest correlation between two steps' noise fingerprints: honest noise gives |r| ≈ 1/√P; a noise that
    repeats (a generator reseeded, a cached draw) gives r ≈ 1."""
    p = rel.prints
    if p.shape[0] < 2 or p.shape[1] < 16:
        return _check("noise_fresh", "noise", 0.0, -1.0, 1.0, 0.0, pairs=0)
    u = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-300)
    g = u @ u.T
    iu = np.triu_indices(len(u), 1)
    r = g[iu]
    worst = int(np.argmax(np.abs(r)))
    pairs = len(r)
    bound = min(FRESH_BOUND, float(stats.norm.isf(alpha / (2 * pairs))) / math.sqrt(p.shape[1]))
    return {
        "check": "noise_fresh",
        "step": "noise",
        "estimate": float(r[worst]),
        "interval": [-bound, bound],  # where an honest run's largest correlation lies
        "claimed": 0.0,
        "verdict": "pass" if abs(r[worst]) <= bound else "fail",
        "where": f"steps {int(iu[0][worst])} and {int(iu[1][worst])}",
        "pairs": pairs,
    }


def _moment_checks(rel: Release, included: np.ndarray, alpha: float) -> tuple[dict, dict]:
    """Clipping and sampling from the included canaries' readings (see the module docstring). The claim (C, q) says
    E x = q and E x² − σ̂² = q (units of C): each mean (over the canaries, each canary's mean over the steps one
    sample; m₂'s variance with that of σ̂², which all of a tensor's canaries share) is held to q by a two-sided z-test
    at ``alpha`` / 2. If either fails, the step named is the one whose
    estimate, Ĉ = m₂/m₁ (full batches: m₁) against 1 or q̂ = m₁²/m₂ (at most 1) against q, is further off (a log
    ratio); each estimate is reported with its delta-method interval."""
    x = rel.readings[:, included]
    exact = rel.reading_var if rel.reading_var is not None else rel.noise_var[:, rel.canary_tensor]
    y = x * x - exact[:, included]  # the exact noise of the canary's tensor
    a, b = x.mean(axis=0), y.mean(axis=0)
    n = max(len(a), 2)
    m1, m2 = float(a.mean()), float(b.mean())
    z = float(stats.norm.isf(alpha / 4))
    q = rel.rate
    # σ̂² of a tensor is one estimate shared by all its canaries: its own error, 2σ⁴/n per step (χ²), adds to m₂'s
    # variance in proportion to the square of the tensor's share of the canaries (the whole of it in LoRA's small
    # adapters, where every coordinate holds a canary; next to nothing in a large matrix)
    tensors, share = np.unique(rel.canary_tensor[included], return_counts=True)
    if rel.variance_error is not None:
        error = rel.variance_error
    else:
        error = (2 * rel.noise_var**2 / np.maximum(rel.counts, 1)).sum(axis=0) / max(rel.steps, 1) ** 2
    shared = float(sum((c / n) ** 2 * float(error[k]) for k, c in zip(tensors, share, strict=True)))
    var_first, var_second = float(a.var(ddof=1)) / n, float(b.var(ddof=1)) / n + shared
    off_first = abs(m1 - q) > z * math.sqrt(var_first)
    off_second = abs(m2 - q) > z * math.sqrt(var_second)
    cov = np.cov(np.vstack([a, b])) / n
    cov[1, 1] = var_second
    c_hat = m2 / m1 if m1 > 0 else math.inf
    q_hat = m1 * m1 / m2 if m2 > 0 else math.inf
    grad_c = np.array([-m2 / m1**2, 1.0 / m1]) if m1 > 0 else np.zeros(2)
    grad_q = np.array([2 * m1 / m2, -(m1**2) / m2**2]) if m2 > 0 else np.zeros(2)
    c_se = math.sqrt(max(float(grad_c @ cov @ grad_c), 0.0))
    q_se = math.sqrt(max(float(grad_q @ cov @ grad_q), 0.0))
    if q >= 1.0:  # full batches: every included canary in every step, E x = C itself (far tighter than m₂/m₁)
        c_hat, c_se = m1, math.sqrt(float(cov[0, 0]))

    def distance(value: float, claim: float) -> float:
        return abs(math.log(value / claim)) if 0 < value < math.inf else math.inf

    blamed = None
    if off_first or off_second:
        # no sampler draws above 1: a q̂ beyond it is noise, and what is off is the contribution
        blamed = "clipping" if distance(c_hat, 1.0) >= distance(min(q_hat, 1.0), q) else "sampling"
    common = {"first_moment": m1, "second_moment": m2, "moment_test_failed": bool(off_first or off_second)}
    clipping = {
        "check": "clipping",
        "step": "clipping",
        "estimate": c_hat,
        "interval": [c_hat - z * c_se, c_hat + z * c_se],
        "claimed": 1.0,
        "verdict": "fail" if blamed == "clipping" else "pass",
        "unit": "C",
        **common,
    }
    sampling = {
        "check": "sampling",
        "step": "sampling",
        "estimate": q_hat,
        "interval": [q_hat - z * q_se, q_hat + z * q_se],
        "claimed": q,
        "verdict": "fail" if blamed == "sampling" else "pass",
        **common,
    }
    return clipping, sampling


def _min_sep_check(rel: Release, included: np.ndarray, alpha: float) -> dict | None:
    """Banded noise: b-min-sep sampling draws canary i at its group's steps only, so at every other step its release
    is noise alone, in or out. The included canaries' mean there, less the excluded ones' (the same noise, no coin),
    is held to 0 by a two-sample z-test at ``alpha``: a record drawn outside its group shows."""
    if rel.off_group is None or included.all() or not included.any():
        return None
    inside, outside = rel.off_group[included], rel.off_group[~included]
    diff = float(inside.mean() - outside.mean())
    se = math.sqrt(float(inside.var(ddof=1)) / len(inside) + float(outside.var(ddof=1)) / len(outside))
    half = float(stats.norm.isf(alpha / 2)) * se
    return _check("min_sep", "sampling", diff, diff - half, diff + half, 0.0, unit="C, at other groups' steps")


def conformance(
    rel: Release, included: np.ndarray, claimed: dict[str, Any], delta: float, alpha: float = CONFORMANCE_ALPHA
) -> dict[str, Any]:
    """The mechanism measured in the release against the one the accountant charged (``claimed``: the run summary's
    entry for the audited client: σ, q, steps, ε). ``alpha`` is split evenly over noise, freshness, the moments and
    the steps' count (exact: no share needed, so its quarter goes to banded noise's ``min_sep``)."""
    share = alpha / 4
    noise = _noise_checks(rel, share)
    fresh = _fresh_check(rel, share)
    clipping, sampling = _moment_checks(rel, included, share)
    charged = int(claimed["steps"])
    steps = _check("steps", "accountant", rel.releases, rel.releases, rel.releases, charged, unit="releases logged")
    min_sep = _min_sep_check(rel, included, share)  # banded noise: the steps' count is exact, its share is spare
    # the accountant: the ε of the mechanism it charged for (its σ and q, which the checks above test against the
    # release) over the steps the release shows, against the ε it reported
    reported = float(claimed["epsilon"])
    sigma, rate = float(claimed["noise_multiplier"]), float(claimed["sample_rate"])
    recomputed = epsilon_spent(sigma / rel.column, rate, rel.steps, delta)  # banded: σ/‖C‖_col over T/b steps
    accountant = {
        "check": "accountant",
        "step": "accountant",
        "estimate": recomputed,
        "interval": [0.0, reported * 1.01],
        "claimed": reported,
        "verdict": "pass"
        if recomputed <= reported * 1.01 and math.isclose(sigma, rel.sigma, rel_tol=1e-6) and rate == rel.rate
        else "fail",
        "unit": "epsilon of the charged sigma and q over the steps released vs reported (1% rounding)",
    }
    # ε of the mechanism as measured (point estimates; the least noise any tensor or step got), for the report
    measured = epsilon_spent(
        min(c["estimate"] for c in noise) * rel.effective_sigma / max(clipping["estimate"], 1e-9),
        min(max(sampling["estimate"], 1e-9), 1.0),
        rel.steps,
        delta,
    )
    checks = [steps, *noise, fresh, clipping, sampling, *([min_sep] if min_sep else []), accountant]
    failed = [c for c in checks if c["verdict"] == "fail"]
    return {
        "verdict": "fail" if failed else "pass",
        "failed_steps": sorted({c["step"] for c in failed}),
        "checks": checks,
        "epsilon_measured": measured,
        "alpha": alpha,
    }


# ------------------------------------------------------------------------------ the audit


def supported(cfg: RunConfig) -> None:
    """The runs whose releases this audit reads (the others: ``--view server``)."""
    p = cfg.privacy
    if p.unit != "record" or not p.audit_canaries:
        raise ConfigError("the audit needs privacy.unit = 'record' and privacy.audit_canaries > 0")
    if p.noise_bands > 1 and p.noise == "distributed" and cfg.federation.rounds % p.noise_bands:
        raise ConfigError(
            f"the release view of banded noise reads whole windows of privacy.noise_bands = {p.noise_bands} steps "
            f"(one a round): set federation.rounds = {cfg.federation.rounds} to a multiple of {p.noise_bands}"
        )


def evaluate(cfg: RunConfig, canaries: Canaries, summary: dict[str, Any]) -> dict[str, Any]:
    """The bound, μ̂ and the conformance of a finished audit run (its folder ``cfg.out``)."""
    from trustformer.tasks.dp_canaries import AUDITED_CLIENT

    rel = decode_banded(read_run(cfg, canaries))
    privacy = summary.get("privacy") or {}
    claimed = (privacy.get("clients") or {}).get(str(AUDITED_CLIENT))
    if claimed is None:
        raise ValueError(f"the run's summary reports no DP-SGD for client {AUDITED_CLIENT}")
    included = np.asarray(canaries.included, dtype=bool)
    delta = cfg.privacy.delta
    reported = float(claimed["epsilon"])
    scores = release_scores(rel, rel.rate)
    groupings = [list(canaries.groups), list(canaries.kinds)] if canaries.groups else []
    bound = one_run_epsilon_lower_bound(scores, included, delta, groupings=groupings, target=reported)
    sums = normalised_sums(rel)
    inside, outside = sums[included], sums[~included]
    mu_hat = float((inside.mean() - outside.mean()) / outside.std(ddof=1)) if len(outside) > 1 else 0.0
    mu = accountant_mu(rel.effective_sigma, rel.rate, rel.steps)
    conf = conformance(rel, included, claimed, delta)
    broken = bound["epsilon_lb"] > reported
    return {
        "view": "release",
        "epsilon": reported,
        "mechanism": claimed,
        "delta": delta,
        "epsilon_lb": bound["epsilon_lb"],
        "ceiling": ceiling(rel.effective_sigma, rel.rate, rel.steps, len(scores), delta, seed=cfg.seed),
        "mu_hat": mu_hat,
        "mu_accountant": mu,
        "epsilon_from_mu_hat": gaussian_epsilon(mu_hat, delta),
        "epsilon_estimate": epsilon_estimate(sums, included, delta),
        "canaries": len(scores),
        "included": int(included.sum()),
        "steps_logged": rel.releases,
        "bands": rel.bands,
        "guesses": bound.get("guesses"),
        "correct": bound.get("correct"),
        "k": bound.get("k"),
        "group": bound.get("group"),
        "tried": bound.get("tried"),
        "conformance": conf,
        "verdict": "fail" if broken or conf["verdict"] == "fail" else "pass",
        "failed_because": (["epsilon_lb > epsilon"] if broken else []) + conf["failed_steps"],
    }


def audit(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` in this process with its canaries, then read its releases (see the module docstring)."""
    import time

    from trustformer.engine.inprocess import run_in_process
    from trustformer.tasks.dp_canaries import release_folder
    from trustformer.tasks.run import load_task

    supported(cfg)
    shutil.rmtree(release_folder(cfg), ignore_errors=True)  # a log of an earlier run in this folder is not this run's
    started = time.perf_counter()
    summary = run_in_process(cfg)
    wall_s = time.perf_counter() - started
    task: Any = load_task(cfg)
    canaries = task.audit_canaries()
    result = evaluate(cfg, canaries, summary)
    result.update(
        target_epsilon=cfg.privacy.epsilon,
        strategy=cfg.federation.strategy,
        secure=cfg.secure.mode,
        test_loss=summary.get("test_loss"),
        wall_s=wall_s,
        delta_slack=2 * len(canaries.names) * cfg.privacy.delta,
    )
    return result


def _windows(result: dict[str, Any]) -> str:
    b = int(result.get("bands", 1))
    return f" (banded: decoded into {result['steps_logged'] // b} windows of {b})" if b > 1 else ""


def format_result(result: dict[str, Any]) -> str:
    """The release audit's bound, μ and conformance as a markdown table."""
    lines = [
        f"release view: {result['steps_logged']} DP-SGD steps read{_windows(result)} · "
        f"ε_lb {result['epsilon_lb']:.3f} against the "
        f"ideal mechanism's {result['ceiling']:.3f} (the most one run shows at this σ, q, T and m) · "
        f"μ̂ {result['mu_hat']:.3f} (ε {result['epsilon_from_mu_hat']:.3f}) vs the accountant's μ "
        f"{result['mu_accountant']:.3f} · ε of the point estimates {result['conformance']['epsilon_measured']:.3f} "
        "(the least noise of any tensor or step: above ε by chance alone; the checks below are the test)",
        "",
        "| check | step of DP-SGD | estimate | interval | claimed | verdict | where |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["conformance"]["checks"]:
        lo, hi = c["interval"]
        lines.append(
            f"| {c['check']} | {c['step']} | {c['estimate']:.4g} | [{lo:.4g}, {hi:.4g}] | {c['claimed']:.4g} | "
            f"{c['verdict']} | {c.get('where', '')} |"
        )
    return "\n".join(lines)


__all__ = [
    "Release",
    "format_result",
    "accountant_mu",
    "audit",
    "ceiling",
    "conformance",
    "decode_banded",
    "evaluate",
    "read_release",
    "release_scores",
    "supported",
]
