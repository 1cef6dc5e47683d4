"""One round's validated, measured messages: the send/receive helper every protocol's round runs over.

A round (``runtime/server.py:run_round``, or a protocol's own ``run_round``: FedPC, Phong) only says which
messages go to which clients and what the server computes from the replies;
:class:`RoundIO` does the rest for every protocol alike:

- **transport**: every message goes out and comes back through the run's :class:`~trustformer.wire.Link`:
  :class:`~trustformer.wire.PlainLink`, or the secure channel that wraps it (``secure/channel.py``: sealed after
  attestation, masked by secure aggregation); a round never sees the difference;
- **validation**: a reply must be a metrics record of numbers naming the client this node is and the
  round (:func:`validate_reply`), every payload must have the names/shapes/dtypes the configuration and
  the protocol give, finite values, and pass the protocol's ``check_payload``; a client whose reply is
  invalid, missing (dropout, timeout) or makes the aggregation raise is dropped from the round with a
  ``dropped`` event;
- **measurements**: the bytes of every message, down and up, as they travelled, and every phase time land
  on the client's line of the round in ``metrics.jsonl`` (several messages to one client add up).

Message types (``wire.py``): ``train`` (local training; the reply carries the payload, or only a report when
the protocol asks for payloads afterwards; an incoming model — Phong's sequential round — is adopted before
training), ``train.payload`` (the server asks a client for a payload after training: FedPC's pilot model or
ternary vector), ``train.apply`` (the server's model or aggregate, then a test evaluation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from ..config import RunConfig
from ..core.shared import Tensors
from ..protocols.interface.base import Aggregated, FederatedProtocol
from ..recording.recorder import RunRecorder
from ..wire import (
    APPLY,
    PAYLOAD,
    TRAIN,
    Delivery,
    FederationError,
    Link,
    TensorSpec,
    from_array_record,
    to_array_record,
)
from .replies import ReplyError, check_spec, describe, drop, require, validate_reply

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------- one round


@dataclass
class Server:
    """What the server's rounds share for a whole run."""

    cfg: RunConfig
    link: Link
    protocol: FederatedProtocol
    recorder: RunRecorder
    clients: dict[int, int]  # node id -> client id
    min_valid: int
    payload_spec: Callable[[], TensorSpec]  # what every client's payload must be, from the configuration
    initial: Callable[[], Tensors]  # the identical initial model's trainable tensors
    server_phases: dict[str, float] = field(default_factory=dict)
    synced: dict[int, int] = field(default_factory=dict)  # client -> round of the last aggregate it applied


class RoundIO:
    """One round's validated, measured messages (see the module's docstring); implements
    ``protocols.interface.base.RoundMessages``.

    ``rows`` holds each client's line of the round (node id -> metrics), merged over every message the
    client answered; a client dropped from the round loses its line. ``fields`` are added to every line.
    """

    def __init__(self, server: Server, rnd: int, nodes: list[int], exchange: bool) -> None:
        self.server, self.rnd, self.nodes, self.exchange = server, rnd, list(nodes), exchange
        self.cfg, self.protocol, self.clients, self.link = server.cfg, server.protocol, server.clients, server.link
        self.report = self.protocol.server()  # the protocol's payload check and round reports
        self.check_payload = self.report.check_payload
        self.synced = server.synced
        self.needed = server.min_valid
        self.rows: dict[int, dict[str, Any]] = {}
        self.fields: dict[str, Any] = {}
        self.sampled: list[int] | None = None  # with client sampling: the nodes sampled this round
        self.stopped: str | None = None  # the protocol ended the run before this round: why
        for client in sorted(set(self.clients.values()) - {self.clients[n] for n in self.nodes}):
            log.warning("round %d: client %d is not connected and misses the round", rnd, client)
            server.recorder.event(event="absent", round=rnd, client=client)

    # -- bookkeeping

    def client(self, node: int) -> int:
        return self.clients[node]

    def initial(self) -> Tensors:
        return self.server.initial()

    def drop(self, node: int, reason: str) -> None:
        drop(self.server.recorder, self.rnd, node, self.clients, reason)
        self.rows.pop(node, None)

    def require(self, step: str) -> None:
        """Fail the round when fewer clients than ``federation.min_clients`` (of those taking part) have a line."""
        require(len(self.rows), self.needed, self.rnd, step)

    def replied(self) -> dict[int, Mapping[str, Any]]:
        """The nodes with a valid line so far, and the line (read-only: :meth:`note` adds to it)."""
        return dict(self.rows)

    def left_out(self) -> list[int]:
        """The connected nodes without a line this round (not drawn, or dropped)."""
        return [n for n in self.nodes if n not in self.rows]

    def note(self, node: int, **fields: Any) -> None:
        """Add ``fields`` to ``node``'s line of the round."""
        self.rows[node].update(fields)

    def add_fields(self, fields: Mapping[str, Any]) -> None:
        """Add ``fields`` to every line of the round."""
        self.fields.update(fields)

    def behind(self, nodes: list[int], catch_up: Callable[[int], Tensors | None]) -> dict[int, Tensors]:
        """For catch-up: each of ``nodes`` for which the protocol's ``catch_up(version)`` of the round its client's
        state is from (the last aggregate it applied; 0: the initial model) gives a model to start from, with it."""
        models = {}
        for n in nodes:
            model = catch_up(self.synced.get(self.clients[n], 0))
            if model is not None:
                models[n] = model
        return models

    def event(self, **fields: Any) -> None:
        self.server.recorder.event(round=self.rnd, **fields)

    def stop(self, reason: str) -> None:
        log.warning("stopping before round %d: %s", self.rnd, reason)
        self.server.recorder.event(event="stopped", round=self.rnd, reason=reason)
        self.stopped = reason

    def _receive(self, node: int, got: Delivery, step: str) -> dict[str, Any] | None:
        """The reply's validated metrics merged into the client's line (bytes add up), or None (dropped)."""
        reply, fed = got.reply, self.cfg.federation
        if reply is None:
            self.drop(node, f"no reply to {step}")
            return None
        if reply.has_error():
            from ..core.dp_checks import MARK, DPCheckError

            if MARK in (reply.error.reason or ""):  # a failed privacy.checks check: the run stops (core/dp_checks.py)
                raise DPCheckError(f"round {self.rnd}: {reply.error.reason}")
            self.drop(node, f"{step} failed: {reply.error.reason}")
            return None
        if got.invalid is not None:
            self.drop(node, f"invalid payload: {got.invalid}")
            return None
        try:
            client, metrics = validate_reply(
                reply, self.rnd, node, self.clients, step, expected=fed.clients, max_examples=fed.max_examples
            )
        except ReplyError as exc:
            self.drop(node, f"invalid reply to {step}: {exc}")
            return None
        self.clients[node] = client
        row = self.rows.setdefault(node, {"bytes_up": 0, "bytes_down": 0})
        row["bytes_up"] += got.up
        row["bytes_down"] += got.down
        row.update(metrics, round=self.rnd, client=client)
        return row

    def _payloads(
        self, deliveries: dict[int, Delivery], step: str, specs: Mapping[int, TensorSpec | None]
    ) -> dict[int, Tensors]:
        """The valid payloads of the replies, each checked against its spec and by the protocol."""
        payloads: dict[int, Tensors] = {}
        for node, got in deliveries.items():
            if self._receive(node, got, step) is None or node not in specs:
                continue
            try:
                reply = cast(Message, got.reply)  # _receive returned a line: there is a reply
                # a record of another kind fails in from_array_record and drops the client below
                payload = from_array_record(cast(ArrayRecord, reply.content["payload"]), what="payload")
                node_spec = specs[node]
                spec = node_spec if node_spec is not None else self.server.payload_spec()
                check_spec(payload, self.link.payload_spec(spec))
                self.check_payload(self.rnd, payload)
                payloads[node] = payload
            except FederationError:
                raise
            except Exception as exc:  # anything a client's reply makes us raise drops that client
                self.drop(node, f"invalid payload: {describe(exc)}")
        return payloads

    # -- messages

    def prepare(self, participants: list[int], *, sampled: bool = False) -> list[int]:
        """Before the round's ``train``: the link's setup of the round (secure channel: attest new nodes, the
        secure-aggregation keys and shares); returns the participants still in. ``federation.min_clients`` is
        capped at the participants; ``sampled``: the lines say which nodes were drawn."""
        self.needed = min(self.needed, len(participants))
        participants = self.link.prepare(self.rnd, participants, self.exchange)
        if sampled:
            self.sampled = participants
        return participants

    def train(
        self,
        nodes: list[int],
        *,
        payload: bool,
        models: Mapping[int, Tensors] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> dict[int, Tensors]:
        """``train`` to ``nodes`` (each adopting ``models[node]`` first, when given); returns the valid
        payloads (``payload``), every valid reply's line in ``rows``. Invalid payloads drop their client."""
        train_cfg = ConfigRecord({"round": self.rnd, "exchange": self.exchange, **dict(config or {})})

        def content(node: int) -> RecordDict:
            record = RecordDict({"config": train_cfg})
            if models is not None and node in models:
                record["model"] = to_array_record(dict(models[node]))
            return record

        deliveries = self.link.send(nodes, TRAIN, self.rnd, content)
        return self._payloads(deliveries, "train", {n: None for n in nodes} if payload else {})

    def request(self, requests: Mapping[int, Mapping[str, Any]], specs: Mapping[int, TensorSpec]) -> dict[int, Tensors]:
        """``train.payload``: ask each node for the payload ``requests[node]`` describes (after its ``train``),
        checked against ``specs[node]``; returns the valid payloads."""
        rnd = self.rnd
        deliveries = self.link.send(
            list(requests),
            PAYLOAD,
            rnd,
            lambda n: RecordDict({"config": ConfigRecord({"round": rnd, **dict(requests[n])})}),
        )
        return self._payloads(deliveries, "payload", specs)

    def _combine(self, payloads: dict[int, Tensors]) -> Aggregated:
        inputs, weights, phases = self.link.combine(
            self.rnd, payloads, {n: self.rows[n]["num_examples"] for n in payloads}, self.protocol.spec.mean_weighting
        )
        result = self.protocol.aggregate(self.rnd, inputs, weights)
        singles = [e for e in result.events if "index" in e]  # the others are about the aggregate itself
        if singles and len(inputs) != len(payloads):  # pragma: no cover - robust.* refuses secure aggregation
            raise FederationError("the aggregation reported events about single updates it never saw")
        return replace(result, phases={**phases, **result.phases})

    def _record_aggregate_events(self, events: list[dict[str, Any]], nodes: list[int]) -> None:
        """What the aggregation did to single updates (robust.*: clipped, left out), one event each, by client; an
        event without ``index`` is about the round's aggregate (robust.root_finetune), on no client."""
        for item in events:
            fields = {k: v for k, v in item.items() if k != "index"}
            if "index" not in item:
                log.info("round %d: %s", self.rnd, fields.get("reason", ""))
                self.event(**fields)
                continue
            node = nodes[int(item["index"])]
            log.warning("round %d: client %s: %s", self.rnd, self.clients.get(node), fields.get("reason", ""))
            self.event(client=self.clients.get(node), node=node, **fields)

    def aggregate(self, payloads: dict[int, Tensors]) -> tuple[Tensors, dict[str, float]]:
        """The protocol's aggregate of ``payloads`` (secure aggregation combines them first, unseen). When it
        raises, each contribution is aggregated on its own to find the ones that make it fail: those clients
        are dropped and the others aggregated, while ``federation.min_clients`` allows."""
        try:
            result = self._combine(payloads)
        except FederationError:
            raise
        except Exception as exc:
            culprits = {}
            for node in list(payloads):
                try:
                    self._combine({node: payloads[node]})
                except FederationError:
                    raise
                except Exception as single:  # this client's contribution alone makes the aggregation fail
                    culprits[node] = single
            if not culprits:
                raise FederationError(
                    f"round {self.rnd}: the aggregation failed with every client's contribution "
                    f"valid on its own: {describe(exc)}"
                ) from exc
            for node, culprit in culprits.items():
                self.drop(node, f"aggregation failed on its contribution: {describe(culprit)}")
                payloads.pop(node)
            self.require("aggregate")
            result = self._combine(payloads)
        self._record_aggregate_events(result.events, list(payloads))
        self.add_fields(result.fields)
        for key, value in result.phases.items():
            self.server.server_phases[key] = self.server.server_phases.get(key, 0.0) + value
        return result.tensors, result.phases

    def apply(
        self, nodes: list[int], tensors: Mapping[str, torch.Tensor], phases: Mapping[str, float] | None = None
    ) -> None:
        """``train.apply``: every node adopts ``tensors`` (the aggregate or the server's model) and evaluates;
        ``phases`` (the server's phase times of the round) go on each of their lines. Then at least
        ``federation.min_clients`` must have a line, and each client that applied it is synced to this round."""
        content = RecordDict({"config": ConfigRecord({"round": self.rnd}), "aggregate": to_array_record(dict(tensors))})
        for node, got in self.link.send(nodes, APPLY, self.rnd, lambda _n: content).items():
            row = self._receive(node, got, "apply")
            if row is not None:
                row.update(phases or {})
        self.require("apply")
        self.synced.update({self.clients[n]: self.rnd for n in self.rows})

    def finish(self) -> None:
        """Write every line of the round (client order), with the round's fields and the link's costs."""
        for node in sorted(self.rows, key=lambda n: self.clients[n]):
            row = self.rows[node]
            row["exchanged"] = self.exchange
            if self.sampled is not None:
                row["sampled"] = node in self.sampled
            row.update(self.fields)
            self.link.finish_row(self.rnd, node, row)
            self.server.recorder.record(row)


__all__ = ["FederationError", "RoundIO", "Server"]
