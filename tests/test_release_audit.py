"""The white-box record-level audit (attack/release_audit.py): it reads each DP-SGD step's release
(core/release_log.py) and checks the mechanism against the accountant.

Three layers: the log reads exactly what a step releases (no noise: each canary's reading is 1 when drawn and 0
otherwise, whatever the records do); the conformance on simulated releases of the ideal mechanism passes, and fails
each deviation naming its step; and whole runs through the real path, honest and with a bug planted in each step
(tests/dp_plants.py), where the audit must fail the plant and name its step.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_plants import PLANTS, SETTINGS, fresh_plans
from test_record_dp import _model

from trustformer.config import load_config
from trustformer.core import dpsgd, grad_canaries
from trustformer.core.release_log import ReleaseLog, load
from trustformer_lab.attack import release_audit as ra

torch.set_num_threads(1)


# ------------------------------------------------------------------------------ the log reads the release


def _records(n: int):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 40, (n, 7), generator=g)
    tgt = torch.randint(3, 40, (n, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2
    return src, tgt


def _logged(tmp_path: Path, *, sigma: float, rate: float, steps: int, n_records: int = 5):
    """``steps`` DP-SGD steps on the small test model with 24 canaries (alternating coins and signs, one per
    coordinate 0..23 of the first weight matrices) and a release log: (canaries, the log's arrays)."""
    model = _model()
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.numel() >= 24][:2]
    located = [(names[i % 2], i) for i in range(24)]
    canaries = grad_canaries.Canaries(
        names=tuple(n for n, _ in located),
        coordinates=tuple(c for _, c in located),
        included=tuple(i % 3 != 0 for i in range(24)),
        signs=tuple(1.0 if i % 2 == 0 else -1.0 for i in range(24)),
    )
    dp = dpsgd.RecordDP(noise_multiplier=sigma, clip_norm=0.05, expected_batch=4, sample_rate=rate, delta=1e-5)
    log = ReleaseLog(canaries, dp)
    src, tgt = _records(n_records)
    dpsgd.dp_sgd(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        n_records,
        lambda idx: (src[idx], tgt[idx]),
        lambda m, s, t: m.pair_losses(s, t),
        dp=dp,
        steps=steps,
        sampler=torch.Generator().manual_seed(0),
        noise=torch.Generator().manual_seed(1),
        canaries=canaries,
        release_log=log,
    )
    log.save(tmp_path / "steps-000000.npz")
    (call,) = load(tmp_path)
    return canaries, call


def test_the_log_reads_each_canary_alone_in_the_release(tmp_path):
    """No noise, full batches, records drawn every step: each canary reads exactly 1 (units of C, its sign undone)
    when in and 0 when out, every step: the records' clipped sum is taken off, and the release is read before Adam.
    A log that did not take the records off, or read after the optimizer, fails here."""
    canaries, call = _logged(tmp_path, sigma=0.0, rate=1.0, steps=3)
    expected = np.asarray(canaries.included, dtype=np.float32)
    assert call["readings"].shape == (3, 24)
    np.testing.assert_allclose(call["readings"], np.tile(expected, (3, 1)), atol=1e-4)
    assert np.all(call["noise_squares"] < 1e-10) and np.all(call["free_squares"] < 1e-10)


def test_the_log_measures_the_noise_away_from_the_canaries(tmp_path):
    """With noise σ·C, the noise's variance per coordinate, measured on the coordinates that hold no canary, is σ²C²
    (units of C: σ²), and the canaries read their coin plus noise of that size."""
    sigma = 2.0
    canaries, call = _logged(tmp_path, sigma=sigma, rate=1.0, steps=20)
    free = call["free_squares"].sum(0) / np.maximum(call["free_counts"], 1) / 20 / 0.05**2
    big = call["free_counts"] > 200
    assert np.all(np.abs(free[big] / sigma**2 - 1) < 0.25), free[big]
    residual = call["readings"] - np.asarray(canaries.included, dtype=np.float32)
    assert abs(residual.std() / sigma - 1) < 0.2


# ------------------------------------------------------------------------------ conformance on simulated releases


def _ideal(*, sigma=3.0, rate=0.1, steps=80, m=4000, tensors=4, seed=0, clip=1.0, drawn_at=None, noise_cut=None):
    """The release of the ideal mechanism at (σ, q, T) for m canaries over ``tensors`` tensors, with a deviation:
    ``clip`` (a canary contributes this many C), ``drawn_at`` (the sampler's real rate), ``noise_cut`` (tensor 1's
    noise divided by this)."""
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    tensor = np.arange(m) % tensors
    std = np.full(tensors, sigma)
    if noise_cut:
        std[1] = sigma / noise_cut
    drawn = rng.random((steps, m)) < (drawn_at or rate)
    readings = clip * (drawn & included) + std[tensor] * rng.standard_normal((steps, m))
    counts = np.full(tensors, 10_000.0)
    var = np.stack([rng.chisquare(10_000, tensors) / 10_000 * std**2 for _ in range(steps)])
    rel = ra.Release(
        readings=readings,
        noise_var=var,
        counts=counts,
        free_var=var,
        prints=rng.standard_normal((steps, 512)) * sigma,
        tensor_names=[f"t{i}" for i in range(tensors)],
        canary_tensor=tensor,
        sigma=sigma,
        clip=1.0,
        rate=rate,
        batch=6.0,
    )
    eps = dpsgd.epsilon_spent(sigma, rate, steps, 1e-5)
    return rel, included, {"steps": steps, "epsilon": eps, "noise_multiplier": sigma, "sample_rate": rate}


def _failed(rel, included, claimed) -> list[str]:
    return ra.conformance(rel, included, claimed, 1e-5)["failed_steps"]


@pytest.mark.parametrize("seed", range(5))
def test_the_ideal_mechanism_conforms(seed):
    assert _failed(*_ideal(seed=seed)) == []
    assert _failed(*_ideal(seed=seed, rate=1.0, steps=10, sigma=12.0)) == []


def test_each_deviation_fails_conformance_naming_its_step():
    assert _failed(*_ideal(clip=2.0)) == ["clipping"]
    assert _failed(*_ideal(drawn_at=0.2)) == ["sampling"]
    assert _failed(*_ideal(rate=1.0, steps=10, sigma=12.0, clip=2.0)) == ["clipping"]
    assert _failed(*_ideal(noise_cut=2.0)) == ["noise"]
    rel, included, claimed = _ideal()
    rel.prints[40] = rel.prints[3]  # step 40's noise is step 3's
    assert _failed(rel, included, claimed) == ["noise"]
    checks = {c["check"]: c for c in ra.conformance(rel, included, claimed, 1e-5)["checks"]}
    assert checks["noise_fresh"]["where"] == "steps 3 and 40"
    rel, included, claimed = _ideal()
    assert _failed(rel, included, {**claimed, "steps": 40}) == ["accountant"]  # charged for half the steps
    assert _failed(rel, included, {**claimed, "epsilon": claimed["epsilon"] / 2}) == ["accountant"]


def _banded(*, bands=4, sigma=2.0, steps=32, m=4000, tensors=4, seed=0, history=True, every_step=False):
    """The release of b-banded noise over b-min-sep sampling at q = 1, as a run logs it: canary i drawn (if in)
    at the steps ≡ i (mod b), plus C⁻¹z (z ~ N(0, σ²) per step, at the canaries and at 512 fingerprint coordinates).
    ``history=False``: the recurrence forgets its past (the release holds z itself); ``every_step``: the canaries
    drawn at every step (b-min-sep sampling broken)."""
    from trustformer.core.banded_noise import column_norm, sqrt_coefficients, toeplitz

    rng = np.random.default_rng(seed)
    coefficients = sqrt_coefficients(bands)
    inverse = np.linalg.inv(toeplitz(coefficients, steps).numpy()) if history else np.eye(steps)
    included = rng.random(m) < 0.5
    own = (np.arange(steps)[:, None] % bands) == (np.arange(m) % bands)[None, :]
    drawn = (own | every_step) & included
    readings = drawn + inverse @ (sigma * rng.standard_normal((steps, m)))
    prints = inverse @ (sigma * rng.standard_normal((steps, 512)))
    rel = ra.Release(
        readings=readings,
        noise_var=np.zeros((steps, tensors)),
        counts=np.full(tensors, 10_000.0),
        free_var=np.zeros((steps, tensors)),
        prints=prints,
        tensor_names=[f"t{i}" for i in range(tensors)],
        canary_tensor=np.arange(m) % tensors,
        sigma=sigma,
        clip=1.0,
        rate=1.0,
        batch=6.0,
        step_index=np.arange(steps),
        bands=bands,
        print_tensor=np.arange(512) % tensors,
    )
    effective = sigma / column_norm(coefficients, steps)
    eps = dpsgd.epsilon_spent(effective, 1.0, steps // bands, 1e-5)
    return rel, included, {"steps": steps, "epsilon": eps, "noise_multiplier": sigma, "sample_rate": 1.0}


@pytest.mark.parametrize("seed", range(5))
def test_decoded_banded_noise_is_the_dp_sgd_it_is_accounted_as(seed):
    """C·(release) read in windows of b steps: one reading per window, the coin plus noise of variance
    σ²/‖C‖_col² (the last window of a late group, cut by the run's end, a little more), T/b readings; the ideal
    banded mechanism conforms, and μ̂ is the accountant's √(T/b)·‖C‖_col/σ."""
    rel, included, claimed = _banded(seed=seed)
    decoded = ra.decode_banded(rel)
    assert decoded.steps == 8 and decoded.releases == 32 and decoded.readings.shape == (8, 4000)
    full = decoded.readings[:-1]  # every group's windows but the last are whole
    expected_var = (decoded.sigma / decoded.column) ** 2
    within = 4 * math.sqrt(expected_var / full[:, included].size)  # 4 standard errors of the mean
    assert abs(full[:, included].mean() - 1) < within and abs(full[:, ~included].mean()) < within
    assert abs(full[:, ~included].var() / expected_var - 1) < 0.05
    assert abs(decoded.reading_var[0].mean() / expected_var - 1) < 0.05  # measured from the fingerprint alone
    assert _failed(decoded, included, claimed) == []
    sums = ra.normalised_sums(decoded)
    mu_hat = (sums[included].mean() - sums[~included].mean()) / sums[~included].std()
    mu = ra.accountant_mu(decoded.effective_sigma, 1.0, decoded.steps)
    assert abs(mu_hat / mu - 1) < 0.1


def test_banded_noise_that_forgets_its_history_or_draws_outside_its_group_fails_conformance():
    """The recurrence restarted every step (the release holds fresh z: decoded, the noise is ‖C‖_col·σ, off its
    claim) fails ``noise``; canaries drawn at every step (b-min-sep sampling broken) fail ``min_sep``, named
    sampling. A decoder that skipped C, or a release read as if it were fresh, fails the first test above."""
    rel, included, claimed = _banded(history=False)
    assert "noise" in _failed(ra.decode_banded(rel), included, claimed)
    rel, included, claimed = _banded(every_step=True)
    checks = {c["check"]: c for c in ra.conformance(ra.decode_banded(rel), included, claimed, 1e-5)["checks"]}
    assert checks["min_sep"]["verdict"] == "fail" and checks["min_sep"]["step"] == "sampling"


def test_banded_noise_is_decoded_only_from_whole_windows_of_a_fresh_run():
    rel, _included, _claimed = _banded(steps=30)
    with pytest.raises(ValueError, match="federation.rounds to a multiple of 4"):
        ra.decode_banded(rel)
    rel, _included, _claimed = _banded()
    rel.step_index = rel.step_index + 4  # a log that starts mid-run (a resumed audit)
    with pytest.raises(ValueError, match="from its first step"):
        ra.decode_banded(rel)


def test_the_ceiling_grows_with_the_canaries_and_stays_below_epsilon():
    """The ideal mechanism's ε_lb: below its ε (the bound is sound) and higher with more canaries."""
    sigma = dpsgd.calibrate(1.0, 1e-5, 1.0, 10)
    few, many = ra.ceiling(sigma, 1.0, 10, 1000, 1e-5), ra.ceiling(sigma, 1.0, 10, 20_000, 1e-5)
    assert 0 <= few < many < 1.0


# ------------------------------------------------------------------------------ whole runs through the real path


QUICK = {"privacy.audit_canaries": 2000, "federation.rounds": 2}


def _audit(tmp_path, setting: str, plant: str | None = None, k: float = 2.0, monkeypatch=None, **more):
    fresh_plans()
    try:
        if plant is not None:
            PLANTS[plant](monkeypatch, k)
        cfg = load_config("tiny", None, {**SETTINGS[setting], **QUICK, **more, "out": str(tmp_path)})
        return ra.audit(cfg)
    finally:
        fresh_plans()


def test_an_honest_run_passes_the_release_audit(tmp_path):
    result = _audit(tmp_path, "full batch")
    assert result["verdict"] == "pass", result["failed_because"]
    assert 0.95 <= result["epsilon"] <= 1.0 + 1e-6
    assert 0 <= result["epsilon_lb"] <= result["epsilon"]
    assert result["steps_logged"] == result["mechanism"]["steps"] == 6
    assert abs(result["mu_hat"] - result["mu_accountant"]) < 0.25  # μ̂ of the in and out scores: the accountant's
    assert math.isfinite(result["ceiling"]) and result["conformance"]["epsilon_measured"] > 0


@pytest.mark.parametrize(
    ("setting", "plant", "step"),
    [("full batch", "clipping", "clipping"), ("poisson", "sampling", "sampling")],
)
def test_the_release_audit_fails_a_factor_two_plant_and_names_its_step(tmp_path, monkeypatch, setting, plant, step):
    """A bug that doubles what a record contributes (or how often it is drawn): the true ε about 2× the reported,
    which the one-run bound alone cannot show at ε = 1; the conformance must, and name the step."""
    result = _audit(tmp_path, setting, plant, 2.0, monkeypatch)
    assert 0.95 <= result["epsilon"] <= 1.0 + 1e-6  # the accountant does not see it
    assert result["verdict"] == "fail" and step in result["conformance"]["failed_steps"], result["failed_because"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "plant", "step"),
    [
        ("full batch", "noise", "noise"),
        ("full batch", "noise_all", "noise"),
        ("full batch", "noise_repeat", "noise"),
        ("full batch", "accounting", "accountant"),
        ("poisson", "accounting_steps", "accountant"),
        ("poisson", "clipping", "clipping"),
        ("lora", "clipping", "clipping"),
        ("banded", "clipping", "clipping"),
        ("banded", "noise", "noise"),
        ("banded", "noise_repeat", "noise"),
    ],
)
def test_the_release_audit_fails_each_plant_and_names_its_step(tmp_path, monkeypatch, setting, plant, step):
    more = {"federation.rounds": 8} if setting == "banded" else {}  # banded: whole windows of 4 rounds
    result = _audit(tmp_path, setting, plant, 2.0, monkeypatch, **more)
    assert result["verdict"] == "fail" and step in result["conformance"]["failed_steps"], result["failed_because"]


def test_the_release_view_of_banded_noise_needs_whole_windows(tmp_path):
    cfg = load_config("tiny", None, {**SETTINGS["banded"], "federation.rounds": 6, "out": str(tmp_path)})
    with pytest.raises(ValueError, match="federation.rounds = 6 to a multiple of 4"):
        ra.supported(cfg)


def test_banded_noise_is_audited_in_its_decoded_release(tmp_path, monkeypatch):
    """Banded noise over distributed noise, the real path: an honest run passes, read as DP-SGD at σ/‖C‖_col over
    T/b windows; every owner's canaries drawn outside their group (b-min-sep sampling broken) fail, sampling named."""
    honest = _audit(tmp_path / "honest", "banded", **{"federation.rounds": 8})
    assert honest["verdict"] == "pass", honest["failed_because"]
    assert honest["steps_logged"] == 8 and honest["bands"] == 4
    assert abs(honest["mu_hat"] - honest["mu_accountant"]) < 0.25
    broken = _audit(tmp_path / "broken", "banded", "min_sep", 1.0, monkeypatch, **{"federation.rounds": 8})
    assert broken["verdict"] == "fail" and "sampling" in broken["conformance"]["failed_steps"]


def test_under_distributed_noise_the_audit_reads_the_secure_sum_of_the_shares(tmp_path, monkeypatch):
    """Each owner adds a third of the noise: client 0's share alone would read σ/√3 and fail the noise check; the
    secure sum of the three shares reads σ. Clipping at 2C in every owner still fails, named."""
    honest = _audit(tmp_path / "honest", "distributed")
    assert honest["verdict"] == "pass", honest["failed_because"]
    assert sorted(p.name for p in (tmp_path / "honest" / "audit-release").iterdir()) == [
        "client-0",
        "client-1",
        "client-2",
    ]
    broken = _audit(tmp_path / "broken", "distributed", "clipping", 2.0, monkeypatch)
    assert broken["verdict"] == "fail" and "clipping" in broken["conformance"]["failed_steps"]
