"""No aggregation: every client trains alone on its own shard (the lower reference)."""

from __future__ import annotations

from ..wire import TensorSpec
from .base import ClientSession, FederatedProtocol


class LocalOnly(FederatedProtocol):
    name = "local"
    exchanges = False

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return {}
