"""Centralized training: one client holds the union of all shards (the upper reference).

It runs the local protocol on a single node; the runtime gives that node every shard.
"""

from __future__ import annotations

from .interface.spec import ProtocolSpec
from .local import LocalOnly

ONE_CLIENT = "one client holds all the data"


class Centralized(LocalOnly):
    spec = ProtocolSpec(
        name="centralized",
        factory=lambda cfg: Centralized(cfg),
        pools_data=True,
        exchanges=False,
        estimator="none",
        summary="one client trains on every shard (the upper reference)",
        refuses={
            "coding": "it sends no weights",
            "client_sampling": ONE_CLIENT,
            "defences": ONE_CLIENT,
            "model_poisoning": "it sends nothing",
        },
    )


SPEC = Centralized.spec
