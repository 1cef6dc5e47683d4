"""The base of every wrapper: a protocol that behaves as ``self.inner`` except where a subclass overrides a hook.

The way Flower's DP strategies hold ``self.strategy``: every hook is written out below and forwards to ``inner``, so
a debugger steps from the wrapper into the protocol it wraps, and ``type(wrapper)`` is the class in the source.
A wrapper's server state is its own declared ``state_attrs`` plus its inner protocol's, nested under ``inner``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...core.shared import LocalStep, Tensors
from ...wire import TensorSpec
from ..interface.base import FederatedProtocol, RoundMessages, standard_round
from ..interface.session import ClientSession, Phases


class ProtocolWrapper(FederatedProtocol):
    """``inner`` with some hooks overridden by a subclass (differential privacy, payload coding, robust
    aggregation, the attack harness's observer); every hook a subclass leaves alone forwards to ``inner``."""

    def __init__(self, inner: FederatedProtocol) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        self.spec = inner.spec  # a wrapper may declare its own (DP: its baseline's)

    def innermost(self) -> FederatedProtocol:
        """The protocol inside every wrapper."""
        inner = self.inner
        while isinstance(inner, ProtocolWrapper):
            inner = inner.inner
        return inner

    def run_round(self, io: RoundMessages) -> None:
        # the standard round calls the outermost wrapper's hooks; a protocol-declared round calls io.aggregate,
        # which goes through the server's protocol object (the outermost wrapper) too
        inner = self.innermost()
        if type(inner).run_round is FederatedProtocol.run_round:
            standard_round(self, io)
        else:
            inner.run_round(io)

    # ------------------------------------------------------------------ server state: own + inner's
    def server_state(self) -> dict[str, Any]:
        return {**super().server_state(), "inner": self.inner.server_state()}

    def load_server_state(self, state: dict[str, Any]) -> None:
        super().load_server_state(state)
        self.inner.load_server_state(state["inner"])

    # ------------------------------------------------------------------ every other hook: forwarded
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        return self.inner.client_payload(session)

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, Phases]:
        return self.inner.aggregate(payloads, num_examples)

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        return self.inner.client_apply(session, aggregate)

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        return self.inner.expected_payload(initial)

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return self.inner.payload_spec(session)

    def client_optimizer(self, model: torch.nn.Module, client: int) -> torch.optim.Optimizer | None:
        return self.inner.client_optimizer(model, client)

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return self.inner.local_step(session)

    def train_options(self, session: ClientSession) -> dict[str, int]:
        return self.inner.train_options(session)

    def client_trained(self, session: ClientSession, metrics: dict[str, Any]) -> None:
        self.inner.client_trained(session, metrics)

    def server_begin(self, num_clients: int) -> None:
        self.inner.server_begin(num_clients)

    def participants(self, rnd: int, clients: Sequence[int], exchange: bool) -> list[int] | None:
        return self.inner.participants(rnd, clients, exchange)

    def samples_clients(self) -> bool:
        return self.inner.samples_clients()

    def stop_reason(self) -> str:
        return self.inner.stop_reason()

    def catch_up(self) -> tuple[int, Tensors] | None:
        return self.inner.catch_up()

    def catch_up_from(self, version: int) -> Tensors | None:
        return self.inner.catch_up_from(version)

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        return self.inner.client_start_from(session, model)

    def aggregate_delivered(self, delivered: Tensors) -> None:
        self.inner.aggregate_delivered(delivered)

    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        return self.inner.catch_up_specs(session)

    def aggregate_events(self) -> list[dict[str, Any]]:
        return self.inner.aggregate_events()

    def exchange_done(self, rnd: int) -> dict[str, float | None]:
        return self.inner.exchange_done(rnd)

    def line_fields(self) -> dict[str, Any]:
        return self.inner.line_fields()

    def server_summary(self) -> dict[str, Any]:
        return self.inner.server_summary()

    def check_payload(self, payload: Tensors) -> None:
        self.inner.check_payload(payload)

    def coding_view(self, payload: Tensors, initial: Tensors) -> Tensors:
        return self.inner.coding_view(payload, initial)

    def coded_names(self, payload: Tensors) -> set[str]:
        return self.inner.coded_names(payload)

    def coding_unview(self, view: Tensors, rest: Tensors, initial: Tensors) -> Tensors:
        return self.inner.coding_unview(view, rest, initial)

    def payload_reference(self, session: ClientSession) -> Tensors | None:
        return self.inner.payload_reference(session)

    def server_payload_reference(self, rnd: int) -> Tensors | None:
        return self.inner.server_payload_reference(rnd)

    def stable_payload_layout(self) -> bool:
        return self.inner.stable_payload_layout()


def bare(protocol: FederatedProtocol) -> FederatedProtocol:
    """The protocol inside every wrapper (coding, observer, differential privacy, defences)."""
    return protocol.innermost() if isinstance(protocol, ProtocolWrapper) else protocol


__all__ = ["ProtocolWrapper", "bare"]
