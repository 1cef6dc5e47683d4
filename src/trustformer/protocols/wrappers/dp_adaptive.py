"""The noise of client-level DP with adaptive clipping (Andrew et al. 2021, "Differentially private learning with
adaptive clipping"): how σ splits between the unclipped count (σ_b) and the update (σ_Δ, Thm. 1), checked when the
configuration loads."""

from __future__ import annotations

from typing import Any

from ...config import ConfigError, PrivacyConfig
from ...core.accounting import solve_noise_multiplier
from ...core.dp import default_count_stddev, update_noise_multiplier


def planned_releases(cfg: Any) -> int:
    """The exchange rounds of a run, each one release: every round r with r % agg_every == 0."""
    return cfg.federation.rounds // cfg.federation.agg_every


def planned_sigma(cfg: Any, releases: int) -> float:
    """σ of a client-level DP run: ``privacy.noise_multiplier``, or solved for (ε, δ, q) over ``releases``."""
    p = cfg.privacy
    if p.noise_multiplier >= 0:
        return p.noise_multiplier
    return solve_noise_multiplier(p.epsilon, p.delta, p.sampling_rate, releases)


def adaptive_noise(p: PrivacyConfig, sigma: float, expected: float) -> tuple[float, float | None]:
    """Adaptive clipping's (σ_b, σ_Δ) for noise multiplier σ and ``expected`` participants qN (Andrew et al. 2021):
    σ_b given, or qN/20 (0 without noise); σ_Δ from Thm. 1, None where 2σ_b ≤ σ leaves none."""
    given = p.clip_count_stddev != -1.0
    count_stddev = p.clip_count_stddev if given else (default_count_stddev(expected) if sigma > 0 else 0.0)
    try:
        return count_stddev, update_noise_multiplier(sigma, count_stddev)
    except ValueError:
        return count_stddev, None


def adaptive_refusal(p: PrivacyConfig, sigma: float, count_stddev: float, expected: float) -> str:
    given = p.clip_count_stddev != -1.0
    return (
        f"privacy.clipping = 'adaptive': the noise on the unclipped count, sigma_b = {count_stddev:g} "
        f"({'privacy.clip_count_stddev' if given else f'{expected:g} expected participants / 20'}), is too "
        f"small for the noise multiplier sigma = {sigma:g}: Andrew et al. (2021, Thm. 1) need "
        f"2 sigma_b > sigma, i.e. sigma_b > {sigma / 2:g}; raise privacy.clip_count_stddev, the expected "
        "participants (federation.clients x privacy.sampling_rate) or privacy.epsilon, or set "
        "privacy.clipping = 'fixed'"
    )


def check_adaptive_clipping(cfg: Any) -> None:
    """At load: adaptive clipping's count noise must leave noise for the update (2σ_b > σ), ConfigError naming the
    options otherwise."""
    p = cfg.privacy
    if p.unit != "client" or p.clipping != "adaptive":
        return
    sigma, expected = planned_sigma(cfg, planned_releases(cfg)), p.sampling_rate * cfg.federation.clients
    count_stddev, update_sigma = adaptive_noise(p, sigma, expected)
    if update_sigma is None:
        raise ConfigError(adaptive_refusal(p, sigma, count_stddev, expected))


__all__ = ["adaptive_noise", "adaptive_refusal", "check_adaptive_clipping", "planned_releases", "planned_sigma"]
