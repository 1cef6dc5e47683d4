"""Privacy accounting of user-level DP federated training with Google's ``dp-accounting`` (RDP).

One noised aggregation (a "release") is a Gaussian mechanism with noise multiplier σ (noise std
σ·C on a sum of updates clipped to C), applied to a Poisson sample of the clients with rate q
(McMahan et al. 2018). T releases compose; the RDP accountant (Mironov 2017; Mironov et al. 2019 for
the sampled Gaussian) converts the composition into (ε, δ). With q = 1 a release is the plain
Gaussian mechanism.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata

import dp_accounting
from dp_accounting import mechanism_calibration
from dp_accounting.rdp import RdpAccountant

from ..errors import TrustformerError

ACCOUNTANT = "rdp"


class PrivacyBudgetError(TrustformerError, ValueError):
    """The planned (or next) releases would spend more than the target ε."""


def accountant_name() -> str:
    """What computes ε, as recorded in the summary."""
    try:
        version = metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:  # pragma: no cover
        version = "unknown"
    return f"rdp (dp-accounting {version}, RdpAccountant, default orders, add-or-remove-one)"


@contextmanager
def _quiet_absl():
    """dp-accounting logs a warning for every RDP order it cannot evaluate; keep the run log readable."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def release_event(noise_multiplier: float, sampling_rate: float) -> dp_accounting.DpEvent:
    """One release: GaussianDpEvent(σ), Poisson-sampled with rate q when q < 1."""
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling_rate >= 1.0:
        return gaussian
    return dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)


def epsilon_after(noise_multiplier: float, sampling_rate: float, releases: int, delta: float) -> float:
    """ε spent by ``releases`` releases at ``delta`` (0 for none, ∞ without noise)."""
    if releases <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(release_event(noise_multiplier, sampling_rate), releases))
    with _quiet_absl():
        return float(accountant.get_epsilon(delta))


def solve_noise_multiplier(
    epsilon: float, delta: float, sampling_rate: float, releases: int, *, tol: float = 1e-5
) -> float:
    """The smallest σ whose ``releases`` releases spend at most ``epsilon`` at ``delta``.

    Bracketed root search on the accountant (dp-accounting's ``calibrate_dp_mechanism``, Brent's
    method); the returned σ is on the private side of the target within ``tol``.
    """
    if releases <= 0:
        return 0.0

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(release_event(sigma, sampling_rate), releases)

    with _quiet_absl():
        return float(
            mechanism_calibration.calibrate_dp_mechanism(
                RdpAccountant,
                make_event,
                epsilon,
                delta,
                bracket_interval=mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0),
                tol=tol,
            )
        )


@dataclass
class PrivacyLedger:
    """The server's record of what has been released: ε after every release, budget checks."""

    noise_multiplier: float
    sampling_rate: float
    delta: float
    target_epsilon: float
    clip_norm: float
    planned_releases: int
    solved: bool  # σ was solved from (target ε, δ) rather than given
    releases: int = 0
    epsilons: list[float] = field(default_factory=list)

    @property
    def epsilon(self) -> float:
        return epsilon_after(self.noise_multiplier, self.sampling_rate, self.releases, self.delta)

    def epsilon_with(self, more: int) -> float:
        return epsilon_after(self.noise_multiplier, self.sampling_rate, self.releases + more, self.delta)

    def planned_epsilon(self) -> float:
        return epsilon_after(self.noise_multiplier, self.sampling_rate, self.planned_releases, self.delta)

    def record_release(self) -> float:
        self.releases += 1
        eps = self.epsilon
        self.epsilons.append(eps)
        return eps

    def state_dict(self) -> dict[str, object]:
        """What a resumed server needs: the releases so far and ε after each (None: infinite)."""
        return {"releases": self.releases, "epsilons": [_finite(e) for e in self.epsilons]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.releases = int(state["releases"])  # type: ignore[call-overload]
        self.epsilons = [math.inf if e is None else float(e) for e in state["epsilons"]]  # type: ignore[attr-defined]

    def summary(self) -> dict[str, object]:
        """The ``privacy`` object of summary.json (ε as null when infinite, i.e. without noise)."""
        return {
            "epsilon": _finite(self.epsilon),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
            "sampling_rate": self.sampling_rate,
            "rounds": self.releases,
            "accountant": accountant_name(),
            "target_epsilon": self.target_epsilon,
            "planned_rounds": self.planned_releases,
            "noise_multiplier_solved": self.solved,
            "epsilon_per_round": [_finite(e) for e in self.epsilons],
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = [
    "ACCOUNTANT",
    "PrivacyBudgetError",
    "PrivacyLedger",
    "accountant_name",
    "epsilon_after",
    "release_event",
    "solve_noise_multiplier",
]
