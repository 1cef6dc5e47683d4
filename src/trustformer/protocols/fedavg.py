"""FedAvg (McMahan et al. 2017): clients send their whole model; the server returns the
data-size-weighted mean ``W = sum_k (n_k / n) W_k``, which every client adopts."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.aggregation import weighted_mean
from .interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    Phases,
    Tensors,
    assign_tensors,
    trainable_tensors,
)
from .interface.parts import CatchUp, ServerHooks, newer
from .interface.spec import ProtocolSpec


class FedAvg(FederatedProtocol, ServerHooks, CatchUp):
    """With client sampling, the server keeps the last global model: a client drawn after missing exchanges
    receives it with its ``train`` message and starts from it."""

    spec = ProtocolSpec(
        name="fedavg",
        factory=lambda cfg: FedAvg(cfg),
        mean_weighting="examples",
        sums_noise_shares=True,
        aggregate_kind="model",
        summary="clients send their model; the server returns the weighted mean",
    )
    state_attrs = ("latest",)  # server, client sampling: (round, the last global model)
    latest: tuple[int, Tensors] | None = None

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        return trainable_tensors(session.model), {}

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        started = time.perf_counter()
        mean = weighted_mean(payloads, [float(n) for n in num_examples])
        return Aggregated(mean, {"aggregate_s": time.perf_counter() - started})

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        if self.cfg.federation.clients_per_round and delivered is not None:
            self.latest = (rnd, delivered)  # what a client left out must catch up to: the state the others hold
        return {}

    def catch_up(self, version: int) -> Tensors | None:
        return newer(self.latest, version)

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        started = time.perf_counter()
        assign_tensors(session.model, aggregate)
        return {"apply_s": time.perf_counter() - started}


SPEC = FedAvg.spec
