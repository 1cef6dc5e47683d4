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

Under distributed noise the release is the round's secure sum: every owner logs its own noisy sum at the canary
coordinates (the others hold the canaries with every coin "out"), and the audit adds the logs up (:func:`secure_sum`).
Banded noise is not read yet (a correlation to decode): ``--view server``.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ..config import ConfigError, RunConfig
from ..core.dpsgd import Canaries, epsilon_spent
from ..core.release_log import load
from .audit import one_run_epsilon_lower_bound
from .client_dp_audit import epsilon_estimate, gaussian_epsilon

CONFORMANCE_ALPHA = 0.01  # the conformance's false-alarm rate per audit, split evenly over its four families
FRESH_BOUND = 0.5  # noise fingerprints of two steps correlated above this are one noise (honest: |r| ~ 1/√512)


@dataclass
class Release:
    """The audited client's releases over the run, from its log: ``readings`` T × m (x_i,t, units of C),
    ``noise_var`` T × K (the noise's variance per step and tensor, units of C²), ``prints`` T × P (the noise at
    fixed coordinates, units of C), each canary's tensor, and the σ, C, q, B the accountant charged."""

    readings: np.ndarray
    noise_var: np.ndarray
    counts: np.ndarray
    free_var: np.ndarray  # T × K: the same away from the canary coordinates (what the scores may use)
    prints: np.ndarray
    tensor_names: list[str]
    canary_tensor: np.ndarray
    sigma: float
    clip: float
    rate: float
    batch: float
    step_index: np.ndarray | None = None  # T: each reading's DP-SGD step (the client's count)

    @property
    def steps(self) -> int:
        return int(self.readings.shape[0])


def read_release(folder: Path, canaries: Canaries) -> Release:
    """The log of every DP-SGD call in ``folder``, joined in step order."""
    calls = load(folder)
    if not calls:
        raise FileNotFoundError(f"no release log in {folder}: the run planted no canaries (privacy.audit_canaries)")
    sigma, clip, rate, batch = (float(v) for v in calls[0]["accounted"])
    names = [str(n) for n in calls[0]["tensor_names"]]
    for c in calls[1:]:
        if [str(n) for n in c["tensor_names"]] != names:
            raise ValueError(f"the release log in {folder} changes its tensors between calls")
    counts = calls[0]["counts"].astype(np.float64)
    free = calls[0]["free_counts"].astype(np.float64)
    free_var = np.concatenate([c["free_squares"] for c in calls]) / np.maximum(free, 1) / clip**2
    readings = np.concatenate([c["readings"] for c in calls]).astype(np.float64)
    slot = {n: t for t, n in enumerate(names)}
    tensor = np.asarray([slot[n] for n in canaries.names])
    for k in np.flatnonzero(free == 0):  # every coordinate a canary's: the mean square of its canaries' readings,
        held = tensor == k  # the release alone (a drawn canary adds q·C² to σ²C²: a bias of q/σ² at most)
        if held.any():
            free_var[:, k] = (readings[:, held] ** 2).mean(axis=1)
    return Release(
        readings=readings,
        noise_var=np.concatenate([c["noise_squares"] for c in calls]) / np.maximum(counts, 1) / clip**2,
        counts=counts,
        free_var=free_var,
        prints=np.concatenate([c["prints"] for c in calls]).astype(np.float64),
        tensor_names=names,
        canary_tensor=tensor,
        sigma=sigma,
        clip=clip,
        rate=rate,
        batch=batch,
        step_index=np.concatenate([int(c["first_step"]) + np.arange(len(c["readings"])) for c in calls]),
    )


def secure_sum(own: Release, others: list[Release]) -> Release:
    """Distributed noise: the release is the secure sum of every owner's noisy sum (each with its share of the
    noise; only the audited owner's holds canaries). Read at the canary coordinates, the owners' logs add up to it:
    the canaries' contribution plus every share, whose variances add (σ² = Σ σ_k²)."""
    for other in others:
        if other.step_index is None or own.step_index is None or not np.array_equal(other.step_index, own.step_index):
            raise ValueError(
                "the release audit of distributed noise reads every owner's share of every round: an owner sat out "
                "or dropped (set federation.clients_per_round = 0 and no faults for the audit)"
            )
    every = [own, *others]
    return Release(
        readings=np.sum([r.readings for r in every], axis=0),
        noise_var=np.sum([r.noise_var for r in every], axis=0),
        counts=own.counts,
        free_var=np.sum([r.free_var for r in every], axis=0),
        prints=np.sum([r.prints for r in every], axis=0),
        tensor_names=own.tensor_names,
        canary_tensor=own.canary_tensor,
        sigma=math.sqrt(sum(r.sigma**2 for r in every)),
        clip=own.clip,
        rate=own.rate,
        batch=own.batch,
        step_index=own.step_index,
    )


def read_run(cfg: RunConfig, canaries: Canaries) -> Release:
    """The release of an audit run (folder ``cfg.out``): the audited client's log, or under distributed noise the
    secure sum of every owner's."""
    from ..tasks.record_dp import AUDITED_CLIENT, release_folder

    own = read_release(release_folder(cfg, AUDITED_CLIENT), canaries)
    if cfg.privacy.noise != "distributed":
        return own
    clients = [c for c in range(cfg.federation.clients) if c != AUDITED_CLIENT]
    return secure_sum(own, [read_release(release_folder(cfg, c), canaries) for c in clients])


def _variance(rel: Release) -> np.ndarray:
    """T × m: the measured noise variance (units of C²) at each canary's reading, from the noise of its tensor's
    coordinates that hold no canary (of the step's whole release where every coordinate does): the release alone."""
    return np.maximum(rel.free_var[:, rel.canary_tensor], 1e-24)


def release_scores(rel: Release, rate: float) -> np.ndarray:
    """Each canary's log-likelihood ratio (see the module docstring): a function of the release alone."""
    a = (rel.readings - 0.5) / _variance(rel)
    if rate >= 1.0:
        return a.sum(axis=0)
    return np.logaddexp(math.log1p(-rate), math.log(rate) + a).sum(axis=0)


def normalised_sums(rel: Release) -> np.ndarray:
    """Σ_t x_i,t / √(Σ_t σ̂²): N(0, 1) for a canary that is out, N(μ, 1) in (full batches)."""
    return rel.readings.sum(axis=0) / np.sqrt(_variance(rel).sum(axis=0))


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
    tests = len(rel.counts) + rel.steps
    level = alpha / max(tests, 1)
    out = []
    sq = rel.noise_var * rel.counts  # Σ noise² per step and tensor, units of C²
    for axis, what in ((0, "tensor"), (1, "step")):
        n = rel.counts.sum() if axis == 1 else rel.counts * rel.steps
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
    y = x * x - rel.noise_var[:, rel.canary_tensor][:, included]  # the exact noise of the canary's tensor
    a, b = x.mean(axis=0), y.mean(axis=0)
    n = max(len(a), 2)
    m1, m2 = float(a.mean()), float(b.mean())
    z = float(stats.norm.isf(alpha / 4))
    q = rel.rate
    # σ̂² of a tensor is one estimate shared by all its canaries: its own error, 2σ⁴/n per step (χ²), adds to m₂'s
    # variance in proportion to the square of the tensor's share of the canaries (the whole of it in LoRA's small
    # adapters, where every coordinate holds a canary; next to nothing in a large matrix)
    tensors, share = np.unique(rel.canary_tensor[included], return_counts=True)
    steps = max(rel.steps, 1)
    shared = float(
        sum(
            (c / n) ** 2 * float((2 * rel.noise_var[:, k] ** 2 / max(rel.counts[k], 1)).sum()) / steps**2
            for k, c in zip(tensors, share)
        )
    )
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


def conformance(
    rel: Release, included: np.ndarray, claimed: dict[str, Any], delta: float, alpha: float = CONFORMANCE_ALPHA
) -> dict[str, Any]:
    """The mechanism measured in the release against the one the accountant charged (``claimed``: the run summary's
    entry for the audited client: σ, q, steps, ε). ``alpha`` is split evenly over noise, freshness, the moments and
    the steps' count (exact: no share needed, so a quarter is spare)."""
    share = alpha / 4
    noise = _noise_checks(rel, share)
    fresh = _fresh_check(rel, share)
    clipping, sampling = _moment_checks(rel, included, share)
    charged = int(claimed["steps"])
    steps = _check("steps", "accountant", rel.steps, rel.steps, rel.steps, charged, unit="releases logged")
    # the accountant: the ε of the mechanism it charged for (its σ and q, which the checks above test against the
    # release) over the steps the release shows, against the ε it reported
    reported = float(claimed["epsilon"])
    sigma, rate = float(claimed["noise_multiplier"]), float(claimed["sample_rate"])
    recomputed = epsilon_spent(sigma, rate, rel.steps, delta)
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
        min(c["estimate"] for c in noise) * rel.sigma / max(clipping["estimate"], 1e-9),
        min(max(sampling["estimate"], 1e-9), 1.0),
        rel.steps,
        delta,
    )
    checks = [steps, *noise, fresh, clipping, sampling, accountant]
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
    if p.noise_bands > 1:
        raise ConfigError(
            "the release view reads fresh noise; banded noise (privacy.noise_bands > 1) is not read yet (its release "
            "is a correlation to decode): use --view server"
        )


def evaluate(cfg: RunConfig, canaries: Canaries, summary: dict[str, Any]) -> dict[str, Any]:
    """The bound, μ̂ and the conformance of a finished audit run (its folder ``cfg.out``)."""
    from ..tasks.record_dp import AUDITED_CLIENT

    rel = read_run(cfg, canaries)
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
    mu = accountant_mu(rel.sigma, rel.rate, rel.steps)
    conf = conformance(rel, included, claimed, delta)
    broken = bound["epsilon_lb"] > reported
    return {
        "view": "release",
        "epsilon": reported,
        "mechanism": claimed,
        "delta": delta,
        "epsilon_lb": bound["epsilon_lb"],
        "ceiling": ceiling(rel.sigma, rel.rate, rel.steps, len(scores), delta, seed=cfg.seed),
        "mu_hat": mu_hat,
        "mu_accountant": mu,
        "epsilon_from_mu_hat": gaussian_epsilon(mu_hat, delta),
        "epsilon_estimate": epsilon_estimate(sums, included, delta),
        "canaries": len(scores),
        "included": int(included.sum()),
        "steps_logged": rel.steps,
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

    from ..engine.inprocess import run_in_process
    from ..tasks.record_dp import release_folder
    from ..tasks.run import load_task

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


def format_result(result: dict[str, Any]) -> str:
    """The release audit's bound, μ and conformance as a markdown table."""
    lines = [
        f"release view: {result['steps_logged']} DP-SGD steps read · ε_lb {result['epsilon_lb']:.3f} against the "
        f"ideal mechanism's {result['ceiling']:.3f} (the most one run shows at this σ, q, T and m) · "
        f"μ̂ {result['mu_hat']:.3f} (ε {result['epsilon_from_mu_hat']:.3f}) vs the accountant's μ "
        f"{result['mu_accountant']:.3f} · ε of the measured mechanism {result['conformance']['epsilon_measured']:.3f}",
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
    "evaluate",
    "read_release",
    "release_scores",
    "supported",
]
