"""The base of every wrapper: a protocol that behaves as ``self.inner`` except where a subclass overrides a hook.

The way Flower's DP strategies hold ``self.strategy``: the core hooks are written out below and forward to
``inner``, so a debugger steps from the wrapper into the protocol it wraps, and ``type(wrapper)`` is the class in the
source. The optional parts (``interface/parts.py``) are the inner protocol's, reached through it, unless the
wrapper subclasses a part itself; then the part's methods it leaves alone forward to the inner protocol's part
(:class:`InnerServerHooks`, :class:`InnerCatchUp`). Two server hooks are never forwarded: the runtime calls
``server_begin`` and ``server_summary`` on every layer itself, innermost first (:func:`start_server`,
:func:`server_summary`), so a wrapper cannot leave the protocol inside it unstarted or its summary out. A wrapper's
server state is its own declared ``state_attrs`` plus its inner protocol's, nested under ``inner``
(``interface/state.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...core.shared import Tensors
from ...wire import TensorSpec
from ..interface.base import FederatedProtocol, P
from ..interface.parts import CatchUp, ServerHooks
from ..interface.session import Aggregated, ClientSession, Phases, Selection, ServerStart


class ProtocolWrapper(FederatedProtocol):
    """``inner`` with some hooks overridden by a subclass (differential privacy, payload coding, robust
    aggregation, the attack harness's observer); every core hook a subclass leaves alone forwards to ``inner``,
    and every part it does not subclass is ``inner``'s."""

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

    def _part(self, kind: type[P], default: Callable[[FederatedProtocol], P]) -> P:
        # a part this wrapper does not subclass is its inner protocol's (built there, defaults included)
        return self if isinstance(self, kind) else self.inner._part(kind, default)

    # ------------------------------------------------------------------ the core: forwarded
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        return self.inner.client_payload(session)

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        return self.inner.aggregate(rnd, payloads, num_examples)

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        return self.inner.client_apply(session, aggregate)

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        return self.inner.expected_payload(initial)

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return self.inner.payload_spec(session)


EVERY_LAYER = ("server_begin", "server_summary")  # the server hooks the runtime calls on every layer: never forwarded


class InnerServerHooks(ServerHooks):
    """:class:`ServerHooks` for a wrapper that changes some of them (``class W(ProtocolWrapper, InnerServerHooks)``):
    every one it leaves alone is its inner protocol's, but ``server_begin`` and ``server_summary``, which are the
    wrapper's own (the runtime calls them on every layer)."""

    inner: FederatedProtocol

    def participants(self, rnd: int, clients: Sequence[int], exchange: bool) -> Selection:
        return self.inner.server().participants(rnd, clients, exchange)

    def check_payload(self, rnd: int, payload: Tensors) -> None:
        self.inner.server().check_payload(rnd, payload)

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        return self.inner.server().exchange_done(rnd, delivered)


class InnerCatchUp(CatchUp):
    """:class:`CatchUp` for a wrapper that changes some of it: every method it leaves alone is its inner
    protocol's."""

    inner: FederatedProtocol

    def catch_up(self, version: int) -> Tensors | None:
        return self.inner.catching_up().catch_up(version)

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        return self.inner.catching_up().client_start_from(session, model)

    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        return self.inner.catching_up().catch_up_specs(session)


def server_layers(protocol: FederatedProtocol) -> list[ServerHooks]:
    """The server hooks of every layer of ``protocol``, innermost first: the innermost protocol's (its own or the
    defaults), then each wrapper's that subclasses :class:`ServerHooks`."""
    layers: list[ServerHooks] = []
    while isinstance(protocol, ProtocolWrapper):
        if isinstance(protocol, ServerHooks):
            layers.append(protocol)
        protocol = protocol.inner
    layers.append(protocol.server())
    return layers[::-1]


def start_server(protocol: FederatedProtocol, start: ServerStart) -> None:
    """Before round 1: ``server_begin`` on every layer, innermost first, so that a wrapper derives its start from a
    started protocol (coding's reference from Trustformer's clusters)."""
    for hooks in server_layers(protocol):
        hooks.server_begin(start)


def server_summary(protocol: FederatedProtocol) -> dict[str, Any]:
    """Every layer's ``server_summary`` merged, innermost first (a wrapper's field replaces an inner one's)."""
    out: dict[str, Any] = {}
    for hooks in server_layers(protocol):
        out.update(hooks.server_summary())
    return out


def bare(protocol: FederatedProtocol) -> FederatedProtocol:
    """The protocol inside every wrapper (coding, observer, differential privacy, defences)."""
    return protocol.innermost() if isinstance(protocol, ProtocolWrapper) else protocol


__all__ = [
    "EVERY_LAYER",
    "InnerCatchUp",
    "InnerServerHooks",
    "ProtocolWrapper",
    "bare",
    "server_layers",
    "server_summary",
    "start_server",
]
