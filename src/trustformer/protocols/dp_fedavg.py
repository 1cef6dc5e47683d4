"""DP-FedAvg (McMahan et al. 2018, Algorithm 1): user-level differential privacy (``dp.py``) around FedAvg of
updates (``fedavg_updates.py``): clients send Δ = W_local − W_global clipped to ‖Δ‖ ≤ C, the server adds
N(0, σ²C² I) to the sum and divides by qN, every client adds the result to the global model."""

from __future__ import annotations

from ..config import RunConfig
from .fedavg_updates import FedAvgUpdates
from .interface.base import FederatedProtocol
from .wrappers.dp import DifferentialPrivacy, dp_spec, record_level


def dp_fedavg(cfg: RunConfig) -> FederatedProtocol:
    """Client level: user-level DP around FedAvg of updates. Record level (``privacy.unit = "record"``): FedAvg of
    updates whose clients train with DP-SGD, per-record clip ``privacy.clip_norm`` (``tasks/record_dp.py``)."""
    if cfg.privacy.unit == "record":
        return record_level(FedAvgUpdates(cfg), SPEC)
    return DifferentialPrivacy(FedAvgUpdates(cfg), cfg.privacy, spec=SPEC)


SPEC = dp_spec("dp-fedavg", dp_fedavg, "user-level DP-FedAvg (McMahan et al. 2018)")

__all__ = ["dp_fedavg"]
