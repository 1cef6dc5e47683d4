"""No aggregation: every client trains alone on its own shard (the lower reference)."""

from __future__ import annotations

from ..wire import TensorSpec
from .interface.base import ClientSession, FederatedProtocol
from .interface.spec import ProtocolSpec

NOTHING_EXCHANGED = "nothing is exchanged"


class LocalOnly(FederatedProtocol):
    spec = ProtocolSpec(
        name="local",
        factory=lambda cfg: LocalOnly(cfg),
        summary="every client trains alone (the lower reference)",
        exchanges=False,
        estimator="none",
        refuses={
            "coding": "it sends no weights",
            "client_sampling": f"{NOTHING_EXCHANGED}, so there is nothing to sample for",
            "defences": NOTHING_EXCHANGED,
            "model_poisoning": "it sends nothing",
        },
    )

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return {}


SPEC = LocalOnly.spec
