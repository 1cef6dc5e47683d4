"""Federated protocols, one module each, all driven by the same round loop (``trustformer.app``).

:func:`observe` lets a measurement harness (``trustformer attack reconstruct``) watch a run from the
inside without changing it: while an observer is active, every protocol object :func:`get_protocol`
returns (the server's and every client's) is wrapped so that the observer sees each client's trained
model when it builds its payload (ground truth that only the harness keeps; it is never sent), what it
sent, what the server's aggregation received and returned, and the aggregate each client applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from ..config import RunConfig
from .base import ClientSession, FederatedProtocol, Tensors, trainable_tensors
from .centralized import Centralized
from .fedavg import FedAvg
from .local import LocalOnly


def get_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy`` (wrapped while an :func:`observe` is active)."""
    protocol = make_protocol(cfg)
    if _observers:
        return ObservedProtocol(protocol, _observers[-1])  # type: ignore[return-value]
    return protocol


def make_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The bare protocol object named by ``federation.strategy`` (never wrapped)."""
    name = cfg.federation.strategy
    if name == "fedavg":
        return FedAvg()
    if name == "local":
        return LocalOnly()
    if name == "centralized":
        return Centralized()
    if name == "trustformer":
        from .trustformer import Trustformer

        return Trustformer(cfg)
    if name == "fedavg-topk":
        from .fedavg_topk import FedAvgTopK

        return FedAvgTopK(cfg)
    if name == "dp-fedavg":
        from .dp_fedavg import DPFedAvg

        return DPFedAvg(cfg)
    if name == "dp-fedsam":
        from .dp_fedsam import DPFedSAM

        return DPFedSAM(cfg)
    if name == "dp-blur-lus":
        from .dp_blur_lus import DPBlurLus

        return DPBlurLus(cfg)
    if name == "fedpc":
        from .fedpc import FedPC

        return FedPC(cfg)
    if name == "phong":
        from .phong import Phong

        return Phong(cfg)
    raise ValueError(f"unknown strategy {name!r}")


class ProtocolObserver:
    """What an observer may implement (every method optional; the base does nothing)."""

    def client_trained(self, rnd: int, client: int, trained: Tensors, num_examples: int) -> None:
        """A client's trainable tensors right after local training, as it starts building its payload."""

    def client_sent(self, rnd: int, client: int, payload: Tensors) -> None:
        """The payload a client built (before the secure exchange, if any, seals or masks it)."""

    def server_received(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> None:
        """The payloads the protocol's aggregation received (not called under secure aggregation, where
        the server only unmasks the sum)."""

    def server_aggregated(self, aggregate: Tensors) -> None:
        """What the protocol's aggregation returned."""

    def client_applied(self, rnd: int, client: int, aggregate: Tensors) -> None:
        """The aggregate a client received and applies (the one the server sent it)."""


_observers: list[ProtocolObserver] = []


@contextlib.contextmanager
def observe(observer: ProtocolObserver) -> Iterator[ProtocolObserver]:
    """While active, every protocol :func:`get_protocol` makes reports to ``observer`` (the innermost
    active observer when nested). Meant for in-process runs (``runtime.inprocess``)."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


class ObservedProtocol:
    """A protocol that behaves exactly as the one it wraps and reports to an observer. Attributes and
    optional hooks (``protocols/base.py``) are the wrapped protocol's: one it lacks is missing here too."""

    def __init__(self, protocol: FederatedProtocol, observer: ProtocolObserver) -> None:
        self.wrapped = protocol
        self.observer = observer

    def __getattr__(self, name: str) -> Any:
        if name in ("wrapped", "observer"):  # not set yet (e.g. while copying): no recursion
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        self.observer.client_trained(session.round, session.client, trainable_tensors(session.model),
                                     session.num_examples)
        payload, phases = self.wrapped.client_payload(session)
        self.observer.client_sent(session.round, session.client,
                                  {n: t.detach().cpu().clone() for n, t in payload.items()})
        return payload, phases

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, dict[str, float]]:
        self.observer.server_received([dict(p) for p in payloads], list(num_examples))
        aggregate, phases = self.wrapped.aggregate(payloads, num_examples)
        self.observer.server_aggregated(aggregate)
        return aggregate, phases

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        self.observer.client_applied(session.round, session.client,
                                     {n: t.detach().cpu().clone() for n, t in aggregate.items()})
        return self.wrapped.client_apply(session, aggregate)


__all__ = ["ClientSession", "FederatedProtocol", "ObservedProtocol", "ProtocolObserver", "get_protocol",
           "make_protocol", "observe"]
