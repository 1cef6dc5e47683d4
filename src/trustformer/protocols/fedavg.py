"""FedAvg (McMahan et al. 2017): clients send their whole model; the server returns the
data-size-weighted mean ``W = sum_k (n_k / n) W_k``, which every client adopts."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.aggregation import weighted_mean
from ..wire import TensorSpec, spec_of
from .base import ClientSession, Tensors, assign_tensors, trainable_tensors


class FedAvg:
    name = "fedavg"
    exchanges = True

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        return trainable_tensors(session.model), {}

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return spec_of(dict(session.model.named_parameters()))

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        return spec_of(initial)

    def aggregate(
        self, payloads: Sequence[Tensors], num_examples: Sequence[int]
    ) -> tuple[Tensors, dict[str, float]]:
        started = time.perf_counter()
        mean = weighted_mean(payloads, [float(n) for n in num_examples])
        return mean, {"aggregate_s": time.perf_counter() - started}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        started = time.perf_counter()
        assign_tensors(session.model, aggregate)
        return {"apply_s": time.perf_counter() - started}
