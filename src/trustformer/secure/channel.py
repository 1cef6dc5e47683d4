"""The server's side of the secure channel: a :class:`~trustformer.wire.Link` that wraps the plain one, the
way the client mod (``mod.py``) wraps the client's handlers. The round loop and the protocols never see it.

``none``: :func:`secure_link` returns the plain link unchanged.

``tee`` (attested aggregator, sealed payloads; the TEE is a software emulation, see ``tee.py``): before
round 1 two ``query.attest`` messages per client — the client answers the first with a fresh nonce and
X25519 key; the second carries the aggregator's signed quote, which the client verifies
(``attestation.py``) before it trains or sends anything. Every ``train`` and ``train.payload`` reply then
travels sealed (``sealing.py``) in a ``secure`` record, its metrics sealed with it (bound to the client's
example count; only the client id, round and example count in clear); the ``train.apply`` aggregate and a
model sent down (Phong) travel sealed too, encoded with the safe codec (``codec.py``). A reply the
aggregator cannot open drops that client for the round, like any invalid payload; a message a client
rejects makes its reply an error, with the same effect.

``secagg`` (pairwise-masked secure aggregation, ``secagg.py``), in every exchange round: ``query.secagg``
*keys* (each client advertises two X25519 keys and the names/shapes of the payload it will send, which must
be those the configuration gives) → *shares* (the aggregator broadcasts the keys; each client returns its
encrypted Shamir shares) → ``train`` (carrying the shares routed to that client; the client's mod masks its
payload) → *unmask* (the survivors reveal the shares the aggregator needs to remove the masks). The
aggregator learns only the sum, turns it into the mean the protocol declares (``mean_weighting``: by
examples or uniform) and hands the protocol's ``aggregate`` that mean alone. Nothing here names a protocol.
``tee+secagg`` seals every one of these messages as well.

Costs per (round, client) line of ``metrics.jsonl``: ``attest_bytes``/``attest_s`` (round 1),
``seal_s``/``open_s`` (both ends), ``secagg_bytes``/``secagg_s`` (the extra secure-aggregation
messages and steps), ``payload_overhead_bytes`` (what the secure form of the ``train`` payload and
the aggregate costs beyond their plain ArrayRecords); the extra messages are counted in
``bytes_up``/``bytes_down`` too. ``summary.json["secure"]`` adds them up.
"""

from __future__ import annotations

import copy

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..config import RunConfig
from ..metrics import RunRecorder
from ..wire import (
    APPLY,
    PAYLOAD,
    TRAIN,
    Delivery,
    FederationError,
    Link,
    PayloadError,
    TensorSpec,
    from_array_record,
    payload_bytes,
    spec_of,
    to_array_record,
)
from . import codec, records
from .attestation import AttestationError, load_signing_key, measured_sources, measurement, public_key_hex
from .provision import plain_vectors, signing_keys, uses_secagg, uses_tee
from .records import ATTEST, CLEAR_METRICS, MODEL_KIND, SEALED_METRICS, SECAGG, SECURE
from .sealing import REJECTED_TAG, SealError
from .secagg import SecAggError, SecAggParams, SecAggServer, quantization_error_bound
from .tee import SoftwareTEE, TEEBackend

log = logging.getLogger(__name__)


class SecureChannelError(FederationError):
    """The secure channel cannot go on (too few attested clients, a secure-aggregation step failed)."""


def secure_link(
    cfg: RunConfig,
    link: Link,
    *,
    run_id: int,
    recorder: RunRecorder,
    drop: Callable[[int, int, str], None],
    clients: Mapping[int, int],
    payload_spec: Callable[[], TensorSpec],
) -> Link:
    """``link`` wrapped by the secure channel of ``secure.mode`` (``none``: ``link`` itself)."""
    if cfg.secure.mode == "none":
        return link
    return SecureLink(
        cfg, link, run_id=run_id, recorder=recorder, drop=drop, clients=clients, payload_spec=payload_spec
    )


@dataclass
class _SecAggRound:
    rnd: int
    server: SecAggServer
    spec: TensorSpec
    routed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # recipient -> sender -> ciphertext
    masked: dict[int, np.ndarray] = field(default_factory=dict)


class SecureLink:
    """The aggregator's side of the secure channel for one run (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        link: Link,
        *,
        run_id: int,
        recorder: RunRecorder,
        drop: Callable[[int, int, str], None],
        clients: Mapping[int, int],
        payload_spec: Callable[[], TensorSpec],
    ) -> None:
        self.cfg, self.link, self.run_id, self.recorder, self._drop = cfg, link, run_id, recorder, drop
        self.mode = cfg.secure.mode
        self.tee, self.secagg = uses_tee(self.mode), uses_secagg(self.mode)
        self.configured_spec = payload_spec
        self.backend: TEEBackend | None = None
        self.key_origin = ""
        self.node_client: dict[int, int] = {}  # node id -> client id, as attested (tee) or announced (secagg)
        self.clients = clients  # the round loop's node id -> client id
        self.attested: set[int] = set()
        self.counts: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.extra: dict[tuple[int, int], Counter[str]] = {}
        self.server_round_s: Counter[int] = Counter()  # secagg: the aggregator's own computation per round
        self.secagg_rounds = 0
        self.bounds: list[float] = []
        self.measured_errors: list[float] = []
        self.float64_rounding: list[float] = []
        self.dropped_after_setup = 0
        self._round: _SecAggRound | None = None
        self._plain_bytes: dict[tuple, int] = {}

    # -- helpers

    def _extra(self, rnd: int, node: int) -> Counter[str]:
        return self.extra.setdefault((rnd, node), Counter())

    def _client(self, node: int) -> int:
        client = self.node_client.get(node, self.clients.get(node))
        if client is None:
            raise SealError("no-session", f"node {node} has no known client id")
        return client

    def _seal_for(self, node: int, rnd: int, kind: str) -> Callable[[bytes], bytes] | None:
        if not self.tee:
            return None

        def seal(data: bytes) -> bytes:
            started = time.perf_counter()
            sealed = self.backend.seal(self._client(node), data, round_=rnd, kind=kind)
            self._extra(rnd, node)["seal_s"] += time.perf_counter() - started
            self.counts["sealed"] += 1
            return sealed

        return seal

    def _open_from(self, node: int, rnd: int, kind: str, bound: dict[str, Any] | None = None):
        if not self.tee:
            return None

        def open_(data: bytes) -> bytes:
            started = time.perf_counter()
            self.counts["sealed"] += 1  # by the client
            try:
                plain = self.backend.open(self._client(node), data, round_=rnd, kind=kind, bound=bound)
            except SealError as exc:
                self.rejected[exc.reason] += 1
                raise
            finally:
                self._extra(rnd, node)["open_s"] += time.perf_counter() - started
            self.counts["opened"] += 1
            return plain

        return open_

    def _plain_bytes_of(self, spec: TensorSpec, key: str) -> int:
        """Bytes of the plain ArrayRecord of arrays with this spec (its size depends on the spec only)."""
        cache_key = (key, tuple(sorted((n, tuple(s), d) for n, (s, d) in spec.items())))
        if cache_key not in self._plain_bytes:
            zeros = {n: torch.zeros(s, dtype=getattr(torch, d)) for n, (s, d) in spec.items()}
            self._plain_bytes[cache_key] = payload_bytes(RecordDict({key: to_array_record(zeros)}))
        return self._plain_bytes[cache_key]

    def _query(
        self, rnd: int, nodes: list[int], step: str, make, budget: str
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Send one ``query.*`` step; count its bytes and the client's seconds under ``budget``; drop
        the clients that fail it. Returns the good replies and the failures' reasons."""
        message_type = ATTEST if budget == "attest" else SECAGG
        ok: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for node, got in self.link.send(nodes, message_type, rnd, make).items():
            extra = self._extra(rnd, node)
            extra[f"{budget}_bytes"] += got.down
            extra["bytes_down"] += got.down
            reply = got.reply
            why = (
                f"no reply to {message_type} ({step})"
                if reply is None
                else f"{message_type} ({step}) failed: {reply.error.reason}"
                if reply.has_error()
                else None
            )
            if why is not None:
                self._count_client_rejection(why)
                self._drop(rnd, node, why)
                failed[node] = why
                continue
            extra[f"{budget}_bytes"] += got.up
            extra["bytes_up"] += got.up
            metrics = reply.content["metrics"] if "metrics" in reply.content else {}
            for key in ("attest_s", "secagg_s", "seal_s", "open_s"):
                if key in metrics:
                    extra[key] += float(metrics[key])
            self.counts["opened"] += int("open_s" in metrics)  # the client opened the sealed request
            ok[node] = reply
        return ok, failed

    def _count_client_rejection(self, why: str) -> None:
        if "attestation failed" in why:
            self.rejected["attestation (by a client)"] += 1
        else:
            _count_client_rejection_into(self.rejected, why)

    # -- before round 1

    def setup(self, nodes: list[int], needed: int) -> None:
        """tee: every client attests the aggregator before round 1; too few attested clients stop the run."""
        log.info(
            "secure exchange: secure.mode = %s%s",
            self.mode,
            " · TEE EMULATED IN SOFTWARE (no hardware protection)" if self.tee else "",
        )
        if not self.tee:
            return
        sec = self.cfg.secure
        if sec.signing_key:
            key, self.key_origin = load_signing_key(sec.signing_key), f"file {sec.signing_key}"
        elif self.run_id in signing_keys:
            key, self.key_origin = signing_keys[self.run_id]
        else:
            raise SecureChannelError(
                "secure.mode = 'tee' needs the aggregator's attestation signing key: set "
                "secure.signing_key to a PEM file "
                "(`trustformer attest --keygen PREFIX` writes one)"
            )
        self.backend = SoftwareTEE(key, measurement(self.cfg), self.run_id, quote_validity_s=sec.quote_validity_s)
        log.info(
            "secure exchange: emulated TEE, measurement %s, attestation key %s… (%s)",
            self.backend.measurement(),
            public_key_hex(key)[:16],
            self.key_origin,
        )
        attested, failures = self._attest(0, list(nodes))  # round 0: before the first round
        if len(attested) < needed:
            raise SecureChannelError(
                f"attestation failed for {len(nodes) - len(attested)} of {len(nodes)} client(s), {needed} "
                f"needed (federation.min_clients); no payload was sent. {failures[0] if failures else ''}"
            )

    def _attest(self, rnd: int, nodes: list[int]) -> tuple[list[int], list[str]]:
        """The two ``query.attest`` steps with ``nodes``: returns the nodes that verified the quote, and
        why the others did not."""
        hello, failed = self._query(
            rnd, nodes, "hello", lambda _n: RecordDict({"config": ConfigRecord({"step": "hello"})}), "attest"
        )
        quotes: dict[int, tuple[bytes, bytes]] = {}
        failures = [f"client node {node}: {why}" for node, why in failed.items()]
        for node, reply in hello.items():
            try:
                record = reply.content["attest"]
                client, nonce, client_key = int(record["client"]), bytes(record["nonce"]), bytes(record["client_key"])
                started = time.perf_counter()
                quotes[node] = self.backend.quote(client, nonce, client_key)
                self._extra(rnd, node)["attest_s"] += time.perf_counter() - started
                self.node_client[node] = client
            except (KeyError, TypeError, ValueError, AttestationError) as exc:
                failures.append(f"client node {node}: {exc}")
                self._drop(rnd, node, f"attestation: {exc}")
        verified, failed = self._query(
            rnd,
            list(quotes),
            "quote",
            lambda n: RecordDict(
                {
                    "config": ConfigRecord({"step": "quote"}),
                    "attest": ConfigRecord({"quote": quotes[n][0], "signature": quotes[n][1]}),
                }
            ),
            "attest",
        )
        for node, why in failed.items():
            failures.append(f"client {self.node_client.pop(node)}: {why}")
        self.attested.update(verified)
        self.counts["attestations"] += len(verified)
        return list(verified), failures

    # -- every round

    def prepare(self, rnd: int, participants: list[int], exchange: bool) -> list[int]:
        """Before a round's ``train``: tee attests nodes seen for the first time (a client that rejoined);
        secagg runs the keys and shares steps of exchange rounds. Returns the participants still in."""
        if self.tee:
            new = [n for n in participants if n not in self.attested]
            if new:
                self._attest(rnd, new)
            participants = [n for n in participants if n in self.attested]
        if not (self.secagg and exchange) or not participants:
            return self.link.prepare(rnd, participants, exchange)
        params = SecAggParams(
            threshold=records.secagg_threshold(self.cfg), scale_bits=self.cfg.secure.secagg_scale_bits
        )
        config = ConfigRecord({"round": rnd, "step": "keys"})
        replies, _failed = self._query(rnd, participants, "keys", lambda _n: RecordDict({"config": config}), "secagg")
        keys: dict[int, dict[str, bytes]] = {}
        specs: dict[int, TensorSpec] = {}
        for node, reply in replies.items():
            try:
                if not self.tee:  # with tee the client id is the attested one
                    self.node_client[node] = int(reply.content["metrics"]["client"])
                arrays = records.unpack(
                    reply.content, self._open_from(node, rnd, "secagg.keys"), None, f"secagg keys of node {node}"
                )
                if set(arrays) != {"c_pk", "s_pk", "spec"} or any(
                    a.dtype != np.uint8 or a.ndim != 1 for a in arrays.values()
                ):
                    raise codec.CodecError(f"secagg keys of node {node}: expected uint8 arrays c_pk, s_pk and spec")
                keys[node] = {"c_pk": arrays["c_pk"].tobytes(), "s_pk": arrays["s_pk"].tobytes()}
                specs[node] = records.parse_spec(arrays["spec"].tobytes(), f"secagg keys of node {node}")
            except (KeyError, PayloadError) as exc:
                self._drop(rnd, node, f"secagg keys: {exc}")
        if specs:  # the payload every client must announce follows from the configuration, not from a vote
            expected = records.spec_json(self.configured_spec())
            for node in [n for n in specs if records.spec_json(specs[n]) != expected]:
                self._drop(
                    rnd,
                    node,
                    "secagg keys: the announced payload names/shapes differ from those the "
                    "run's configuration and protocol give",
                )
                keys.pop(node)
                specs.pop(node)
        if len(keys) < params.threshold:
            raise SecureChannelError(
                f"round {rnd} (secagg keys): {len(keys)} client(s) advertised keys, the "
                f"threshold is {params.threshold} (secure.secagg_threshold)"
            )
        spec = next(iter(specs.values()))
        started = time.perf_counter()
        server = SecAggServer(
            list(range(self.cfg.federation.clients)),
            params,
            records.spec_length(spec),
            records.secagg_session(self.run_id, rnd),
        )
        try:
            broadcast = server.collect_keys({self._client(n): k for n, k in keys.items()})
        except SecAggError as exc:
            raise SecureChannelError(f"round {rnd} (secagg keys): {exc}") from None
        arrays = {f"{c}/{name}": records.bytes_array(v) for c, entry in broadcast.items() for name, v in entry.items()}
        self.server_round_s[rnd] += time.perf_counter() - started

        def addressed_to_the_others(client: int, entry: dict[int, bytes]) -> None:
            if set(entry) != set(broadcast) - {client} or not all(entry.values()):
                raise codec.CodecError(
                    f"secagg shares of client {client}: addressed to {sorted(entry)}, "
                    f"expected {sorted(set(broadcast) - {client})}"
                )

        shares = self._secagg_step(rnd, list(keys), "shares", arrays, "secagg shares", addressed_to_the_others)
        started = time.perf_counter()
        try:
            routed = server.route_shares(shares)
        except SecAggError as exc:
            raise SecureChannelError(f"round {rnd} (secagg shares): {exc}") from None
        self._round = _SecAggRound(rnd=rnd, server=server, spec=spec, routed=routed)
        self.server_round_s[rnd] += time.perf_counter() - started
        self.secagg_rounds += 1
        return self.link.prepare(rnd, [n for n in participants if self.node_client.get(n) in routed], exchange)

    def _secagg_step(
        self,
        rnd: int,
        nodes: list[int],
        step: str,
        arrays: dict[str, np.ndarray],
        what: str,
        check: Callable[[int, dict[int, bytes]], None] | None = None,
    ) -> dict[int, dict[int, bytes]]:
        """Send one secure-aggregation step (sealed in tee+secagg) to ``nodes``; each valid reply as
        client -> {client id: bytes}. A reply that cannot be opened, decoded or fails ``check`` drops
        that client from the round."""
        replies, _failed = self._query(
            rnd,
            nodes,
            step,
            lambda n: RecordDict(
                {
                    "config": ConfigRecord({"round": rnd, "step": step}),
                    SECURE: records.pack(arrays, self._seal_for(n, rnd, f"secagg.{step}")),
                }
            ),
            "secagg",
        )
        out: dict[int, dict[int, bytes]] = {}
        for node, reply in replies.items():
            client = self._client(node)
            label = f"{what} of client {client}"
            try:
                entry = records.id_keyed(
                    records.unpack(reply.content, self._open_from(node, rnd, f"secagg.{step}"), None, label), label
                )
                if check is not None:
                    check(client, entry)
                out[client] = entry
            except (KeyError, PayloadError) as exc:
                self._drop(rnd, node, f"{what}: {exc}")
        return out

    # -- messages

    def send(
        self, nodes: Sequence[int], message_type: str, rnd: int, make_content: Callable[[int], RecordDict]
    ) -> dict[int, Delivery]:
        """The plain link's ``send`` with every content sealed or given its shares on the way out, and every
        ``train``/``train.payload`` reply opened (and its masked vector kept) on the way in."""
        retries: set[int] = set()  # train.payload asked again of another worker (FedPC): sealed as a retry

        def outgoing(node: int) -> RecordDict:
            content = make_content(node)
            if message_type == PAYLOAD and dict(content["config"]).get("retry"):
                retries.add(node)
            return self._outgoing(node, message_type, rnd, content)

        deliveries = self.link.send(nodes, message_type, rnd, outgoing)
        if message_type in (TRAIN, PAYLOAD):
            for node, got in deliveries.items():
                if got.reply is None or got.reply.has_error():
                    continue
                kind = message_type + (".retry" if node in retries else "")
                try:
                    self._incoming(node, rnd, kind, got.reply)
                except (PayloadError, SecAggError) as exc:
                    got.invalid = str(exc)
                except Exception as exc:  # anything a client's reply makes us raise drops that client
                    got.invalid = f"{type(exc).__name__}: {exc}"
        return deliveries

    def _outgoing(self, node: int, message_type: str, rnd: int, content: RecordDict) -> RecordDict:
        content = RecordDict(dict(content.items()))  # the same content may go to every node
        if message_type == TRAIN and self.secagg and self._round is not None and self._round.rnd == rnd:
            routed = {
                str(sender): records.bytes_array(ct)
                for sender, ct in self._round.routed.get(self._client(node), {}).items()
            }
            record = records.pack(routed, self._seal_for(node, rnd, TRAIN))
            self._extra(rnd, node)["secagg_bytes"] += payload_bytes(RecordDict({SECURE: record}))
            content[SECURE] = record
        if not self.tee:
            return content
        for name, kind in (("model", MODEL_KIND), ("aggregate", APPLY)):
            if name not in content:
                continue
            encoded, spec = self._encode(content.pop(name))
            if node not in self.attested:  # no session: nothing sealed goes to it
                continue
            record = ConfigRecord({"sealed": self._seal_for(node, rnd, kind)(encoded)})
            key = "model" if name == "model" else SECURE
            self._extra(rnd, node)["payload_overhead_bytes"] += payload_bytes(
                RecordDict({key: record})
            ) - self._plain_bytes_of(spec, name)
            content[key] = record
        return content

    def _encode(self, record: ArrayRecord) -> tuple[bytes, TensorSpec]:
        """The codec bytes of an ArrayRecord (encoded once however many clients it is sealed for)."""
        if getattr(self, "_encoded_for", None) is not record:
            tensors = from_array_record(record)
            self._encoded_for, self._encoded = record, (codec.encode(tensors), spec_of(tensors))
        return self._encoded

    def _incoming(self, node: int, rnd: int, kind: str, reply: Message) -> None:
        """A ``train``/``train.payload`` reply as the round sees it, in place: opened (tee), its sealed metrics
        merged, its masked vector kept for the unmasking (secagg, ``train``) and shown as the payload."""
        content = reply.content
        clear = (
            dict(content["metrics"]) if "metrics" in content and isinstance(content["metrics"], MetricRecord) else {}
        )
        if SECURE not in content and not self.tee:
            return  # secagg: a report without a payload (a round that exchanges nothing)
        client = clear.get("client")
        if self.tee and (node not in self.attested or self.node_client.get(node) != client):
            self.rejected["no-session"] += 1
            raise SealError(
                "no-session", f"node {node} (client {client}) has not attested the aggregator as this client"
            )
        masked = self.secagg and kind == TRAIN
        if masked and (self._round is None or self._round.rnd != rnd):
            raise codec.CodecError("masked payload outside a secure-aggregation round")
        expected = {"masked": ((self._round.server.length,), "uint64")} if masked else None
        arrays = records.unpack(
            content,
            self._open_from(node, rnd, kind, {"num_examples": int(clear["num_examples"])}),
            None if self.tee else expected,
            f"payload of client {client}",
        )
        if self.tee:
            if SEALED_METRICS not in arrays:
                raise codec.CodecError(f"payload of client {client}: the sealed record holds no {SEALED_METRICS!r}")
            clear.update(_sealed_metrics(arrays.pop(SEALED_METRICS), client))
            if expected is not None:
                got = {n: (tuple(a.shape), str(a.dtype)) for n, a in arrays.items()}
                if got != expected:
                    raise codec.CodecError(f"payload of client {client}: arrays {got}, expected {expected}")
        record_bytes = payload_bytes(RecordDict({SECURE: content[SECURE]}))
        if masked:
            self._round.masked[client] = arrays["masked"]
            self._extra(rnd, node)["payload_overhead_bytes"] += record_bytes - self._plain_bytes_of(
                self._round.spec, "payload"
            )
            arrays = {"masked": arrays["masked"].view(np.int64)}
        else:
            self._extra(rnd, node)["payload_overhead_bytes"] += record_bytes - self._plain_bytes_of(
                spec_of(arrays), "payload"
            )
        plain = RecordDict({n: r for n, r in content.items() if n not in (SECURE, "metrics")})
        if arrays:
            plain["payload"] = ArrayRecord({n: torch.from_numpy(a) for n, a in arrays.items()})
        plain["metrics"] = MetricRecord(clear)
        reply.content = plain

    def payload_spec(self, spec: TensorSpec) -> TensorSpec:
        if self.secagg and self._round is not None:
            return {"masked": ((self._round.server.length,), "int64")}
        return spec

    def combine(
        self, rnd: int, payloads: dict[int, dict[str, torch.Tensor]], examples: dict[int, int], weighting: str | None
    ) -> tuple[list[dict[str, torch.Tensor]], list[int], dict[str, float]]:
        """secagg: the survivors' mean, unmasked from the masked sum (weighted as the protocol declares), as the
        protocol's only input; otherwise the payloads as they are."""
        if not self.secagg:
            return self.link.combine(rnd, payloads, examples, weighting)
        if weighting is None:
            raise SecureChannelError("secure aggregation needs a protocol whose aggregate is a mean of the payloads")
        nodes = list(payloads)
        started = time.perf_counter()
        state = self._round
        if state is None:
            raise SecureChannelError(f"round {rnd}: no secure-aggregation round to unmask")
        try:
            survivors, dropped = state.server.collect_masked(
                {self._client(n): state.masked[self._client(n)] for n in nodes}
            )
        except SecAggError as exc:
            raise SecureChannelError(f"round {rnd} (secagg masked inputs): {exc}") from None
        self._round = None
        self.dropped_after_setup += len(dropped)
        by_client = {self._client(n): n for n in nodes}
        request = {"survivors": np.array(survivors, dtype=np.int64), "dropped": np.array(dropped, dtype=np.int64)}
        self.server_round_s[rnd] += time.perf_counter() - started
        revealed = self._secagg_step(rnd, nodes, "unmask", request, "secagg unmask")
        started = time.perf_counter()
        try:
            total = state.server.unmask(revealed)
        except SecAggError as exc:
            raise SecureChannelError(f"round {rnd} (secagg unmask): {exc}") from None
        divisor = (
            float(sum(examples[by_client[c]] for c in survivors)) if weighting == "examples" else float(len(survivors))
        )
        mean = total / divisor
        self.bounds.append(quantization_error_bound(len(survivors), self.cfg.secure.secagg_scale_bits) / divisor)
        plain = plain_vectors.pop((self.run_id, rnd), None)
        if plain is not None and all(c in plain for c in survivors):  # simulation only (diagnostics)
            exact = np.sum([plain[c] for c in survivors], axis=0) / divisor
            self.measured_errors.append(float(np.max(np.abs(mean - exact))))
            # the float64 rounding of the two means compared, on top of the quantisation bound
            magnitude = np.sum([np.abs(plain[c]) for c in survivors], axis=0) / divisor
            self.float64_rounding.append(4 * float(np.finfo(np.float64).eps) * float(np.max(magnitude)))
        aggregate, offset = {}, 0
        for name, (shape, dtype) in sorted(state.spec.items()):
            size = int(np.prod(shape))
            aggregate[name] = torch.from_numpy(mean[offset : offset + size].reshape(shape)).to(getattr(torch, dtype))
            offset += size
        self.server_round_s[rnd] += time.perf_counter() - started
        return [aggregate], [1], {"secagg_server_s": self.server_round_s[rnd]}

    def finish_row(self, rnd: int, node: int, row: dict[str, Any]) -> None:
        """Add this round's secure costs to a client's metrics line (and its extra messages to its bytes)."""
        extra = self.extra.pop((rnd, node), Counter())
        extra.update(self.extra.pop((0, node), Counter()))  # the attestation before the first round
        for key in [k for k in row if k.startswith("secure_") and k.endswith("_s")]:
            what = key[:-2].rsplit("_", 1)[1]  # the client's own seconds per message: seal | open | secagg
            extra[f"{what}_s"] += float(row.pop(key))
            self.counts["opened"] += int(what == "open")
        row["bytes_up"] += int(extra.pop("bytes_up", 0))
        row["bytes_down"] += int(extra.pop("bytes_down", 0))
        fields = ["attest_bytes", "attest_s"] if "attest_bytes" in extra else []
        fields += ["seal_s", "open_s"] if self.tee else []
        fields += ["secagg_bytes", "secagg_s"] if self.secagg else []
        fields += ["payload_overhead_bytes"]
        for key in fields:
            value = extra.get(key, 0)
            row[key] = int(value) if key.endswith("_bytes") else round(float(value), 6)
        self.link.finish_row(rnd, node, row)

    # what the summary counts over the whole run: kept in every checkpoint, so a resumed run reports the whole run
    COUNTED = ("counts", "rejected", "server_round_s", "secagg_rounds", "bounds", "measured_errors")
    COUNTED += ("float64_rounding", "dropped_after_setup")

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`summary` has counted so far (the checkpoint's part of the secure link)."""
        return {name: copy.copy(getattr(self, name)) for name in self.COUNTED}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.COUNTED:
            current = getattr(self, name)
            setattr(self, name, type(current)(state[name]) if isinstance(current, Counter) else state[name])

    def summary(self) -> dict[str, Any] | None:
        """``summary.json["secure"]``: mode, backend, counts, overhead (bytes, seconds), quantisation error."""
        records_ = self.recorder.records
        byte_keys = ("attest_bytes", "secagg_bytes", "payload_overhead_bytes")
        second_keys = ("attest_s", "seal_s", "open_s", "secagg_s")
        rejected = Counter(self.rejected)
        for event in self.recorder.events:  # a rejection by a client comes back as its error reply to train.apply
            reason = str(event.get("reason", ""))
            if event.get("event") == "dropped" and not reason.startswith(("query.", "attestation", "invalid payload")):
                _count_client_rejection_into(rejected, reason)
        per_round: dict[str, dict[str, float]] = {}
        for rnd in sorted({r["round"] for r in records_}):
            rows = [r for r in records_ if r["round"] == rnd]
            per_round[str(rnd)] = {
                "bytes": sum(int(r.get(k, 0)) for r in rows for k in byte_keys),
                "seconds": round(
                    sum(float(r.get(k, 0.0)) for r in rows for k in second_keys) + self.server_round_s.get(rnd, 0.0), 6
                ),
            }
        out: dict[str, Any] = {
            "mode": self.mode,
            "counts": {
                "attestations": self.counts["attestations"],
                "sealed": self.counts["sealed"],
                "opened": self.counts["opened"],
                "rejected": dict(sorted(rejected.items())),
            },
            "overhead": {
                "bytes": sum(v["bytes"] for v in per_round.values()),
                "seconds": round(sum(v["seconds"] for v in per_round.values()), 6),
                "per_round": per_round,
                "what": "bytes: attestation and secure-aggregation messages plus the secure payload records beyond "
                "their plain ArrayRecords; seconds: attestation, sealing, opening and secure-aggregation "
                "steps of clients and aggregator",
            },
        }
        if self.tee:
            out.update(
                {
                    "backend": self.backend.name if self.backend else None,
                    "emulated": bool(self.backend.emulated) if self.backend else True,
                    "note": "software emulation of a TEE: quotes, keys and sealing are real, the hardware isolation "
                    "is not (the server process holds the session keys and sees the opened payloads)",
                    "measurement": self.backend.measurement() if self.backend else None,
                    "measured_files": measured_sources(),
                    "attestation_key": self.key_origin,
                }
            )
        if self.secagg:
            out["secagg"] = {
                "threshold": records.secagg_threshold(self.cfg),
                "scale_bits": self.cfg.secure.secagg_scale_bits,
                "rounds": self.secagg_rounds,
                "dropped_after_setup": self.dropped_after_setup,
                # max over rounds of the bound on each coordinate of the averaged payload (sum bound / divisor)
                "quantization_error_bound": max(self.bounds) if self.bounds else None,
                # simulation only: max |secagg mean - plain mean| (float64, before the cast to the payload dtype),
                # which is at most the bound plus the float64 rounding of the comparison
                "measured_max_error": max(self.measured_errors) if self.measured_errors else None,
                "float64_rounding": max(self.float64_rounding) if self.float64_rounding else None,
            }
        return out


def _sealed_metrics(array: np.ndarray, client: int) -> dict[str, Any]:
    """The metrics a client sealed into its reply (numbers only; never the fields the clear record sets)."""
    what = f"sealed metrics of client {client}"
    try:
        metrics = json.loads(array.tobytes().decode("utf-8")) if array.dtype == np.uint8 else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise codec.CodecError(f"{what}: not JSON ({exc})") from None
    if not isinstance(metrics, dict):
        raise codec.CodecError(f"{what}: not a JSON object of numbers")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise codec.CodecError(f"{what}: {key!r} must be a number")
        if key in CLEAR_METRICS:
            raise codec.CodecError(f"{what}: {key!r} may not be set there")
    return metrics


def _count_client_rejection_into(counter: Counter[str], why: str) -> None:
    if REJECTED_TAG + " (" in why and " failed: " in why:
        counter[why.split(REJECTED_TAG + " (", 1)[1].split(")", 1)[0] + " (by a client)"] += 1


__all__ = ["SecureChannelError", "SecureLink", "secure_link"]
