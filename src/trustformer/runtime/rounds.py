"""The server's round, as a protocol declares it, over one validated, measured, secure send/receive helper.

``run_federation`` (``trustformer.app``) runs the rounds; what happens inside one is the protocol's
``run_round(rnd_io)`` (an optional hook, ``protocols/base.py``), or :func:`standard_round` — train,
collect every client's payload, aggregate, apply — for the protocols that do not declare one (FedAvg,
Trustformer, the DP baselines, top-k). A round function only says which messages go to which clients
and what the server computes from the replies; :class:`RoundIO` does the rest for every protocol alike:

- **secure channel**: every message goes out and comes back through the run's ``ServerExchange``
  (``secure/exchange.py``): sealed after attestation (``tee``), masked (``secagg``), or plain; a
  protocol never sees the difference;
- **validation**: a reply must be a metrics record of numbers naming the client this node is and the
  round (``validate_reply``), every payload must have the names/shapes/dtypes the configuration and the
  protocol give, finite values, and pass the protocol's ``check_payload``; a client whose reply is
  invalid, missing (dropout, timeout) or makes the aggregation raise is dropped from the round with a
  ``dropped`` event;
- **measurements**: the bytes of every message, down and up, and every phase time land on the
  client's line of the round in ``metrics.jsonl`` (several messages to one client in a round add up).

Message types: ``train`` (local training; the reply carries the payload, or only a report when the
protocol asks for payloads afterwards; an incoming model — Phong's sequential round — is adopted before
training), ``train.payload`` (the server asks a client for a payload after training: FedPC's pilot model
or ternary vector), ``train.apply`` (the server's model or aggregate, then a test evaluation).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from ..config import RunConfig
from ..metrics import RunRecorder
from ..wire import PayloadError, TensorSpec, payload_bytes, spec_of

log = logging.getLogger(__name__)

TRAIN, APPLY, PAYLOAD, EVALUATE, QUERY = "train", "train.apply", "train.payload", "evaluate", "query"
POLL_S = 0.5  # seconds between two pulls of the replies still awaited
TTL_MARGIN_S = 10.0  # a message outlives the wait for its reply by this much (the SuperLink then drops it)
# metrics keys the server writes itself: a client's reply may not set them
SERVER_KEYS = frozenset({"event", "node", "reason", "bytes_up", "bytes_down", "exchanged", "sampled", "epsilon",
                         "beta", "pilot", "goodness", "position"})


class FederationError(RuntimeError):
    """The federation cannot go on (too few valid clients, nodes missing)."""


class ReplyError(ValueError):
    """A client's reply is malformed: it is dropped from the round, the run goes on."""


# --------------------------------------------------------------------------------------- messages


def ttl(timeout: float | None) -> float | None:
    """Message lifetime for a wait of ``timeout`` seconds (None: Flower's default)."""
    return None if timeout is None else timeout + TTL_MARGIN_S


def exchange(grid: Grid, messages: list[Message], timeout: float | None) -> dict[int, Message]:
    """Push the messages, then pull their replies until all came or ``timeout`` seconds passed."""
    if not messages:
        return {}
    ids = list(grid.push_messages(messages))
    node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages) if mid}
    pending = set(node_of)
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: dict[int, Message] = {}
    while pending:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[node_of[mid]] = reply
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(POLL_S)
    return replies


def send(grid: Grid, node_ids, message_type: str, rnd: int, make_content, *,
         timeout: float | None = None) -> dict[int, tuple[Message | None, int]]:
    """Send one message per node; return each node's reply (None: none within ``timeout`` seconds)
    with the bytes sent down to it."""
    messages, down = [], {}
    for node in node_ids:
        content = make_content(node)
        down[node] = payload_bytes(content)
        messages.append(Message(content, node, message_type, group_id=str(rnd), ttl=ttl(timeout)))
    replies = exchange(grid, messages, timeout)
    return {node: (replies.get(node), down[node]) for node in node_ids}


def client_of(metrics, node: int, clients: Mapping[int, int], expected: int) -> int:
    """The client id a reply names, which must be a valid one and the one this node is known as."""
    from ..workload import ALL_SHARDS

    client = metrics.get("client") if hasattr(metrics, "get") else None
    if isinstance(client, bool) or not isinstance(client, int):
        raise ReplyError(f"'client' must be an integer, got {client!r}")
    if not (0 <= client < expected or client == ALL_SHARDS):
        raise ReplyError(f"'client' = {client} is not a client of this run")
    if clients.get(node, client) != client:
        raise ReplyError(f"node {node} is client {clients[node]} but its reply says client {client}")
    return client


def validate_reply(reply: Message, rnd: int, node: int, clients: Mapping[int, int], step: str, *, expected: int,
                   max_examples: int) -> tuple[int, dict[str, float | int]]:
    """The client id and metrics of a ``train``, ``train.payload`` or ``train.apply`` reply, or a ReplyError
    saying what is wrong: a ``metrics`` MetricRecord of scalar numbers, the client this node is, the round of
    the message, and for ``train`` a ``num_examples`` that is an integer in [1, ``federation.max_examples``]."""
    if "metrics" not in reply.content:
        raise ReplyError(f"the reply to {step} has no 'metrics' record")
    record = reply.content["metrics"]
    if not isinstance(record, MetricRecord):
        raise ReplyError(f"the 'metrics' record of the reply to {step} is a {type(record).__name__}, "
                         "not a MetricRecord")
    metrics = dict(record)
    client = client_of(metrics, node, clients, expected)
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReplyError(f"metric {key!r} must be a number, got {type(value).__name__}")
        if key in SERVER_KEYS:
            raise ReplyError(f"metric {key!r} is the server's to write")
    if metrics.get("round") != rnd:
        raise ReplyError(f"the reply is for round {metrics.get('round')!r}, not round {rnd} (replayed or stale)")
    if step in ("train", "payload"):
        n = metrics.get("num_examples")
        if not isinstance(n, int) or not 1 <= n <= max_examples:
            raise ReplyError(f"num_examples = {n!r} must be an integer in [1, {max_examples}] "
                             "(federation.max_examples)")
    return client, metrics


def check_spec(payload: Mapping[str, torch.Tensor], expected: TensorSpec) -> None:
    got = spec_of(dict(payload))
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        extra = sorted(set(got) - set(expected))[:3]
        wrong = [f"{n} {got[n][0]} {got[n][1]} (expected {expected[n][0]} {expected[n][1]})"
                 for n in sorted(set(got) & set(expected)) if got[n] != expected[n]][:3]
        raise PayloadError("payload names/shapes/dtypes differ from those the configuration gives: "
                           + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                                   f"unexpected {extra}" if extra else "",
                                                   f"wrong {wrong}" if wrong else "") if x))


def describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, (PayloadError, ReplyError)) else f"{type(exc).__name__}: {text}"


def drop(recorder: RunRecorder, rnd: int, node: int, clients: Mapping[int, int], reason: str) -> None:
    who = clients.get(node, f"node {node}")
    log.warning("round %d: client %s dropped from the round: %s", rnd, who, reason)
    recorder.event(event="dropped", round=rnd, client=clients.get(node), node=node, reason=reason)


def require(valid: int, needed: int, rnd: int, step: str) -> None:
    if valid < needed:
        raise FederationError(
            f"round {rnd} ({step}): only {valid} client(s) replied with a valid message, "
            f"{needed} required (federation.min_clients); see the dropped events in metrics.jsonl"
        )


# --------------------------------------------------------------------------------------- one round


@dataclass
class Server:
    """What the server's rounds share for a whole run."""

    cfg: RunConfig
    grid: Grid
    protocol: Any
    recorder: RunRecorder
    secure: Any  # secure.exchange.ServerExchange
    clients: dict[int, int]  # node id -> client id
    min_valid: int
    timeout: float | None
    payload_spec: Callable[[], TensorSpec]  # what every client's payload must be, from the configuration
    initial: Callable[[], dict[str, torch.Tensor]]  # the identical initial model's trainable tensors
    server_phases: dict[str, float] = field(default_factory=dict)


class RoundIO:
    """One round's validated, measured, secure messages (see the module's docstring).

    ``rows`` holds each client's line of the round (node id -> metrics), merged over every message the
    client answered; a client dropped from the round loses its line. ``fields`` are added to every line.
    """

    def __init__(self, server: Server, rnd: int, nodes: list[int], exchange: bool) -> None:
        self.server, self.rnd, self.nodes, self.exchange = server, rnd, list(nodes), exchange
        self.cfg, self.protocol, self.clients = server.cfg, server.protocol, server.clients
        self.needed = server.min_valid
        self.rows: dict[int, dict[str, Any]] = {}
        self.fields: dict[str, Any] = {}
        self.sampled: list[int] | None = None  # with client sampling: the nodes sampled this round
        self.stopped: str | None = None  # the protocol ended the run before this round: why

    # -- bookkeeping

    def client(self, node: int) -> int:
        return self.clients[node]

    def drop(self, node: int, reason: str) -> None:
        drop(self.server.recorder, self.rnd, node, self.clients, reason)
        self.rows.pop(node, None)

    def require(self, valid: int, step: str) -> None:
        require(valid, self.needed, self.rnd, step)

    def event(self, **fields: Any) -> None:
        self.server.recorder.event(round=self.rnd, **fields)

    def stop(self, reason: str) -> None:
        log.warning("stopping before round %d: %s", self.rnd, reason)
        self.server.recorder.event(event="stopped", round=self.rnd, reason=reason)
        self.stopped = reason

    def _row(self, node: int, reply: Message | None, down: int, step: str) -> dict[str, Any] | None:
        """The reply's validated metrics as a line (with its bytes), or None (the client is dropped)."""
        fed = self.cfg.federation
        if reply is None:
            self.drop(node, f"no reply to {step}")
            return None
        if reply.has_error():
            self.drop(node, f"{step} failed: {reply.error.reason}")
            return None
        try:
            client, metrics = validate_reply(reply, self.rnd, node, self.clients, step, expected=fed.clients,
                                             max_examples=fed.max_examples)
        except ReplyError as exc:
            self.drop(node, f"invalid reply to {step}: {exc}")
            return None
        self.clients[node] = client
        row: dict[str, Any] = dict(metrics)
        row.update(round=self.rnd, client=client, bytes_down=down, bytes_up=payload_bytes(reply.content))
        return row

    def _merge(self, node: int, row: dict[str, Any]) -> dict[str, Any]:
        """Add a message's line to the client's line of the round (bytes add up)."""
        if node not in self.rows:
            self.rows[node] = row
            return row
        merged = self.rows[node]
        merged["bytes_up"] += row.pop("bytes_up")
        merged["bytes_down"] += row.pop("bytes_down")
        merged.update(row)
        return merged

    def _payload(self, node: int, reply: Message, row: dict[str, Any], spec: TensorSpec | None,
                 kind: str) -> dict[str, torch.Tensor]:
        """A reply's payload through the secure channel, checked against ``spec`` and the protocol."""
        secure = self.server.secure
        payload = secure.read_payload(node, self.rnd, reply, row, kind=kind)
        if self.cfg.secure.mode in ("none", "tee"):  # secagg: the masked vector's length is checked
            check_spec(payload, spec if spec is not None else self.server.payload_spec())
        check = getattr(self.protocol, "check_payload", None)
        if check is not None:
            check(payload)
        return payload

    # -- messages

    def prepare(self, participants: list[int]) -> list[int]:
        """Before the round's ``train``: the secure exchange's setup (tee: attest new nodes; secagg: keys
        and shares); returns the participants still in."""
        return self.server.secure.prepare_round(self.rnd, participants, self.exchange)

    def train(self, nodes: list[int], *, payload: bool, models: Mapping[int, Mapping[str, torch.Tensor]] | None = None,
              config: Mapping[str, Any] | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """``train`` to ``nodes`` (each adopting ``models[node]`` first, when given); returns the valid
        payloads (``payload``), every valid reply's line in ``rows``. Invalid payloads drop their client."""
        secure, rnd = self.server.secure, self.rnd
        train_cfg = ConfigRecord({"round": rnd, "exchange": self.exchange, **dict(config or {})})

        def content(node: int) -> RecordDict:
            record = secure.train_content(node, rnd, self.exchange, RecordDict({"config": train_cfg}))
            if models is not None and node in models:
                secure.put_model(record, node, rnd, models[node])
            return record

        replies = send(self.server.grid, nodes, TRAIN, rnd, content, timeout=self.server.timeout)
        payloads: dict[int, dict[str, torch.Tensor]] = {}
        for node, (reply, down) in replies.items():
            row = self._row(node, reply, down, "train")
            if row is None:
                continue
            row = self._merge(node, row)
            try:
                if payload:
                    payloads[node] = self._payload(node, reply, row, None, "train")
                elif self.exchange and self.cfg.secure.mode != "none":  # a sealed report without arrays
                    check_spec(self.server.secure.read_payload(node, self.rnd, reply, row), {})
            except FederationError:
                raise
            except Exception as exc:  # anything a client's reply makes us raise drops that client
                self.drop(node, f"invalid payload: {describe(exc)}")
        return payloads

    def request(self, requests: Mapping[int, Mapping[str, Any]], specs: Mapping[int, TensorSpec]
                ) -> dict[int, dict[str, torch.Tensor]]:
        """``train.payload``: ask each node for the payload ``requests[node]`` describes (after its ``train``),
        checked against ``specs[node]``; returns the valid payloads."""
        rnd = self.rnd
        replies = send(self.server.grid, list(requests), PAYLOAD, rnd,
                       lambda n: RecordDict({"config": ConfigRecord({"round": rnd, **dict(requests[n])})}),
                       timeout=self.server.timeout)
        payloads: dict[int, dict[str, torch.Tensor]] = {}
        for node, (reply, down) in replies.items():
            row = self._row(node, reply, down, "payload")
            if row is None:
                continue
            row = self._merge(node, row)
            kind = PAYLOAD + ".retry" if requests[node].get("retry") else PAYLOAD
            try:
                payloads[node] = self._payload(node, reply, row, specs[node], kind)
            except FederationError:
                raise
            except Exception as exc:
                self.drop(node, f"invalid payload: {describe(exc)}")
        return payloads

    def aggregate(self, payloads: dict[int, dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The protocol's aggregate of ``payloads`` (through the secure exchange: in the TEE with tee,
        unmasked with secagg). When the aggregation raises, each contribution is aggregated on its own to
        find the ones that make it fail: those clients are dropped and the others aggregated, while
        ``federation.min_clients`` allows."""
        secure, protocol, rnd, rows = self.server.secure, self.protocol, self.rnd, self.rows
        try:
            return secure.aggregate(protocol, rnd, payloads, rows)
        except FederationError:
            raise
        except Exception as exc:
            first = exc
        culprits = {}
        for node in list(payloads):
            try:
                secure.aggregate(protocol, rnd, {node: payloads[node]}, {node: rows[node]})
            except FederationError:
                raise
            except Exception as exc:  # this client's contribution alone makes the aggregation fail
                culprits[node] = exc
        if not culprits:
            raise FederationError(f"round {rnd}: the aggregation failed with every client's contribution valid on "
                                  f"its own: {describe(first)}") from first
        for node, exc in culprits.items():
            self.drop(node, f"aggregation failed on its contribution: {describe(exc)}")
            payloads.pop(node)
        self.require(len(rows), "aggregate")
        return secure.aggregate(protocol, rnd, payloads, rows)

    def apply(self, nodes: list[int], tensors: Mapping[str, torch.Tensor], phases: Mapping[str, float] | None = None
              ) -> None:
        """``train.apply``: every node adopts ``tensors`` (the aggregate or the server's model) and evaluates;
        ``phases`` (the server's phase times of the round) go on each of their lines."""
        replies = send(self.server.grid, nodes, APPLY, self.rnd,
                       self.server.secure.apply_content(self.rnd, dict(tensors)), timeout=self.server.timeout)
        for node, (reply, down) in replies.items():
            row = self._row(node, reply, down, "apply")
            if row is None:
                continue
            self._merge(node, row).update(phases or {})

    def finish(self) -> None:
        """Write every line of the round (client order), with the round's fields and secure costs."""
        secure, recorder = self.server.secure, self.server.recorder
        for node in sorted(self.rows, key=lambda n: self.clients[n]):
            row = self.rows[node]
            row["exchanged"] = self.exchange
            if self.sampled is not None:
                row["sampled"] = node in self.sampled
            row.update(self.fields)
            secure.finish_row(self.rnd, node, row)
            if self.protocol.name == "trustformer":
                row["beta"] = self.cfg.federation.beta
            recorder.record(row)


def standard_round(io: RoundIO) -> None:
    """The round of the protocols that declare none: every client trains and (exchange rounds) sends its
    payload; the server aggregates the valid ones; every valid client applies the aggregate and evaluates.
    With client sampling (the protocol's ``server_round``), the clients not sampled only adopt the aggregate."""
    protocol = io.protocol
    choose = getattr(protocol, "server_round", None)  # optional hooks: see protocols/base.py
    participants = io.nodes
    if io.exchange and choose is not None:
        chosen = choose(io.rnd, [io.client(n) for n in io.nodes])  # sampled by client id: the same in any runtime
        if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
            io.stop(getattr(protocol, "stop_reason", lambda: "stopped by the protocol")())
            return
        participants = [n for n in io.nodes if io.client(n) in set(chosen)]
        io.needed = min(io.needed, len(participants))
    participants = io.prepare(participants)
    if io.exchange and choose is not None:
        io.sampled = participants
    payloads = io.train(participants, payload=io.exchange)
    if not io.exchange:
        io.require(len(io.rows), "train")
        return
    for node in [n for n in io.rows if n not in payloads]:
        io.rows.pop(node)
    io.require(len(io.rows), "train")
    if io.rows:
        aggregate, phases = io.aggregate(payloads)
        for key, value in phases.items():
            io.server.server_phases[key] = io.server.server_phases.get(key, 0.0) + value
        others = [n for n in io.nodes if n not in io.rows] if choose is not None else []
        io.apply(list(io.rows) + others, aggregate, phases)
        io.require(len(io.rows), "apply")
    else:
        io.event(event="no_participants", reason="no client was sampled for this round")
    round_done = getattr(protocol, "server_round_done", None)
    if round_done is not None:
        io.fields = round_done(io.rnd)


__all__ = ["FederationError", "ReplyError", "RoundIO", "SERVER_KEYS", "Server", "standard_round", "validate_reply"]
