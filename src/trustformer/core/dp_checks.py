"""Checks in every record-level DP run (``privacy.checks``, on by default): the ε a run reports, checked where it
is spent, from what the client itself holds during DP-SGD (``core/dpsgd.py``).

A :class:`StepChecks` (``core/dp_watch.py``) watches one ``dp_sgd`` call: each Poisson draw's size, each clipping
call (Opacus' ``clip_and_accumulate``, wrapped on the optimizer instance, so that whatever optimizer class runs is the
one watched), each release (the noisy sum minus the clipped sum, which the client holds: the noise, summarised per
tensor, never kept) and each step of the client's optimizer. :func:`merge` adds a call to the client's run
record (kept in its optimizer's saved state, so it spans rounds and survives a resume), and :func:`evaluate`
tests the whole run so far after every round:

``steps``
    the optimizer steps taken, and the noise releases made, equal the steps the accountant charged (exact).
``sampling_rate``
    the records drawn over the run, Σ b_t, fit Binomial(Σ n_t, q) for the q the accountant charges (an exact
    two-sided binomial test: each draw is Poisson sampling at rate q, so the total is binomial); q = 1: every
    record, every step.
``sampling_dispersion``
    the draws' dispersion Σ (b_t − n_t q)² / (n_t q (1 − q)) against χ²(T) (two-sided: a fixed-size batch is too
    regular); only from 20 steps with n_t q (1 − q) ≥ 5, where the χ² approximation holds.
``clipping``
    the clipped sum is the sum of the records' gradients each clipped to C, Σ min(1, C/‖g_i‖) g_i, so that no
    clipped per-record norm exceeds C: checked on a fixed random probe r (Freivalds): ⟨clipped sum, r⟩ against
    Σ min(1, C/‖g_i‖) ⟨g_i, r⟩, the residual relative to Σ min(‖g_i‖, C), at most 1e-3 (float32 rounding
    leaves about 1e-7; a record clipped at 2C leaves about 1/√B).
``noise``
    on every tensor the noise has standard deviation σ·C (the owner's share σ·C/√k under distributed noise;
    the banded recurrence's own std per step under ``privacy.noise_bands``): Σ (x/σC)² over its n draws against
    χ²(n), mean known to be 0, two-sided; the statistic is the worst tensor's std / σC, with its interval.
``noise_fresh``
    no step's noise repeats an earlier step's (within or across rounds): each step's noise is fingerprinted by 8
    of its coordinates (one in each of the 8 largest tensors, fixed), divided by their std: N(0, 1) each; two
    steps closer than 0.01 in all 8 fail (chance: about (0.006)⁸ per pair).
``min_sep``
    banded noise only (``privacy.noise_bands`` = b > 1): no step draws from more records than one b-min-sep group
    holds, ⌈n/b⌉ of the owner's n (exact), so that no record is drawn twice in b consecutive steps.
``accountant``
    ε recomputed from the σ, the q and the steps counted above by a second, independent accountant (Google's
    ``dp-accounting`` PLD accountant, pessimistic, discretisation 1e-3) is at most the reported ε (Opacus' RDP)
    and not far below it: PLD ε / RDP ε in [0.75, 1.01] (RDP over-estimates by 7–15 % in every setting tried,
    ε from 0.5 to 20, q from 0.01 to 1).

False alarms: the statistical checks (``sampling_rate``, ``sampling_dispersion``, ``noise``) share α = 1e-4 for
the whole run: Bonferroni over the clients, the three checks, the rounds (each round tests the run so far) and,
for ``noise``, the tensors; each two-sided. The others cannot fail an honest run (exact counts; rounding three
orders of magnitude below their thresholds). A failed check raises :class:`DPCheckError` in the client before it
replies: nothing of the round leaves it, and the server stops the run (``runtime/rounds.py``), keeping the last
round's checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .accounting import PrivacyBudgetError
from .dp_watch import CLIP_TOLERANCE, Mechanism, StepChecks

# the run's false-alarm rate, Bonferroni-split over clients, checks, rounds, tensors: a false alarm stops a run, and
# a test suite runs dozens of them (1e-2 would fail one suite run in ten or so)
RUN_ALPHA = 1e-4
STATISTICAL = ("sampling_rate", "sampling_dispersion", "noise")
FRESH_THRESHOLD = 0.01
PLD_BAND = (0.75, 1.01)
PLD_DISCRETIZATION = 1e-3
DISPERSION_MIN_STEPS = 20
DISPERSION_MIN_VARIANCE = 5.0
MARK = "DP check '"  # how the server recognises a failed check in a client's error reply
RECORD_KEY = "dp_checks"  # the run record in the client optimizer's first parameter group (saved with it)

CHECKS = (
    "steps",
    "sampling_rate",
    "sampling_dispersion",
    "clipping",
    "noise",
    "noise_fresh",
    "min_sep",
    "accountant",
)
WHAT = {
    "steps": "optimizer steps taken (= noise releases) vs steps charged to epsilon",
    "sampling_rate": "share of records drawn over the run vs the exact Binomial(sum n_t, q) interval",
    "sampling_dispersion": "sum (b_t - n_t q)^2 / (n_t q (1 - q)) / T vs chi2(T)/T",
    "clipping": "relative residual of the clipped sum against sum min(1, C/|g_i|) g_i on a random probe",
    "noise": "std / (sigma C) of the noise on the worst tensor vs its chi-square interval",
    "noise_fresh": "smallest distance between two steps' noise fingerprints (8 standardised coordinates), capped at 1",
    "min_sep": "banded noise: the most records a step drew from vs one b-min-sep group's ceil(n / b)",
    "accountant": "PLD epsilon (dp-accounting) / reported RDP epsilon",
}


NOT_SEEN = [
    "per-record gradients that Opacus' hooks compute wrongly: the clipping check takes them as the truth "
    "(tests/test_record_dp.py compares them with one backward pass per record; the one-run audit sees the rest)",
    "noise that has the right distribution but is known to someone (privacy.noise_source = 'seeded-not-private' "
    "is reported as not private), or that is shared across owners: each owner sees its own noise only",
    "noise missing on a small part of one tensor: the chi-square over the tensor's draws sees it in proportion "
    "to the share of the tensor and the steps it affects",
    "noise repeated on some tensors only: the fingerprint reads one coordinate in each of the 8 largest tensors, a "
    "repeat must cover all 8 (a repeat within one round's steps or across rounds, of the whole noise, is seen)",
    "a sampling rate planted above q = 1: the draw cannot exceed every record, so there is nothing to see",
    "the accountants' shared model (Poisson-subsampled Gaussian, add-or-remove-one): a bug in what both assume",
    "a lost optimizer state: the run record (step count, draws, fingerprints) is kept in it",
]


class DPCheckError(PrivacyBudgetError):
    """A check of ``privacy.checks`` failed: the mechanism that ran is not the one ε was reported for."""


# ------------------------------------------------------------------------------ the run record


def new_record(charged_before: int) -> dict[str, Any]:
    """An empty run record; ``charged_before``: steps charged before this optimizer's first checked call (LiRA's
    reference models start mid-run, DP fine-tuning after the rounds), taken as counted."""
    return {
        "base": int(charged_before),
        "steps": 0,
        "releases": 0,
        "population": 0,
        "drawn": 0,
        "draws": 0,
        "dispersion": 0.0,
        "variance_min": math.inf,
        "rates": [],
        "noise": {},
        "prints": [],
        "clip_residual": 0.0,
        "clip_first_bad": -1,
        "max_norm": 0.0,
        "looks": 0,
        "records_max": 0,
        "pool": 0,
    }


def merge(record: dict[str, Any], call: StepChecks) -> dict[str, Any]:
    """``record`` with ``call`` added (in place; JSON-able values only, for the optimizer's saved state)."""
    q = call.mechanism.sample_rate
    done = record["base"] + record["releases"]
    if call.clip_first_bad >= 0 and record["clip_first_bad"] < 0:
        record["clip_first_bad"] = done + call.clip_first_bad + 1
    record["steps"] += call.steps
    record["releases"] += call.releases
    for population, count in call.draws:
        record["population"] += population
        record["drawn"] += count
        record["draws"] += 1
        variance = population * q * (1 - q)
        record["variance_min"] = min(record["variance_min"], variance)
        if variance > 0:
            record["dispersion"] += (count - population * q) ** 2 / variance
    if q not in record["rates"]:
        record["rates"].append(q)
    if call.mechanism.noise_std <= 0:
        record["noiseless"] = True
    for name, (n, s2, raw) in call.noise.items():
        entry = record["noise"].setdefault(name, [0, 0.0, 0.0])
        entry[0] += n
        entry[1] += s2
        entry[2] = max(entry[2], raw)
    record["prints"].extend(call.prints)
    record["clip_residual"] = max(record["clip_residual"], call.clip_residual)
    record["max_norm"] = max(record["max_norm"], call.max_norm)
    record["records_max"] = max(record.get("records_max", 0), call.records_max)
    if call.mechanism.pool:
        record["pool"] = call.mechanism.pool
    return record


# ------------------------------------------------------------------------------ the tests


@dataclass(frozen=True)
class Check:
    name: str
    statistic: float | None  # None: skipped
    lo: float | None
    hi: float | None
    passed: bool
    detail: str

    @property
    def verdict(self) -> str:
        return "skipped" if self.statistic is None else "pass" if self.passed else "fail"


@dataclass(frozen=True)
class Reported:
    """What the client's accountant charged: steps, the ε it reports, and the mechanism it reports it for."""

    steps: int
    epsilon: float
    noise_multiplier: float
    sample_rate: float
    delta: float
    bands: int = 1
    column_norm: float = 1.0


def alpha_per_test(clients: int, looks: int) -> float:
    """Each statistical check's α at one look: the run's α over clients × checks × rounds (Bonferroni)."""
    return RUN_ALPHA / (max(1, clients) * len(STATISTICAL) * max(1, looks))


def evaluate(record: dict[str, Any], reported: Reported, *, clients: int, looks: int) -> list[Check]:
    """Every check on the run so far (see the module docstring)."""
    record["looks"] += 1
    alpha = alpha_per_test(clients, looks)
    return [
        _steps(record, reported),
        _sampling_rate(record, alpha),
        _sampling_dispersion(record, alpha),
        _clipping(record),
        _noise(record, alpha),
        _noise_fresh(record),
        _min_sep(record),
        _accountant(record, reported),
    ]


def _steps(record: dict[str, Any], reported: Reported) -> Check:
    taken, released = record["base"] + record["steps"], record["base"] + record["releases"]
    ok = taken == released == reported.steps
    return Check(
        "steps",
        float(taken),
        float(reported.steps),
        float(reported.steps),
        ok,
        f"{taken} optimizer steps taken and {released} noise releases made, {reported.steps} charged to epsilon",
    )


def _sampling_rate(record: dict[str, Any], alpha: float) -> Check:
    from scipy import stats

    n, drawn, rates = record["population"], record["drawn"], record["rates"]
    if not n:
        return Check("sampling_rate", None, None, None, True, "no draws yet")
    q = rates[0]
    if len(rates) > 1:  # the rate changed between calls (a different data size): the normal approximation
        return Check("sampling_rate", None, None, None, True, f"rates {rates} differ between calls: not tested")
    if q >= 1.0:
        lo = hi = float(n)
    else:
        lo, hi = float(stats.binom.ppf(alpha / 2, n, q)), float(stats.binom.isf(alpha / 2, n, q))
    ok = lo <= drawn <= hi
    return Check(
        "sampling_rate",
        drawn / n,
        lo / n,
        hi / n,
        ok,
        f"{drawn} records drawn of {n} chances at q = {q:.4g}: rate {drawn / n:.4g}, outside [{lo / n:.4g}, "
        f"{hi / n:.4g}] (exact binomial, alpha = {alpha:.2g})",
    )


def _sampling_dispersion(record: dict[str, Any], alpha: float) -> Check:
    from scipy import stats

    t = record["draws"]
    if t < DISPERSION_MIN_STEPS or record["variance_min"] < DISPERSION_MIN_VARIANCE:
        return Check(
            "sampling_dispersion",
            None,
            None,
            None,
            True,
            f"needs {DISPERSION_MIN_STEPS} draws with n q (1 - q) >= {DISPERSION_MIN_VARIANCE:g} (q = 1: exact rate)",
        )
    lo, hi = float(stats.chi2.ppf(alpha / 2, t)) / t, float(stats.chi2.isf(alpha / 2, t)) / t
    value = record["dispersion"] / t
    return Check(
        "sampling_dispersion",
        value,
        lo,
        hi,
        lo <= value <= hi,
        f"batch-size dispersion {value:.3g} over {t} draws, outside [{lo:.3g}, {hi:.3g}] (chi2, alpha = {alpha:.2g})",
    )


def _min_sep(record: dict[str, Any]) -> Check:
    pool, seen = int(record.get("pool", 0)), int(record.get("records_max", 0))
    if not pool:
        return Check("min_sep", None, None, None, True, "fresh noise: every step may draw from all the records")
    return Check(
        "min_sep",
        float(seen),
        0.0,
        float(pool),
        seen <= pool,
        f"a step drew from {seen} records, more than the {pool} of one b-min-sep group (privacy.noise_bands): a record "
        "may then be drawn in two of b consecutive steps, which the banded accounting does not charge",
    )


def _clipping(record: dict[str, Any]) -> Check:
    value = record["clip_residual"]
    first = record["clip_first_bad"]
    return Check(
        "clipping",
        value,
        0.0,
        CLIP_TOLERANCE,
        value <= CLIP_TOLERANCE,
        f"the clipped sum is not the records' gradients clipped to C (relative residual {value:.3g} > "
        f"{CLIP_TOLERANCE:g}, first at DP step {first}; largest record norm before clipping "
        f"{record['max_norm']:.4g})",
    )


def _noise(record: dict[str, Any], alpha: float) -> Check:
    from scipy import stats

    noise = record["noise"]
    if not noise:
        return Check("noise", None, None, None, True, "no releases yet")
    if record.get("noiseless"):  # sigma = 0: the release must be the clipped sum itself
        worst = max(noise, key=lambda name: noise[name][2])
        value = math.sqrt(noise[worst][2])
        return Check("noise", value, 0.0, 0.0, value == 0.0, f"noise on {worst} where sigma = 0 (norm {value:.3g})")
    a = alpha / len(noise)
    names = sorted(noise)
    counts = np.array([noise[name][0] for name in names], dtype=np.float64)
    squares = np.array([noise[name][1] for name in names], dtype=np.float64)
    p = 2 * np.minimum(stats.chi2.cdf(squares, counts), stats.chi2.sf(squares, counts))
    i = int(np.argmin(p))
    n, s = int(counts[i]), float(squares[i])
    lo, hi = math.sqrt(float(stats.chi2.ppf(a / 2, n)) / n), math.sqrt(float(stats.chi2.isf(a / 2, n)) / n)
    value = math.sqrt(s / n)
    return Check(
        "noise",
        value,
        lo,
        hi,
        bool(p[i] >= a),
        f"the noise on {names[i]} has std {value:.4g} x sigma C over {n} draws, outside [{lo:.4g}, {hi:.4g}] "
        f"(chi-square, alpha = {a:.2g} per tensor)",
    )


def _noise_fresh(record: dict[str, Any]) -> Check:
    prints = record["prints"]
    if len(prints) < 2:
        return Check("noise_fresh", None, None, None, True, "fewer than two releases")
    closest, pair = nearest_pair(prints)
    return Check(
        "noise_fresh",
        closest,
        FRESH_THRESHOLD,
        None,
        closest >= FRESH_THRESHOLD,
        f"the noise of DP step {record['base'] + pair[1] + 1} repeats that of DP step {record['base'] + pair[0] + 1} "
        f"(fingerprint distance {closest:.3g} < {FRESH_THRESHOLD:g})",
    )


def nearest_pair(prints: Sequence[Sequence[float]], cap: float = 1.0) -> tuple[float, tuple[int, int]]:
    """The smallest max-coordinate distance between two fingerprints (capped at ``cap``) and their indices:
    sorted by the first coordinate, only pairs within ``cap`` of each other there are compared."""
    order = sorted(range(len(prints)), key=lambda i: prints[i][0])
    best, pair = cap, (0, 0)
    for a, i in enumerate(order):
        for j in order[a + 1 :]:
            if prints[j][0] - prints[i][0] >= best:
                break
            d = max(abs(x - y) for x, y in zip(prints[i], prints[j], strict=True))
            if d < best:
                best, pair = d, (min(i, j), max(i, j))
    return best, pair


def _accountant(record: dict[str, Any], reported: Reported) -> Check:
    steps = record["base"] + record["releases"]
    if reported.noise_multiplier <= 0 or not math.isfinite(reported.epsilon) or reported.epsilon <= 0 or not steps:
        return Check("accountant", None, None, None, True, "no finite epsilon to recompute")
    sigma = reported.noise_multiplier / reported.column_norm
    rates = record["rates"] or [reported.sample_rate]
    q = max(rates)
    pld = pld_epsilon(sigma, q, -(-steps // reported.bands), reported.delta)
    ratio = pld / reported.epsilon
    lo, hi = PLD_BAND
    return Check(
        "accountant",
        ratio,
        lo,
        hi,
        lo <= ratio <= hi,
        f"the PLD accountant gives epsilon = {pld:.4g} for sigma = {sigma:.4g}, q = {q:.4g} and {steps} steps, "
        f"the run reports {reported.epsilon:.4g} (ratio {ratio:.3g}, outside [{lo:g}, {hi:g}])",
    )


@lru_cache(maxsize=512)
def pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε at δ of ``steps`` Poisson-sampled Gaussian releases, by dp-accounting's PLD accountant (pessimistic)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    gaussian = dp_accounting.GaussianDpEvent(sigma)
    event = gaussian if q >= 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


# ------------------------------------------------------------------------------ results


def metrics(checks: Sequence[Check]) -> dict[str, float]:
    """Each check's statistic and interval as numbers (a client's reply carries numbers only); a skipped check
    has none; ``dpcheck_failed`` counts the failures."""
    out: dict[str, float] = {"dpcheck_failed": float(sum(not c.passed for c in checks))}
    for c in checks:
        if c.statistic is None:
            continue
        out[f"dpcheck_{c.name}"] = c.statistic
        if c.lo is not None:
            out[f"dpcheck_{c.name}_lo"] = c.lo
        if c.hi is not None:
            out[f"dpcheck_{c.name}_hi"] = c.hi
    return out


def from_metrics(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a client's metrics line (:func:`metrics`) for ``summary.json``: name, statistic, interval
    ([lo, hi], None where open) and verdict (pass, fail, skipped); what each statistic is: :data:`WHAT`."""
    out = []
    for name in CHECKS:
        value = row.get(f"dpcheck_{name}")
        lo, hi = row.get(f"dpcheck_{name}_lo"), row.get(f"dpcheck_{name}_hi")
        if value is None:
            verdict = "skipped"
        else:
            verdict = "pass" if (lo is None or value >= lo) and (hi is None or value <= hi) else "fail"
        out.append({"name": name, "statistic": value, "interval": [lo, hi], "verdict": verdict})
    return out


def raise_failures(checks: Sequence[Check], *, client: int | None, step: int) -> None:
    """:class:`DPCheckError` naming every failed check, the client and the DP step; nothing when all pass."""
    failed = [c for c in checks if not c.passed]
    if not failed:
        return
    who = f"client {client}" if client is not None else "this client"
    first = failed[0]
    more = "".join(f"; also DP check '{c.name}': {c.detail}" for c in failed[1:])
    raise DPCheckError(
        f"{MARK}{first.name}' failed for {who} after DP step {step}: {first.detail}{more}. The run stops: the "
        "mechanism that ran is not the one epsilon is reported for (nothing of this round left the client; the "
        "last checkpoint is kept). privacy.checks = false turns the checks off (debugging only)"
    )


__all__ = [
    "CHECKS",
    "Check",
    "DPCheckError",
    "MARK",
    "Mechanism",
    "NOT_SEEN",
    "WHAT",
    "RECORD_KEY",
    "Reported",
    "StepChecks",
    "evaluate",
    "from_metrics",
    "merge",
    "metrics",
    "new_record",
    "pld_epsilon",
    "raise_failures",
]
