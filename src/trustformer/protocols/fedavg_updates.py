"""FedAvg of updates: clients send Δ = W_local − W_global, the server returns their data-size-weighted mean,
every client adopts W_global + mean (the same model as FedAvg). The base of DP-FedAvg and DP-FedSAM, whose
wrapper (``dp.py``) clips Δ and noises the sum.

Every client holds the last global model in its protocol state (round 1: the identical initial model).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..config import RunConfig
from ..core.aggregation import weighted_mean
from .interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    LocalStep,
    Phases,
    Tensors,
    assign_tensors,
    held_global,
    trainable_tensors,
)
from .interface.parts import LocalTraining
from .interface.spec import ProtocolSpec

GLOBAL = "global/"  # protocol_state key prefix of the last global model


class FedAvgUpdates(FederatedProtocol, LocalTraining):
    """A building block (the DP baselines'), not registered as a strategy."""

    spec = ProtocolSpec(
        name="fedavg-updates",
        factory=lambda cfg: FedAvgUpdates(cfg),
        mean_weighting="examples",
        estimator="update",
        sums_noise_shares=True,
        aggregate_kind="update",
    )

    def __init__(self, cfg: RunConfig, *, local_step=None) -> None:
        super().__init__(cfg)
        self._local_step = local_step  # (session) -> LocalStep | None

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return self._local_step(session) if self._local_step is not None else None

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """Δ = W_local − W_global for every trainable tensor."""
        started = time.perf_counter()
        local, base = trainable_tensors(session.model), held_global(session, GLOBAL)
        return {n: local[n] - base[n].to(local[n].dtype) for n in local}, {"update_s": time.perf_counter() - started}

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        started = time.perf_counter()
        mean = weighted_mean(payloads, [float(n) for n in num_examples])
        return Aggregated(mean, {"aggregate_s": time.perf_counter() - started})

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        """W_global ← W_global + mean update; the client continues from the new global model."""
        started = time.perf_counter()
        base = held_global(session, GLOBAL)
        new_global = {n: (base[n].double() + aggregate[n].double()).to(base[n].dtype) for n in base}
        assign_tensors(session.model, new_global)
        for n, t in new_global.items():
            session.protocol_state[GLOBAL + n] = t
        return {"apply_s": time.perf_counter() - started}


__all__ = ["FedAvgUpdates", "GLOBAL"]
