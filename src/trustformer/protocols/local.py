"""No aggregation: every client trains alone on its own shard (the lower reference)."""

from __future__ import annotations

from collections.abc import Sequence

from ..wire import TensorSpec
from .base import ClientSession, Tensors


class LocalOnly:
    name = "local"
    exchanges = False

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        raise RuntimeError("the local protocol never exchanges anything")

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return {}

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]):
        raise RuntimeError("the local protocol never aggregates")

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        raise RuntimeError("the local protocol never aggregates")
