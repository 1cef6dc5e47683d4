"""What the reconstruction attack's harness sees of an in-process run (module docstring of
:mod:`trustformer.attack.reconstruct`): every exchange — the clients' true trained models (never sent), the payloads
they built, what the aggregation received and the aggregate sent back — recorded by a protocol observer."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from trustformer.protocols import ProtocolObserver
from trustformer.protocols.interface.base import Tensors


def _fingerprint(tensors: Tensors) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Exchange:
    """One exchange round as the harness saw it."""

    round: int
    trained: dict[int, Tensors] = field(default_factory=dict)  # ground truth (never sent)
    num_examples: dict[int, int] = field(default_factory=dict)
    sent: dict[str, list[int]] = field(default_factory=dict)  # fingerprint of a payload -> the clients that sent it
    sent_payloads: dict[int, Tensors] = field(default_factory=dict)  # client -> the payload it built
    received: dict[int, Tensors] | None = None  # what the aggregation received, by client (None: secagg)
    aggregate: Tensors | None = None  # what the server sent back


def _nearest(payload: Tensors, sent: dict[int, Tensors]) -> int | None:
    """The client whose sent payload (same names and shapes) is nearest to ``payload`` (L2), if any."""
    best, best_distance = None, float("inf")
    for client, candidate in sent.items():
        if set(candidate) != set(payload) or any(candidate[n].shape != payload[n].shape for n in payload):
            continue
        distance = sum(
            float((candidate[n].double() - payload[n].double()).pow(2).sum())
            for n in payload
            if candidate[n].is_floating_point()
        )
        if distance < best_distance:
            best, best_distance = client, distance
    return best


class RunRecorder(ProtocolObserver):
    """Records every exchange of an in-process run (see :func:`trustformer.protocols.observe`)."""

    def __init__(self) -> None:
        self.exchanges: dict[int, Exchange] = {}
        self._round = 0
        self.unmatched = 0  # received payloads that match no client's (should not happen)

    def _exchange(self, rnd: int) -> Exchange:
        return self.exchanges.setdefault(rnd, Exchange(rnd))

    def client_trained(self, rnd: int, client: int, trained: Tensors, num_examples: int) -> None:
        self._round = rnd
        ex = self._exchange(rnd)
        ex.trained[client] = trained
        ex.num_examples[client] = num_examples

    def client_sent(self, rnd: int, client: int, payload: Tensors) -> None:
        self._exchange(rnd).sent.setdefault(_fingerprint(payload), []).append(client)
        self._exchange(rnd).sent_payloads[client] = payload

    def server_received(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> None:
        ex = self._exchange(self._round)  # in process, the aggregation follows the round's clients
        received: dict[int, Tensors] = {}
        unclaimed = {fp: list(clients) for fp, clients in ex.sent.items()}  # identical payloads: one client each
        for payload in payloads:
            same = unclaimed.get(_fingerprint(payload))
            client = same.pop(0) if same else None
            if client is None:  # coded payloads arrive decoded, within the coding error: the nearest one sent
                client = _nearest(payload, ex.sent_payloads)
            if client is None:
                self.unmatched += 1
                continue
            received[client] = {n: t.detach().cpu().clone() for n, t in payload.items()}
        ex.received = received  # the last call is the aggregation the round used

    def client_applied(self, rnd: int, client: int, aggregate: Tensors) -> None:
        ex = self._exchange(rnd)
        if ex.aggregate is None:
            ex.aggregate = aggregate


__all__ = ["Exchange", "RunRecorder"]
