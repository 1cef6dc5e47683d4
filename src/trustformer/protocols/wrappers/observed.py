"""The attack harness's observer as a wrapper: a protocol that behaves exactly as the one it wraps and reports what
each party sees to a :class:`ProtocolObserver` (ground truth that only the harness keeps; it is never sent)."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.shared import Tensors, trainable_tensors
from ..interface.base import FederatedProtocol
from ..interface.session import Aggregated, ClientSession, Phases
from .base import ProtocolWrapper


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


class ObservedProtocol(ProtocolWrapper):
    """A protocol that behaves exactly as the one it wraps and reports to an observer."""

    hook_attrs = ("observer",)  # the harness's record of the run, not the run's state

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

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        self.observer.server_received([dict(p) for p in payloads], list(num_examples))
        result = self.inner.aggregate(rnd, payloads, num_examples)
        self.observer.server_aggregated(result.tensors)
        return result

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        self.observer.client_applied(
            session.round, session.client, {n: t.detach().cpu().clone() for n, t in aggregate.items()}
        )
        return self.inner.client_apply(session, aggregate)


__all__ = ["ObservedProtocol", "ProtocolObserver"]
