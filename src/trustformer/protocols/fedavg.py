"""FedAvg (McMahan et al. 2017): clients send their whole model; the server returns the
data-size-weighted mean ``W = sum_k (n_k / n) W_k``, which every client adopts."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.aggregation import weighted_mean
from .base import ClientSession, FederatedProtocol, Phases, Tensors, assign_tensors, trainable_tensors


class FedAvg(FederatedProtocol):
    name = "fedavg"
    mean_weighting = "examples"

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        return trainable_tensors(session.model), {}

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, Phases]:
        started = time.perf_counter()
        mean = weighted_mean(payloads, [float(n) for n in num_examples])
        return mean, {"aggregate_s": time.perf_counter() - started}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        started = time.perf_counter()
        assign_tensors(session.model, aggregate)
        return {"apply_s": time.perf_counter() - started}
