"""The secure exchange layer the round loop (``trustformer.app``) calls, for every ``secure.mode``.

``none``: payloads travel as plain ArrayRecords (the default; this module passes them through).

``tee`` (attested aggregator, sealed payloads; the TEE is a software emulation, see ``tee.py``):
before round 1 two ``query.attest`` messages per client — the client answers the first with a
fresh nonce and X25519 key; the second carries the aggregator's signed quote, which the client
verifies (``attestation.py``) before it trains or sends anything. Every payload then travels
sealed (``sealing.py``) in a ``secure`` ConfigRecord (``{"sealed": bytes}``): the ``train`` reply
(bound to the client's example count too; its metrics sealed with it as ``metrics.json``, only the
client id, round and example count left in the clear ``metrics`` record) and the ``train.apply`` aggregate, encoded with the safe
codec (``codec.py``). A message the aggregator rejects drops that client for the round, like any
invalid payload; one a client rejects makes its reply an error, with the same effect.

Protocols that declare their own round (``runtime/rounds.py``) use the same channel: a model a ``train``
message carries down (Phong) travels sealed as ``model`` (kind ``train.model``), a payload asked for after
training (FedPC's ``train.payload``, and its retry when a pilot drops out) is sealed like the ``train``
payload, and FedPC's cost report travels sealed in the ``train`` reply with no arrays.

``secagg`` (pairwise-masked secure aggregation, ``secagg.py``), in every exchange round:
``query.secagg`` *keys* (each client advertises two X25519 keys and the names/shapes of the
payload it will send) → *shares* (the aggregator broadcasts the keys; each client returns its
encrypted Shamir shares) → ``train`` (carrying the shares routed to that client; the client
flattens its payload in sorted name order, pre-scales it by its example count when the protocol
weights by data size, masks it and sends only the masked uint64 vector) → *unmask* (the survivors
reveal the shares the aggregator needs to remove the masks) → the aggregator turns the SUM into the
mean and sends it back in ``train.apply`` as usual. The client's secure-aggregation state is kept in
its state store between these messages (``SecAggClient.to_bytes``). ``tee+secagg`` seals every one
of these messages as well.

Client-side secure state (session keys, counters, pending nonce, secure-aggregation state) lives in
the client's state store under ``<client>.secure`` as tensors, never in Flower's ``context.state``.

Costs per (round, client) line of ``metrics.jsonl``: ``attest_bytes``/``attest_s`` (round 1),
``seal_s``/``open_s`` (both ends), ``secagg_bytes``/``secagg_s`` (the extra secure-aggregation
messages and steps), ``payload_overhead_bytes`` (what the secure form of the ``train`` payload and
the aggregate costs beyond their plain ArrayRecords); the extra messages are counted in
``bytes_up``/``bytes_down`` too. ``summary.json["secure"]`` adds them up.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from ..config import RunConfig
from ..runtime.store import ClientState
from ..wire import PayloadError, TensorSpec, from_array_record, payload_bytes, spec_of, to_array_record
from . import codec
from .attestation import (
    AttestationError,
    generate_signing_key,
    load_signing_key,
    load_trusted_key,
    measured_sources,
    measurement,
    public_key_hex,
    trusted_key_from_hex,
    verify_quote,
)
from .sealing import REJECTED_TAG, Channel, SealError, derive_session_keys
from .secagg import SecAggClient, SecAggError, SecAggParams, SecAggServer, quantization_error_bound
from .tee import NONCE_BYTES, SoftwareTEE, TEEBackend

log = logging.getLogger(__name__)

ATTEST, SECAGG = "query.attest", "query.secagg"
SEALED_METRICS = "metrics.json"  # tee: the train reply's metrics (JSON, uint8) inside the sealed record
CLEAR_METRICS = ("client", "round", "num_examples")  # what a sealed train reply still says in clear
MODEL, MODEL_KIND = "model", "train.model"  # a model a train message carries down, and what it is sealed as
SECURE = "secure"  # message content key of a secure record: {"data": codec bytes} or {"sealed": sealed bytes}
# The client's own trust anchors live in its node config (set by the client: `trustformer deploy client
# --trusted-key/--expected-measurement`, or the in-process runtime), never in the run config the server submits.
PUBLIC_KEY_NODE_CONFIG = "attestation-public-key"  # node_config entry: the aggregator's attestation key (hex)
TRUSTED_KEY_NODE_CONFIG = "trusted-key"  # node_config entry: a file on the client's machine holding that key
MEASUREMENT_NODE_CONFIG = "expected-measurement"  # node_config entry: the aggregator measurement the client requires
WEIGHTED = {"fedavg": lambda cfg: True, "trustformer": lambda cfg: cfg.federation.weighting == "data_size"}


def uses_tee(mode: str) -> bool:
    return mode in ("tee", "tee+secagg")


def uses_secagg(mode: str) -> bool:
    return mode in ("secagg", "tee+secagg")


def secagg_threshold(cfg: RunConfig) -> int:
    """Shares needed to unmask: ``secure.secagg_threshold``, or a majority of the clients (at least 2)."""
    return cfg.secure.secagg_threshold or max(2, cfg.federation.clients // 2 + 1)


def secagg_session(run_id: int, rnd: int) -> bytes:
    return f"trustformer/secagg|run={run_id}|round={rnd}".encode()


# ----------------------------------------------------------------------------- in-process provisioning

_provisioned: dict[int, tuple[Any, str]] = {}  # run id -> (aggregator's signing key, where it came from)
_plain_vectors: dict[tuple[int, int], dict[int, np.ndarray]] = {}  # simulation only: secagg inputs in clear


def client_pins(cfg: RunConfig, signing_key=None) -> dict[str, str]:
    """The node config entries pinning a client's trust anchors when one user runs both sides (the
    in-process runtime, ``deploy local``): ``secure.trusted_key`` (or the public half of ``signing_key``)
    and ``secure.expected_measurement`` (or the measurement of ``cfg`` computed here)."""
    pins = {MEASUREMENT_NODE_CONFIG: cfg.secure.expected_measurement or measurement(cfg)}
    if cfg.secure.trusted_key:
        pins[TRUSTED_KEY_NODE_CONFIG] = str(cfg.secure.trusted_key)
    elif signing_key is not None:
        pins[PUBLIC_KEY_NODE_CONFIG] = public_key_hex(signing_key)
    return pins


def provision_in_process(cfg: RunConfig, run_id: int, nodes: list[dict[str, Any]]) -> None:
    """tee, in-process: hand the aggregator its signing key and the clients their pins (out of band): the
    aggregator's public key and the measurement they require (``client_pins``).

    Without ``secure.signing_key`` the key pair is generated for this run only (the summary says so).
    """
    if not uses_tee(cfg.secure.mode):
        return
    if cfg.secure.signing_key:
        key, origin = load_signing_key(cfg.secure.signing_key), f"file {cfg.secure.signing_key}"
    else:
        key, origin = generate_signing_key(), "generated for this run by the in-process runtime"
    _provisioned[run_id] = (key, origin)
    pins = client_pins(cfg, key)
    for node in nodes:
        for name, value in pins.items():
            node.setdefault(name, value)


def release_in_process(run_id: int) -> None:
    _provisioned.pop(run_id, None)
    for key in [k for k in _plain_vectors if k[0] == run_id]:
        del _plain_vectors[key]


# ----------------------------------------------------------------------------- records


def _pack(arrays: Mapping[str, Any], seal: Callable[[bytes], bytes] | None) -> ConfigRecord:
    data = codec.encode(arrays)
    return ConfigRecord({"sealed": seal(data)} if seal is not None else {"data": data})


def _unpack(content: RecordDict, open_: Callable[[bytes], bytes] | None, expected: TensorSpec | None,
            what: str) -> dict[str, np.ndarray]:
    """The arrays of a message's secure record (opened first when sealed); PayloadError otherwise."""
    if SECURE not in content:
        raise codec.CodecError(f"{what}: the message has no {SECURE!r} record")
    record = content[SECURE]
    key = "sealed" if open_ is not None else "data"
    if not isinstance(record, ConfigRecord) or set(record) != {key}:
        raise codec.CodecError(f"{what}: the {SECURE!r} record must hold exactly {key!r}")
    data = record[key]
    if not isinstance(data, bytes):
        raise codec.CodecError(f"{what}: {key!r} is not bytes")
    if open_ is not None:
        data = open_(data)
    return codec.decode_arrays(data, expected, what=what)


def _merge_sealed_metrics(row: dict[str, Any], array: np.ndarray, client: int) -> None:
    """Add the metrics a client sealed into its train reply to its row (numbers only; never over the
    fields the server or the clear record set)."""
    from ..app import SERVER_KEYS  # (late: app imports this module)

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
        if key in SERVER_KEYS or key in CLEAR_METRICS:
            raise codec.CodecError(f"{what}: {key!r} may not be set there")
    row.update(metrics)


def _bytes_array(data: bytes) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def _id_keyed(arrays: Mapping[str, np.ndarray], what: str) -> dict[int, bytes]:
    """``{"<id>": uint8 array}`` -> ``{id: bytes}``, rejecting anything else."""
    out = {}
    for name, array in arrays.items():
        if not name.isdigit() or array.dtype != np.uint8 or array.ndim != 1:
            raise codec.CodecError(f"{what}: entry {name!r} must be a client id holding a 1-D uint8 array")
        out[int(name)] = array.tobytes()
    return out


def _spec_json(spec: TensorSpec) -> bytes:
    return json.dumps([[n, list(s), d] for n, (s, d) in sorted(spec.items())], separators=(",", ":")).encode()


def _parse_spec(data: bytes, what: str) -> TensorSpec:
    try:
        items = json.loads(data.decode("ascii"))
        spec = {str(n): (tuple(int(x) for x in s), str(d)) for n, s, d in items}
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise codec.CodecError(f"{what}: payload spec is malformed ({exc})") from None
    if not spec or any(d != "float32" or any(x < 1 for x in s) for s, d in spec.values()):
        raise codec.CodecError(f"{what}: payload spec must name float32 arrays with positive dimensions")
    return spec


def _spec_length(spec: TensorSpec) -> int:
    return int(sum(int(np.prod(shape)) for shape, _ in spec.values()))


def _reason(reply: Message | None, step: str) -> str | None:
    if reply is None:
        return f"no reply to {step}"
    if reply.has_error():
        return f"{step} failed: {reply.error.reason}"
    return None


def _federation_error(message: str) -> Exception:
    from ..app import FederationError  # the round loop's error type (imported late: app imports this module)

    return FederationError(message)


# ----------------------------------------------------------------------------- server


@dataclass
class _SecAggRound:
    server: SecAggServer
    spec: TensorSpec
    routed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # recipient -> sender -> ciphertext
    masked: dict[int, np.ndarray] = field(default_factory=dict)


class ServerExchange:
    """The aggregator's side of the secure exchange for one run."""

    def __init__(self, cfg: RunConfig, grid, recorder, send, drop: Callable[[int, int, str], None],
                 clients: Mapping[int, int] | None = None) -> None:
        self.cfg = cfg
        self.mode = cfg.secure.mode
        self.tee, self.secagg = uses_tee(self.mode), uses_secagg(self.mode)
        self.grid, self.recorder, self._send, self._drop = grid, recorder, send, drop
        self.run_id = int(grid.run.run_id)
        self.backend: TEEBackend | None = None
        self.key_origin = ""
        self.node_client: dict[int, int] = {}  # node id -> client id, as attested (tee) or announced (secagg)
        self.clients = clients if clients is not None else {}  # the round loop's node id -> client id
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

    def _query(self, rnd: int, nodes: list[int], step: str, make, budget: str
               ) -> tuple[dict[int, Message], dict[int, str]]:
        """Send one ``query.*`` step; count its bytes and the client's seconds under ``budget``; drop
        the clients that fail it. Returns the good replies and the failures' reasons."""
        message_type = ATTEST if budget == "attest" else SECAGG
        replies = self._send(self.grid, nodes, message_type, rnd, make)
        ok: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for node, (reply, down) in replies.items():
            extra = self._extra(rnd, node)
            extra[f"{budget}_bytes"] += down
            extra["bytes_down"] += down
            why = _reason(reply, f"{message_type} ({step})")
            if why is not None:
                self._count_client_rejection(why)
                self._drop(rnd, node, why)
                failed[node] = why
                continue
            up = payload_bytes(reply.content)
            extra[f"{budget}_bytes"] += up
            extra["bytes_up"] += up
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
            self._count_client_rejection_into(self.rejected, why)

    # -- before round 1

    def setup(self, node_ids: list[int], needed: int) -> None:
        """tee: every client attests the aggregator before round 1; too few attested clients stop the run."""
        if self.mode != "none":
            log.info("secure exchange: secure.mode = %s%s", self.mode,
                     " · TEE EMULATED IN SOFTWARE (no hardware protection)" if self.tee else "")
        if not self.tee:
            return
        sec = self.cfg.secure
        if sec.signing_key:
            key, self.key_origin = load_signing_key(sec.signing_key), f"file {sec.signing_key}"
        elif self.run_id in _provisioned:
            key, self.key_origin = _provisioned[self.run_id]
        else:
            raise _federation_error("secure.mode = 'tee' needs the aggregator's attestation signing key: set "
                                    "secure.signing_key to a PEM file (`trustformer attest --keygen PREFIX` writes one)")
        self.backend = SoftwareTEE(key, measurement(self.cfg), self.run_id, quote_validity_s=sec.quote_validity_s)
        log.info("secure exchange: emulated TEE, measurement %s, attestation key %s… (%s)",
                 self.backend.measurement(), public_key_hex(key)[:16], self.key_origin)
        attested, failures = self._attest(0, list(node_ids))  # round 0: before the first round
        if len(attested) < needed:
            raise _federation_error(
                f"attestation failed for {len(node_ids) - len(attested)} of {len(node_ids)} client(s), {needed} "
                f"needed (federation.min_clients); no payload was sent. {failures[0] if failures else ''}")

    def _attest(self, rnd: int, nodes: list[int]) -> tuple[list[int], list[str]]:
        """The two ``query.attest`` steps with ``nodes``: returns the nodes that verified the quote, and
        why the others did not."""
        hello, failed = self._query(rnd, nodes, "hello",
                                    lambda _n: RecordDict({"config": ConfigRecord({"step": "hello"})}), "attest")
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
        verified, failed = self._query(rnd, list(quotes), "quote", lambda n: RecordDict({
            "config": ConfigRecord({"step": "quote"}),
            "attest": ConfigRecord({"quote": quotes[n][0], "signature": quotes[n][1]}),
        }), "attest")
        for node, why in failed.items():
            failures.append(f"client {self.node_client.pop(node)}: {why}")
        self.attested.update(verified)
        self.counts["attestations"] += len(verified)
        return list(verified), failures

    # -- every round

    def prepare_round(self, rnd: int, participants: list[int], exchange: bool) -> list[int]:
        """Before a round's ``train``: tee attests nodes seen for the first time (a client that rejoined);
        secagg runs the keys and shares steps of exchange rounds. Returns the participants still in."""
        if self.tee:
            new = [n for n in participants if n not in self.attested]
            if new:
                self._attest(rnd, new)
            participants = [n for n in participants if n in self.attested]
        if not (self.secagg and exchange) or not participants:
            return participants
        params = SecAggParams(threshold=secagg_threshold(self.cfg), scale_bits=self.cfg.secure.secagg_scale_bits)
        session = secagg_session(self.run_id, rnd)
        config = ConfigRecord({"round": rnd, "step": "keys"})
        replies, _failed = self._query(rnd, participants, "keys", lambda _n: RecordDict({"config": config}), "secagg")
        keys: dict[int, dict[str, bytes]] = {}
        specs: dict[int, TensorSpec] = {}
        for node, reply in replies.items():
            try:
                if not self.tee:  # with tee the client id is the attested one
                    self.node_client[node] = int(reply.content["metrics"]["client"])
                arrays = _unpack(reply.content, self._open_from(node, rnd, "secagg.keys"), None,
                                 f"secagg keys of node {node}")
                if set(arrays) != {"c_pk", "s_pk", "spec"} or any(a.dtype != np.uint8 or a.ndim != 1
                                                                  for a in arrays.values()):
                    raise codec.CodecError(f"secagg keys of node {node}: expected uint8 arrays c_pk, s_pk and spec")
                keys[node] = {"c_pk": arrays["c_pk"].tobytes(), "s_pk": arrays["s_pk"].tobytes()}
                specs[node] = _parse_spec(arrays["spec"].tobytes(), f"secagg keys of node {node}")
            except (KeyError, PayloadError) as exc:
                self._drop(rnd, node, f"secagg keys: {exc}")
        if specs:  # the payload every client must announce follows from the configuration, not from a vote
            from ..app import expected_payload_spec as configured_spec  # (late: app imports this module)

            expected = _spec_json(configured_spec(self.cfg))
            for node in [n for n in specs if _spec_json(specs[n]) != expected]:
                self._drop(rnd, node, "secagg keys: the announced payload names/shapes differ from those the "
                                      "run's configuration and protocol give")
                keys.pop(node)
                specs.pop(node)
        if len(keys) < params.threshold:
            raise _federation_error(f"round {rnd} (secagg keys): {len(keys)} client(s) advertised keys, the "
                                    f"threshold is {params.threshold} (secure.secagg_threshold)")
        spec = next(iter(specs.values()))
        started = time.perf_counter()
        server = SecAggServer(list(range(self.cfg.federation.clients)), params, _spec_length(spec), session)
        try:
            broadcast = server.collect_keys({self._client(n): k for n, k in keys.items()})
        except SecAggError as exc:
            raise _federation_error(f"round {rnd} (secagg keys): {exc}") from None
        arrays = {f"{c}/{name}": _bytes_array(v) for c, entry in broadcast.items() for name, v in entry.items()}
        self.server_round_s[rnd] += time.perf_counter() - started
        def addressed_to_the_others(client: int, entry: dict[int, bytes]) -> None:
            if set(entry) != set(broadcast) - {client} or not all(entry.values()):
                raise codec.CodecError(f"secagg shares of client {client}: addressed to {sorted(entry)}, "
                                       f"expected {sorted(set(broadcast) - {client})}")

        shares = self._secagg_step(rnd, list(keys), "shares", arrays, "secagg shares", addressed_to_the_others)
        started = time.perf_counter()
        try:
            routed = server.route_shares(shares)
        except SecAggError as exc:
            raise _federation_error(f"round {rnd} (secagg shares): {exc}") from None
        self._round = _SecAggRound(server=server, spec=spec, routed=routed)
        self.server_round_s[rnd] += time.perf_counter() - started
        self.secagg_rounds += 1
        return [n for n in participants if self.node_client.get(n) in routed]

    def train_content(self, node: int, rnd: int, exchange: bool, content: RecordDict) -> RecordDict:
        """The ``train`` message for ``node``: secagg exchange rounds add the shares routed to it."""
        if self.secagg and exchange and self._round is not None:
            client = self._client(node)
            routed = {str(sender): _bytes_array(ct) for sender, ct in self._round.routed.get(client, {}).items()}
            record = _pack(routed, self._seal_for(node, rnd, "train"))
            self._extra(rnd, node)["secagg_bytes"] += payload_bytes(RecordDict({SECURE: record}))
            content[SECURE] = record
        return content

    def read_payload(self, node: int, rnd: int, reply: Message, row: dict[str, Any], kind: str = "train"
                     ) -> dict[str, torch.Tensor]:
        """A client's payload in its reply to ``kind`` (``train``, or ``train.payload`` when the server asks for
        it after training): plain, opened (tee), or its masked vector (secagg)."""
        if self.mode == "none":
            return from_array_record(reply.content["payload"], what="payload")
        if self.tee and (node not in self.attested or self.node_client.get(node) != row["client"]):
            self.rejected["no-session"] += 1
            raise SealError("no-session", f"node {node} (client {row['client']}) has not attested the aggregator as "
                                          "this client")
        if self.secagg and self._round is None:
            raise codec.CodecError("masked payload outside a secure-aggregation round")
        client = row["client"]
        expected = {"masked": ((self._round.server.length,), "uint64")} if self.secagg else None
        arrays = _unpack(reply.content, self._open_from(node, rnd, kind, {"num_examples": int(row["num_examples"])}),
                         None if self.tee else expected, f"payload of client {client}")
        if self.tee:
            if SEALED_METRICS not in arrays:
                raise codec.CodecError(f"payload of client {client}: the sealed record holds no {SEALED_METRICS!r}")
            _merge_sealed_metrics(row, arrays.pop(SEALED_METRICS), client)
            if expected is not None:
                got = {n: (tuple(a.shape), str(a.dtype)) for n, a in arrays.items()}
                if got != expected:
                    raise codec.CodecError(f"payload of client {client}: arrays {got}, expected {expected}")
        record_bytes = payload_bytes(RecordDict({SECURE: reply.content[SECURE]}))
        if self.secagg:
            self._round.masked[client] = arrays["masked"]
            self._extra(rnd, node)["payload_overhead_bytes"] += record_bytes - self._plain_bytes_of(self._round.spec)
            return {"masked": torch.from_numpy(arrays["masked"].view(np.int64))}
        tensors = {name: torch.from_numpy(a) for name, a in arrays.items()}
        self._extra(rnd, node)["payload_overhead_bytes"] += record_bytes - self._plain_bytes_of(spec_of(tensors))
        return tensors

    def _plain_bytes_of(self, spec: TensorSpec, key: str = "payload") -> int:
        """Bytes of the plain ArrayRecord of arrays with this spec (its size depends on the spec only)."""
        cache_key = (key, tuple(sorted((n, tuple(s), d) for n, (s, d) in spec.items())))
        if cache_key not in self._plain_bytes:
            zeros = {n: torch.zeros(s, dtype=getattr(torch, d)) for n, (s, d) in spec.items()}
            self._plain_bytes[cache_key] = payload_bytes(RecordDict({key: to_array_record(zeros)}))
        return self._plain_bytes[cache_key]

    def _secagg_step(self, rnd: int, nodes: list[int], step: str, arrays: dict[str, np.ndarray], what: str,
                     check: Callable[[int, dict[int, bytes]], None] | None = None) -> dict[int, dict[int, bytes]]:
        """Send one secure-aggregation step (sealed in tee+secagg) to ``nodes``; each valid reply as
        client -> {client id: bytes}. A reply that cannot be opened, decoded or fails ``check`` drops
        that client from the round."""
        replies, _failed = self._query(rnd, nodes, step, lambda n: RecordDict({
            "config": ConfigRecord({"round": rnd, "step": step}),
            SECURE: _pack(arrays, self._seal_for(n, rnd, f"secagg.{step}"))}), "secagg")
        out: dict[int, dict[int, bytes]] = {}
        for node, reply in replies.items():
            client = self._client(node)
            label = f"{what} of client {client}"
            try:
                entry = _id_keyed(_unpack(reply.content, self._open_from(node, rnd, f"secagg.{step}"), None, label),
                                  label)
                if check is not None:
                    check(client, entry)
                out[client] = entry
            except (KeyError, PayloadError) as exc:
                self._drop(rnd, node, f"{what}: {exc}")
        return out

    def aggregate(self, protocol, rnd: int, payloads: dict[int, dict[str, torch.Tensor]],
                  rows: dict[int, dict[str, Any]]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The round's aggregate: the protocol's (in the TEE with tee), or unmasked from the masked sum (secagg)."""
        nodes = list(payloads)
        args = ([payloads[n] for n in nodes], [rows[n]["num_examples"] for n in nodes])
        if not self.secagg:
            return self.backend.aggregate(protocol.aggregate, *args) if self.tee else protocol.aggregate(*args)
        started = time.perf_counter()
        state, self._round = self._round, None
        try:
            survivors, dropped = state.server.collect_masked({self._client(n): state.masked[self._client(n)]
                                                              for n in nodes})
        except SecAggError as exc:
            raise _federation_error(f"round {rnd} (secagg masked inputs): {exc}") from None
        self.dropped_after_setup += len(dropped)
        by_client = {self._client(n): n for n in nodes}
        request = {"survivors": np.array(survivors, dtype=np.int64), "dropped": np.array(dropped, dtype=np.int64)}
        self.server_round_s[rnd] += time.perf_counter() - started
        revealed = self._secagg_step(rnd, nodes, "unmask", request, "secagg unmask")
        started = time.perf_counter()
        try:
            total = state.server.unmask(revealed)
        except SecAggError as exc:
            raise _federation_error(f"round {rnd} (secagg unmask): {exc}") from None
        weighted = WEIGHTED[protocol.name](self.cfg)
        divisor = float(sum(rows[by_client[c]]["num_examples"] for c in survivors)) if weighted else float(len(survivors))
        mean = total / divisor
        bound = quantization_error_bound(len(survivors), self.cfg.secure.secagg_scale_bits) / divisor
        self.bounds.append(bound)
        plain = _plain_vectors.pop((self.run_id, rnd), None)
        if plain is not None and all(c in plain for c in survivors):  # simulation only (diagnostics)
            exact = np.sum([plain[c] for c in survivors], axis=0) / divisor
            self.measured_errors.append(float(np.max(np.abs(mean - exact))))
            # the float64 rounding of the two means compared, on top of the quantisation bound
            magnitude = np.sum([np.abs(plain[c]) for c in survivors], axis=0) / divisor
            self.float64_rounding.append(4 * float(np.finfo(np.float64).eps) * float(np.max(magnitude)))
        aggregate, offset = {}, 0
        for name, (shape, dtype) in sorted(state.spec.items()):
            size = int(np.prod(shape))
            aggregate[name] = torch.from_numpy(mean[offset:offset + size].reshape(shape)).to(getattr(torch, dtype))
            offset += size
        self.server_round_s[rnd] += time.perf_counter() - started
        return aggregate, {"secagg_server_s": self.server_round_s[rnd]}

    def put_model(self, content: RecordDict, node: int, rnd: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """A model the ``train`` message carries down (Phong's sequential round): plain as ``model``, or sealed
        for the node's client (tee) as ``model`` = ``{"sealed": bytes}``."""
        if not self.tee:
            content[MODEL] = to_array_record(dict(tensors))
            return
        record = ConfigRecord({"sealed": self._seal_for(node, rnd, MODEL_KIND)(codec.encode(dict(tensors)))})
        plain = self._plain_bytes_of(spec_of(dict(tensors)), MODEL)
        self._extra(rnd, node)["payload_overhead_bytes"] += payload_bytes(RecordDict({MODEL: record})) - plain
        content[MODEL] = record

    def apply_content(self, rnd: int, aggregate: dict[str, torch.Tensor]) -> Callable[[int], RecordDict]:
        """The ``train.apply`` message per node: the plain aggregate, or sealed for each client (tee)."""
        config = ConfigRecord({"round": rnd})
        if not self.tee:
            content = RecordDict({"config": config, "aggregate": to_array_record(aggregate)})
            return lambda _n: content
        encoded = codec.encode(aggregate)
        plain = self._plain_bytes_of(spec_of(aggregate), "aggregate")

        def make(node: int) -> RecordDict:
            content = RecordDict({"config": config})
            if node in self.attested:
                record = ConfigRecord({"sealed": self._seal_for(node, rnd, "train.apply")(encoded)})
                self._extra(rnd, node)["payload_overhead_bytes"] += payload_bytes(RecordDict({SECURE: record})) - plain
                content[SECURE] = record
            return content

        return make

    def finish_row(self, rnd: int, node: int, row: dict[str, Any]) -> None:
        """Add this round's secure costs to a client's metrics line (and its extra messages to its bytes)."""
        if self.mode == "none":
            return
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

    def summary(self) -> dict[str, Any] | None:
        """``summary.json["secure"]``: mode, backend, counts, overhead (bytes, seconds), quantisation error."""
        if self.mode == "none":
            return None
        records = self.recorder.records
        byte_keys = ("attest_bytes", "secagg_bytes", "payload_overhead_bytes")
        second_keys = ("attest_s", "seal_s", "open_s", "secagg_s")
        rejected = Counter(self.rejected)
        for event in self.recorder.events:  # a rejection by a client comes back as its error reply to train.apply
            reason = str(event.get("reason", ""))
            if event.get("event") == "dropped" and not reason.startswith(("query.", "attestation", "invalid payload")):
                self._count_client_rejection_into(rejected, reason)
        per_round: dict[str, dict[str, float]] = {}
        for rnd in sorted({r["round"] for r in records}):
            rows = [r for r in records if r["round"] == rnd]
            per_round[str(rnd)] = {
                "bytes": sum(int(r.get(k, 0)) for r in rows for k in byte_keys),
                "seconds": round(sum(float(r.get(k, 0.0)) for r in rows for k in second_keys)
                                 + self.server_round_s.get(rnd, 0.0), 6),
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
            out.update({
                "backend": self.backend.name if self.backend else None,
                "emulated": bool(self.backend.emulated) if self.backend else True,
                "note": "software emulation of a TEE: quotes, keys and sealing are real, the hardware isolation "
                        "is not (the server process holds the session keys and sees the opened payloads)",
                "measurement": self.backend.measurement() if self.backend else None,
                "measured_files": measured_sources(),
                "attestation_key": self.key_origin,
            })
        if self.secagg:
            out["secagg"] = {
                "threshold": secagg_threshold(self.cfg),
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

    @staticmethod
    def _count_client_rejection_into(counter: Counter[str], why: str) -> None:
        if REJECTED_TAG + " (" in why and " failed: " in why:
            counter[why.split(REJECTED_TAG + " (", 1)[1].split(")", 1)[0] + " (by a client)"] += 1


# ----------------------------------------------------------------------------- client


def expected_payload_spec(cfg: RunConfig, initial: Mapping[str, torch.Tensor]) -> TensorSpec:
    """The names/shapes/dtypes of the payload a client will send (secagg announces it before training)."""
    if cfg.federation.strategy in ("fedavg", "trustformer"):
        from ..protocols import get_protocol

        return get_protocol(cfg).expected_payload(dict(initial))
    raise ValueError(f"secure aggregation does not support federation.strategy = {cfg.federation.strategy!r}")


def _u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class ClientExchange:
    """A client's side of the secure exchange; its state lives in the client's state store."""

    def __init__(self, env, context) -> None:
        self.env, self.cfg = env, env.cfg
        self.mode = env.cfg.secure.mode
        self.tee, self.secagg = uses_tee(self.mode), uses_secagg(self.mode)
        self.run_id = int(context.run_id)
        self.node_config = context.node_config
        self._key = f"{env.key}.secure"
        self._sealed_keys: set[str] = set()  # metrics put into the sealed train reply
        self.state: dict[str, torch.Tensor] = {}
        if self.mode != "none":
            stored = env.store.load(self._key)
            self.state = dict(stored.protocol) if stored is not None else {}
        self.channel = Channel.from_tensors(self.state, "client", "channel/") if "channel/ids" in self.state else None

    def _save(self) -> None:
        if self.channel is not None:
            self.state.update(self.channel.to_tensors("channel/"))
        self.env.store.save(self._key, ClientState(model={}, optimizer={}, protocol=self.state, rounds_done=0))

    def _seal(self, rnd: int, kind: str, metrics: dict[str, Any], metric: str, bound: dict[str, Any] | None = None):
        if not self.tee:
            return None

        def seal(data: bytes) -> bytes:
            started = time.perf_counter()
            sealed = self.channel.seal(data, round_=rnd, kind=kind, bound=bound)
            self._save()  # the counter is spent before anything leaves: a nonce is never reused
            metrics[metric] = metrics.get(metric, 0.0) + time.perf_counter() - started
            return sealed

        return seal

    def _open(self, rnd: int, kind: str, metrics: dict[str, Any], metric: str):
        if not self.tee:
            return None

        def open_(data: bytes) -> bytes:
            started = time.perf_counter()
            plain = self.channel.open(data, round_=rnd, kind=kind)
            self._save()
            metrics[metric] = metrics.get(metric, 0.0) + time.perf_counter() - started
            return plain

        return open_

    def require_session(self) -> None:
        """tee: refuse to train or send anything without a verified quote of the aggregator."""
        if self.tee and self.channel is None:
            raise SealError("no-session", f"client {self.env.client} has no attested session with the aggregator "
                                          "(attestation failed or did not run); it sends nothing")

    # -- query.attest

    def attest(self, msg: Message) -> Message:
        """``hello``: a fresh nonce and X25519 key; ``quote``: verify the aggregator's quote, open the session."""
        if not self.tee:
            raise AttestationError(f"this client runs secure.mode = {self.mode!r}, which has no attestation")
        started = time.perf_counter()
        step = str(msg.content["config"]["step"])
        trusted, pinned = self._trusted_key(), self._pinned_measurement()  # refused here when a pin is missing
        if step == "hello":
            nonce, secret = os.urandom(NONCE_BYTES), X25519PrivateKey.generate()
            for key in [k for k in self.state if k.startswith("channel/")]:
                del self.state[key]  # a new attestation replaces any earlier session
            self.channel = None
            self.state["attest/nonce"], self.state["attest/secret"] = _u8(nonce), _u8(secret.private_bytes_raw())
            self._save()
            record = ConfigRecord({"client": self.env.client, "nonce": nonce,
                                   "client_key": secret.public_key().public_bytes_raw()})
            return Message(RecordDict({"attest": record, "metrics": MetricRecord(
                {"attest_s": time.perf_counter() - started})}), reply_to=msg)
        if step != "quote":
            raise AttestationError(f"unknown attestation step {step!r}")
        if "attest/nonce" not in self.state:
            raise AttestationError("attestation failed: a quote arrived without a pending nonce (replayed quote)")
        nonce = bytes(self.state.pop("attest/nonce").tolist())
        secret = X25519PrivateKey.from_private_bytes(bytes(self.state.pop("attest/secret").tolist()))
        self._save()  # the nonce is used once, whatever the outcome
        client_key = secret.public_key().public_bytes_raw()
        record = msg.content["attest"]
        quote = verify_quote(
            bytes(record["quote"]), bytes(record["signature"]), trusted, nonce=nonce, client_key=client_key,
            run_id=self.run_id, client=self.env.client, expected_measurement=pinned,
            measurement_source=f"pinned by this client's node config {MEASUREMENT_NODE_CONFIG!r}")
        enclave_key = bytes.fromhex(quote.enclave_key)
        shared = secret.exchange(X25519PublicKey.from_public_bytes(enclave_key))
        keys = derive_session_keys(shared, run_id=self.run_id, client=self.env.client,
                                   transcript=nonce + client_key + enclave_key)
        self.channel = Channel(run_id=self.run_id, client=self.env.client, keys=keys, side="client")
        self._save()
        log.info("client %s · attested the aggregator (%s, measurement %s…)", self.env.client, quote.backend,
                 quote.measurement[:16])
        return Message(RecordDict({"metrics": MetricRecord({"attest_s": time.perf_counter() - started})}),
                       reply_to=msg)

    def _trusted_key(self):
        """The aggregator key this client trusts: from its own node config only. ``secure.trusted_key`` of
        the run config is ignored here: the server submits the run config, so it could name its own key."""
        if self.node_config.get(TRUSTED_KEY_NODE_CONFIG):
            return load_trusted_key(str(self.node_config[TRUSTED_KEY_NODE_CONFIG]))
        if self.node_config.get(PUBLIC_KEY_NODE_CONFIG):
            return trusted_key_from_hex(str(self.node_config[PUBLIC_KEY_NODE_CONFIG]))
        raise AttestationError(
            "attestation refused: this client pins no aggregator key, so it sends nothing: start it with "
            f"`trustformer deploy client --trusted-key FILE.pub` (node config {TRUSTED_KEY_NODE_CONFIG!r}); the "
            "run config's secure.trusted_key comes from the server and is not trusted")

    def _pinned_measurement(self) -> str:
        """The aggregator measurement this client requires: from its own node config only (the run config's
        ``secure.expected_measurement`` comes from the server)."""
        pinned = str(self.node_config.get(MEASUREMENT_NODE_CONFIG, "")).strip().lower()
        if len(pinned) != 64 or set(pinned) - set("0123456789abcdef"):
            raise AttestationError(
                "attestation refused: this client pins no aggregator measurement (64 hex digits), so it sends "
                "nothing: start it with `trustformer deploy client --expected-measurement HEX` (the first line "
                f"of `trustformer attest` with the run's options; node config {MEASUREMENT_NODE_CONFIG!r}); the "
                "run config's secure.expected_measurement comes from the server and is not trusted")
        return pinned

    # -- query.secagg

    def secagg_step(self, msg: Message, initial: Callable[[], Mapping[str, torch.Tensor]]) -> Message:
        """One secure-aggregation step (keys, shares, unmask) of an exchange round."""
        if not self.secagg:
            raise SecAggError(f"this client runs secure.mode = {self.mode!r}, which has no secure aggregation")
        self.require_session()
        config = msg.content["config"]
        rnd, step = int(config["round"]), str(config["step"])
        metrics: dict[str, Any] = {"client": self.env.client}
        timing: dict[str, float] = {}  # seconds spent opening and sealing, reported apart from the secagg step
        started = time.perf_counter()
        if step == "keys":
            spec = expected_payload_spec(self.cfg, initial())
            params = SecAggParams(threshold=secagg_threshold(self.cfg), scale_bits=self.cfg.secure.secagg_scale_bits)
            client = SecAggClient(self.env.client, list(range(self.cfg.federation.clients)), params,
                                  secagg_session(self.run_id, rnd), length=_spec_length(spec))
            keys = client.advertise_keys()
            arrays = {"c_pk": _bytes_array(keys["c_pk"]), "s_pk": _bytes_array(keys["s_pk"]),
                      "spec": _bytes_array(_spec_json(spec))}
            self.state["secagg/spec"] = _u8(_spec_json(spec))
            kind = "secagg.keys"
        elif step == "shares":
            client = self._secagg_client(rnd)
            broadcast_arrays = _unpack(msg.content, self._open(rnd, "secagg.shares", timing, "open_s"), None,
                                       "secagg keys from the aggregator")
            broadcast: dict[int, dict[str, bytes]] = {}
            for name, array in broadcast_arrays.items():
                owner, _, which = name.partition("/")
                if not owner.isdigit() or which not in ("c_pk", "s_pk"):
                    raise codec.CodecError(f"secagg keys from the aggregator: unexpected entry {name!r}")
                broadcast.setdefault(int(owner), {})[which] = array.tobytes()
            arrays = {str(r): _bytes_array(ct) for r, ct in client.share_keys(broadcast).items()}
            kind = "secagg.shares"
        elif step == "unmask":
            client = self._secagg_client(rnd)
            request = _unpack(msg.content, self._open(rnd, "secagg.unmask", timing, "open_s"),
                              None, "secagg unmask request")
            if set(request) != {"survivors", "dropped"} or any(a.dtype != np.int64 or a.ndim != 1
                                                               for a in request.values()):
                raise codec.CodecError("secagg unmask request: expected int64 lists 'survivors' and 'dropped'")
            revealed = client.unmask(request["survivors"].tolist(), request["dropped"].tolist())
            arrays = {str(owner): _bytes_array(share) for owner, share in revealed.items()}
            kind = "secagg.unmask"
        else:
            raise SecAggError(f"unknown secure-aggregation step {step!r}")
        self.state["secagg/state"] = _u8(client.to_bytes())
        self.state["secagg/round"] = torch.tensor([rnd], dtype=torch.int64)
        record = _pack(arrays, self._seal(rnd, kind, timing, "seal_s"))
        self._save()
        metrics["secagg_s"] = time.perf_counter() - started - sum(timing.values())
        metrics.update(timing)  # open_s only where a sealed request was opened
        return Message(RecordDict({SECURE: record, "metrics": MetricRecord(metrics)}), reply_to=msg)

    def _secagg_client(self, rnd: int) -> SecAggClient:
        if "secagg/state" not in self.state or int(self.state["secagg/round"][0]) != rnd:
            raise SecAggError(f"client {self.env.client}: no secure-aggregation state for round {rnd} "
                              "(the keys step did not run here)")
        return SecAggClient.from_bytes(bytes(self.state["secagg/state"].tolist()))

    # -- train / train.apply

    def put_payload(self, content: RecordDict, msg: Message, rnd: int, payload: Mapping[str, torch.Tensor],
                    num_examples: int, metrics: dict[str, Any], kind: str = "train") -> None:
        """Put the payload into the reply to ``kind`` (``train`` or ``train.payload``): plain, sealed (tee),
        and/or masked (secagg, ``train`` only)."""
        if self.mode == "none":
            content["payload"] = to_array_record(payload)
            return
        self.require_session()
        arrays: Mapping[str, Any] = payload
        if self.secagg:
            started = time.perf_counter()
            client = self._secagg_client(rnd)
            spec = _parse_spec(bytes(self.state["secagg/spec"].tolist()), "this client's announced payload")
            if spec_of(payload) != spec:
                raise SecAggError(f"client {self.env.client}: the payload's names/shapes differ from those announced "
                                  "in the secure-aggregation keys step")
            vector = np.concatenate([payload[n].detach().double().reshape(-1).numpy() for n in sorted(spec)])
            if not np.isfinite(vector).all():
                raise SecAggError(f"client {self.env.client}: the payload holds NaN or Inf; nothing is sent")
            if WEIGHTED[self.cfg.federation.strategy](self.cfg):
                vector = vector * float(num_examples)  # the aggregator divides the sum by the sum of the counts
            if self.env.diagnostics:  # simulation only: the plain input, to measure the quantisation error
                _plain_vectors.setdefault((self.run_id, rnd), {})[self.env.client] = vector
            opened = {}
            routed = _id_keyed(_unpack(msg.content, self._open(rnd, "train", opened, "t"), None,
                                       "secagg shares routed by the aggregator"), "secagg shares routed by the aggregator")
            arrays = {"masked": client.masked_input(vector, routed)}
            self.state["secagg/state"] = _u8(client.to_bytes())
            self._save()
            metrics["secure_train_secagg_s"] = time.perf_counter() - started - opened.get("t", 0.0)
            if self.tee:
                metrics["secure_train_open_s"] = opened.get("t", 0.0)
        if self.tee:  # the metrics record of a sealed exchange travels sealed too
            sealed = {k: v for k, v in metrics.items() if k not in CLEAR_METRICS}
            arrays = {**arrays, SEALED_METRICS: _bytes_array(json.dumps(sealed, sort_keys=True).encode())}
            self._sealed_keys = set(sealed)
        record = _pack(arrays, self._seal(rnd, kind, metrics, "secure_train_seal_s",
                                          bound={"num_examples": int(num_examples)}))
        content[SECURE] = record

    def clear_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics a reply carries in clear: with tee, those sealed into the payload record are left out."""
        return {k: v for k, v in metrics.items() if k not in self._sealed_keys}

    def read_model(self, msg: Message, rnd: int, expected: TensorSpec | None, metrics: dict[str, Any]
                   ) -> dict[str, torch.Tensor] | None:
        """The model a ``train`` message carries down (opened first with tee), checked against ``expected``;
        None when it carries none."""
        if MODEL not in msg.content:
            return None
        if not self.tee:
            return from_array_record(msg.content[MODEL], expected, what="model from the server")
        self.require_session()
        record = msg.content[MODEL]
        if not isinstance(record, ConfigRecord) or set(record) != {"sealed"} or not isinstance(record["sealed"], bytes):
            raise codec.CodecError("model from the server: the record must hold exactly 'sealed' bytes")
        data = self._open(rnd, MODEL_KIND, metrics, "secure_train_open_s")(record["sealed"])
        arrays = codec.decode_arrays(data, expected, what="model from the server")
        return {name: torch.from_numpy(a) for name, a in arrays.items()}

    def read_aggregate(self, msg: Message, rnd: int, expected: TensorSpec, metrics: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The aggregate from ``train.apply``, checked against what this client sent (opened first with tee)."""
        if not self.tee:
            return from_array_record(msg.content["aggregate"], expected, what="aggregate from the server")
        self.require_session()
        arrays = _unpack(msg.content, self._open(rnd, "train.apply", metrics, "secure_apply_open_s"), expected,
                         "aggregate from the server")
        return {name: torch.from_numpy(a) for name, a in arrays.items()}
