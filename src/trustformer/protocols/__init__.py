"""Federated protocols, one module each, all driven by the same round loop (``trustformer.runtime.server``).

Each module declares its protocol in its ``SPEC`` (``spec.py``); ``trustformer/registry.py`` maps every
``federation.strategy`` to its module. Every protocol is a :class:`~trustformer.protocols.base.FederatedProtocol`.

:func:`observe` lets a measurement harness (``trustformer attack``) watch a run from the inside without
changing it: while an observer is active, every protocol object :func:`get_protocol` returns (the
server's and every client's) is wrapped so that the observer sees each client's trained model when it
builds its payload (ground truth that only the harness keeps; it is never sent), what it sent, what the
server's aggregation received and returned, and the aggregate each client applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from ..config import ConfigError, RunConfig
from ..registry import PROTOCOLS, protocol_spec
from .base import ClientSession, FederatedProtocol, Phases, ProtocolWrapper, Tensors, trainable_tensors
from .robust import with_defences


def make_protocol(cfg: RunConfig, observer: "ProtocolObserver | None" = None) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy``, with the server's defences (``robust.*``) around it,
    and payload coding around that when ``federation.payload_bits`` < 32; ``observer`` watches the defended
    protocol, inside the coding layer."""
    name = cfg.federation.strategy
    if name not in PROTOCOLS:
        raise ConfigError(
            f"federation.strategy = {name!r} is not a registered protocol (one of: {', '.join(PROTOCOLS)})"
        )
    protocol = protocol_spec(name).factory(cfg)
    protocol = with_defences(protocol)  # robust.*: the update bound and the aggregation rule, where in force
    if observer is not None:
        protocol = ObservedProtocol(protocol, observer)
    if cfg.federation.payload_bits != 32:
        from .coding import CodedPayload

        protocol = CodedPayload(protocol, cfg.federation.payload_bits, cfg.federation.payload_scale)
    return protocol


def get_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy`` (observed while an :func:`observe` is active)."""
    return make_protocol(cfg, _observers[-1] if _observers else None)


def bare(protocol: FederatedProtocol) -> FederatedProtocol:
    """The protocol inside every wrapper (coding, observer, differential privacy)."""
    while isinstance(protocol, ProtocolWrapper):
        protocol = protocol.inner
    return protocol


class ProtocolObserver:
    """What an observer may implement (every method optional; the base does nothing)."""

    def client_trained(self, rnd: int, client: int, trained: Tensors, num_examples: int) -> None:
        """A client's trainable tensors right after local training, as it starts building its payload."""

    def client_sent(self, rnd: int, client: int, payload: Tensors) -> None:
        """The payload a client built (before the secure exchange, if any, seals or masks it)."""

    def server_received(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> None:
        """The payloads the protocol's aggregation received (under secure aggregation: the securely
        computed mean alone)."""

    def server_aggregated(self, aggregate: Tensors) -> None:
        """What the protocol's aggregation returned."""

    def client_applied(self, rnd: int, client: int, aggregate: Tensors) -> None:
        """The aggregate a client received and applies (the one the server sent it)."""


_observers: list[ProtocolObserver] = []


@contextlib.contextmanager
def observe(observer: ProtocolObserver) -> Iterator[ProtocolObserver]:
    """While active, every protocol :func:`get_protocol` makes reports to ``observer`` (the innermost
    active observer when nested). Meant for in-process runs (``engine.inprocess``)."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


class ObservedProtocol(ProtocolWrapper):
    """A protocol that behaves exactly as the one it wraps and reports to an observer."""

    def __init__(self, protocol: FederatedProtocol, observer: ProtocolObserver) -> None:
        super().__init__(protocol)
        self.observer = observer

    @property
    def wrapped(self) -> FederatedProtocol:
        return self.inner

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        self.observer.client_trained(
            session.round, session.client, trainable_tensors(session.model), session.num_examples
        )
        payload, phases = self.inner.client_payload(session)
        self.observer.client_sent(
            session.round, session.client, {n: t.detach().cpu().clone() for n, t in payload.items()}
        )
        return payload, phases

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, Phases]:
        self.observer.server_received([dict(p) for p in payloads], list(num_examples))
        aggregate, phases = self.inner.aggregate(payloads, num_examples)
        self.observer.server_aggregated(aggregate)
        return aggregate, phases

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        self.observer.client_applied(
            session.round, session.client, {n: t.detach().cpu().clone() for n, t in aggregate.items()}
        )
        return self.inner.client_apply(session, aggregate)


__all__ = [
    "PROTOCOLS",
    "ClientSession",
    "FederatedProtocol",
    "ObservedProtocol",
    "ProtocolObserver",
    "bare",
    "get_protocol",
    "make_protocol",
    "observe",
]
