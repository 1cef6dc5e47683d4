"""The client's side of the secure channel: a Flower client mod (``ClientApp(mods=[...])``), the way Flower's own
``secaggplus_mod`` wraps a handler.

With ``secure.mode = none`` it passes every message through. Otherwise it

- answers the channel's own queries itself: ``query.attest`` (``tee``: ``hello`` — a fresh nonce and X25519
  key; ``quote`` — verify the aggregator's signed quote against this client's own pins, open the session) and
  ``query.secagg`` (``secagg``: the *keys*, *shares* and *unmask* steps of secure aggregation, ``secagg.py``);
- before a ``train``, ``train.payload`` or ``train.apply`` handler: refuses to run without an attested session
  (``tee``), opens what arrives sealed (the aggregate, a model the server sends down) into plain records, and
  keeps the secure-aggregation shares routed to this client;
- after the handler: masks the payload of a ``train`` reply (``secagg``: the payload flattened in sorted name
  order, pre-scaled by the example count when the protocol's mean is weighted by examples, as a masked uint64
  vector) and seals the reply's payload and metrics (``tee``; only the client id, round and example count stay
  in clear, the seal bound to the example count).

Handlers and protocols see plain records only. The client's secure state (session keys, counters, pending
nonce, secure-aggregation state) lives in its state store, never in Flower's ``context.state``. Costs go on the
reply's metrics as ``secure_<message>_<what>_s`` (the server folds them into ``seal_s``, ``open_s``,
``secagg_s``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..config import CONFIG_KEY, RunConfig, parse_run_config, run_config_of
from ..wire import APPLY, PAYLOAD, TRAIN, TensorSpec, from_array_record, spec_of, to_array_record
from . import codec, records
from .attestation import AttestationError, load_trusted_key, trusted_key_from_hex, verify_quote
from .masking import SecAggError
from .provision import (
    MEASUREMENT_NODE_CONFIG,
    PUBLIC_KEY_NODE_CONFIG,
    TRUSTED_KEY_NODE_CONFIG,
    plain_vectors,
    uses_secagg,
    uses_tee,
)
from .records import ATTEST, CLEAR_METRICS, MODEL_KIND, SEALED_METRICS, SECAGG, SECURE
from .sealing import Channel, SealError, derive_session_keys
from .secagg_client import SecAggClient
from .tee import NONCE_BYTES

log = logging.getLogger(__name__)


@dataclass
class SecureClient:
    """What the mod needs to know about the client (provided by the runtime, ``runtime/client.py``)."""

    cfg: RunConfig
    client: int
    run_id: int
    node_config: Mapping[str, Any]
    load_state: Callable[[], dict[str, torch.Tensor]]  # this client's secure state, from its state store
    save_state: Callable[[dict[str, torch.Tensor]], None]
    payload_layout: Callable[[], tuple[TensorSpec, str | None]]  # every payload's spec and the mean's weighting
    diagnostics: bool = False  # simulation only: keep the plain secure-aggregation input (quantisation error)


def make_secure_mod(describe: Callable[[Context], SecureClient]):
    """The client mod; ``describe`` tells it who the client is (called only when ``secure.mode`` is not none)."""

    def secure_mod(msg: Message, context: Context, call_next) -> Message:
        text = context.run_config.get(CONFIG_KEY)
        config = parse_run_config(text) if isinstance(text, str) else run_config_of(context.run_config)
        if config.secure.mode == "none":
            return call_next(msg, context)
        kind = msg.metadata.message_type
        if kind == ATTEST:
            return ClientChannel(describe(context)).attest(msg)
        if kind == SECAGG:
            return ClientChannel(describe(context)).secagg_step(msg)
        if kind not in (TRAIN, PAYLOAD, APPLY):
            return call_next(msg, context)
        peer = ClientChannel(describe(context))
        plain, timing = peer.open_incoming(msg)
        reply = call_next(plain, context)
        return reply if reply.has_error() else peer.seal_reply(msg, reply, timing)

    return secure_mod


def _u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class ClientChannel:
    """One message's worth of the client's secure channel; its state lives in the client's state store."""

    def __init__(self, peer: SecureClient) -> None:
        self.peer, self.cfg = peer, peer.cfg
        self.mode = peer.cfg.secure.mode
        self.tee, self.secagg = uses_tee(self.mode), uses_secagg(self.mode)
        self.state = peer.load_state()
        self.channel = Channel.from_tensors(self.state, "client", "channel/") if "channel/ids" in self.state else None

    def _save(self) -> None:
        if self.channel is not None:
            self.state.update(self.channel.to_tensors("channel/"))
        self.peer.save_state(self.state)

    def _seal(self, rnd: int, kind: str, timing: dict[str, float], key: str, bound: dict[str, Any] | None = None):
        if not self.tee:
            return None

        def seal(data: bytes) -> bytes:
            started = time.perf_counter()
            sealed = cast(Channel, self.channel).seal(data, round_=rnd, kind=kind, bound=bound)  # tee: a session
            self._save()  # the counter is spent before anything leaves: a nonce is never reused
            timing[key] = timing.get(key, 0.0) + time.perf_counter() - started
            return sealed

        return seal

    def _open(self, rnd: int, kind: str, timing: dict[str, float], key: str):
        if not self.tee:
            return None

        def open_(data: bytes) -> bytes:
            started = time.perf_counter()
            plain = cast(Channel, self.channel).open(data, round_=rnd, kind=kind)  # tee: a session
            self._save()
            timing[key] = timing.get(key, 0.0) + time.perf_counter() - started
            return plain

        return open_

    def require_session(self) -> None:
        """tee: refuse to train or send anything without a verified quote of the aggregator."""
        if self.tee and self.channel is None:
            raise SealError(
                "no-session",
                f"client {self.peer.client} has no attested session with the aggregator "
                "(attestation failed or did not run); it sends nothing",
            )

    # -- train / train.payload / train.apply

    def open_incoming(self, msg: Message) -> tuple[Message, dict[str, float]]:
        """The message as its handler sees it: sealed records opened, the routed secure-aggregation shares
        kept aside; the seconds spent (``timing``) go on the reply."""
        self.require_session()
        kind, content = msg.metadata.message_type, msg.content
        config: Mapping[str, Any] = content["config"]  # a ConfigRecord; Flower types its values as a union
        rnd = int(config["round"])
        timing: dict[str, float] = {}
        plain = RecordDict({name: record for name, record in content.items() if name not in (SECURE, "model")})
        if "model" in content:  # a model sent down to train on (Phong)
            plain["model"] = (
                content["model"]
                if not self.tee
                else self._sealed_arrays(content["model"], rnd, MODEL_KIND, timing, "secure_train_open_s")
            )
        if kind == APPLY and self.tee:
            plain["aggregate"] = self._sealed_arrays(content[SECURE], rnd, APPLY, timing, "secure_apply_open_s")
        if kind == TRAIN and SECURE in content:  # secagg: the shares the aggregator routed to this client
            started = time.perf_counter()
            routed = records.unpack(
                content, self._open(rnd, TRAIN, timing, "open"), None, "secagg shares routed by the aggregator"
            )
            self.routed = records.id_keyed(routed, "secagg shares routed by the aggregator")
            timing["secagg"] = time.perf_counter() - started - timing.get("open", 0.0)
        msg.content = plain
        return msg, timing

    def _sealed_arrays(self, record, rnd: int, kind: str, timing: dict[str, float], key: str) -> ArrayRecord:
        if not isinstance(record, ConfigRecord) or set(record) != {"sealed"} or not isinstance(record["sealed"], bytes):
            raise codec.CodecError(f"{kind} from the server: the record must hold exactly 'sealed' bytes")
        data = self._open(rnd, kind, timing, key)(record["sealed"])
        arrays = codec.decode_arrays(data, None, what=f"{kind} from the server")
        return to_array_record({name: torch.from_numpy(a) for name, a in arrays.items()})

    def seal_reply(self, msg: Message, reply: Message, timing: dict[str, float]) -> Message:
        """The handler's reply as it travels: payload masked (secagg, ``train``) and/or sealed with the metrics
        (tee); the seconds this took on the reply's metrics."""
        kind, content = msg.metadata.message_type, reply.content
        request: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
        rnd = int(request["round"])
        metrics: dict[str, Any] = dict(content["metrics"])
        what = {TRAIN: "train", PAYLOAD: "train", APPLY: "apply"}[kind]
        if "open" in timing:
            metrics[f"secure_{what}_open_s"] = timing.pop("open")
        metrics.update({k: v for k, v in timing.items() if k.startswith("secure_")})
        if kind == APPLY:
            return _with_content(
                reply,
                RecordDict({**{n: r for n, r in content.items() if n != "metrics"}, "metrics": MetricRecord(metrics)}),
            )
        payload = from_array_record(cast(ArrayRecord, content["payload"])) if "payload" in content else {}
        arrays: dict[str, Any] = dict(payload)
        if self.secagg and kind == TRAIN and payload:
            started = time.perf_counter()
            arrays = {"masked": self._masked(rnd, payload, int(metrics["num_examples"]))}
            metrics["secure_train_secagg_s"] = timing.get("secagg", 0.0) + time.perf_counter() - started
        if self.tee:  # the metrics of a sealed reply travel sealed too
            sealed = {k: v for k, v in metrics.items() if k not in CLEAR_METRICS}
            arrays[SEALED_METRICS] = records.bytes_array(json.dumps(sealed, sort_keys=True).encode())
            metrics = {k: v for k, v in metrics.items() if k in CLEAR_METRICS}
        if not arrays:  # nothing to protect (a secagg report without a payload)
            return _with_content(reply, RecordDict({**dict(content.items()), "metrics": MetricRecord(metrics)}))
        retry = kind == PAYLOAD and bool(dict(msg.content["config"]).get("retry"))
        seal_kind = kind + (".retry" if retry else "")
        seal_timing: dict[str, float] = {}
        record = records.pack(
            arrays, self._seal(rnd, seal_kind, seal_timing, "t", bound={"num_examples": int(metrics["num_examples"])})
        )
        if "t" in seal_timing:
            metrics["secure_train_seal_s"] = seal_timing["t"]
        out = RecordDict({n: r for n, r in content.items() if n not in ("payload", "metrics")})
        out[SECURE] = record
        out["metrics"] = MetricRecord(metrics)
        return _with_content(reply, out)

    def _masked(self, rnd: int, payload: Mapping[str, torch.Tensor], num_examples: int) -> np.ndarray:
        client = self._secagg_client(rnd)
        spec = records.parse_spec(bytes(self.state["secagg/spec"].tolist()), "this client's announced payload")
        if spec_of(dict(payload)) != spec:
            raise SecAggError(
                f"client {self.peer.client}: the payload's names/shapes differ from those announced "
                "in the secure-aggregation keys step"
            )
        vector = np.concatenate([payload[n].detach().double().reshape(-1).numpy() for n in sorted(spec)])
        if not np.isfinite(vector).all():
            raise SecAggError(f"client {self.peer.client}: the payload holds NaN or Inf; nothing is sent")
        if self.peer.payload_layout()[1] == "examples":
            vector = vector * float(num_examples)  # the aggregator divides the sum by the sum of the counts
        if self.peer.diagnostics:  # simulation only: the plain input, to measure the quantisation error
            plain_vectors.setdefault((self.peer.run_id, rnd), {})[self.peer.client] = vector
        masked = client.masked_input(vector, getattr(self, "routed", {}))
        self.state["secagg/state"] = _u8(client.to_bytes())
        self._save()
        return masked

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
            record = ConfigRecord(
                {"client": self.peer.client, "nonce": nonce, "client_key": secret.public_key().public_bytes_raw()}
            )
            return Message(
                RecordDict({"attest": record, "metrics": MetricRecord({"attest_s": time.perf_counter() - started})}),
                reply_to=msg,
            )
        if step != "quote":
            raise AttestationError(f"unknown attestation step {step!r}")
        if "attest/nonce" not in self.state:
            raise AttestationError("attestation failed: a quote arrived without a pending nonce (replayed quote)")
        nonce = bytes(self.state.pop("attest/nonce").tolist())
        secret = X25519PrivateKey.from_private_bytes(bytes(self.state.pop("attest/secret").tolist()))
        self._save()  # the nonce is used once, whatever the outcome
        client_key = secret.public_key().public_bytes_raw()
        quote_record: Mapping[str, Any] = msg.content["attest"]  # a ConfigRecord; values typed as a union
        quote = verify_quote(
            bytes(quote_record["quote"]),
            bytes(quote_record["signature"]),
            trusted,
            nonce=nonce,
            client_key=client_key,
            run_id=self.peer.run_id,
            client=self.peer.client,
            expected_measurement=pinned,
            measurement_source=f"pinned by this client's node config {MEASUREMENT_NODE_CONFIG!r}",
        )
        enclave_key = bytes.fromhex(quote.enclave_key)
        shared = secret.exchange(X25519PublicKey.from_public_bytes(enclave_key))
        keys = derive_session_keys(
            shared, run_id=self.peer.run_id, client=self.peer.client, transcript=nonce + client_key + enclave_key
        )
        self.channel = Channel(run_id=self.peer.run_id, client=self.peer.client, keys=keys, side="client")
        self._save()
        log.info(
            "client %s · attested the aggregator (%s, measurement %s…)",
            self.peer.client,
            quote.backend,
            quote.measurement[:16],
        )
        return Message(RecordDict({"metrics": MetricRecord({"attest_s": time.perf_counter() - started})}), reply_to=msg)

    def _trusted_key(self):
        """The aggregator key this client trusts: from its own node config only. ``secure.trusted_key`` of
        the run config is ignored here: the server submits the run config, so it could name its own key."""
        node_config = self.peer.node_config
        if node_config.get(TRUSTED_KEY_NODE_CONFIG):
            return load_trusted_key(str(node_config[TRUSTED_KEY_NODE_CONFIG]))
        if node_config.get(PUBLIC_KEY_NODE_CONFIG):
            return trusted_key_from_hex(str(node_config[PUBLIC_KEY_NODE_CONFIG]))
        raise AttestationError(
            "attestation refused: this client pins no aggregator key, so it sends nothing: start it with "
            f"`trustformer deploy client --trusted-key FILE.pub` (node config {TRUSTED_KEY_NODE_CONFIG!r}); the "
            "run config's secure.trusted_key comes from the server and is not trusted"
        )

    def _pinned_measurement(self) -> str:
        """The aggregator measurement this client requires: from its own node config only (the run config's
        ``secure.expected_measurement`` comes from the server)."""
        pinned = str(self.peer.node_config.get(MEASUREMENT_NODE_CONFIG, "")).strip().lower()
        if len(pinned) != 64 or set(pinned) - set("0123456789abcdef"):
            raise AttestationError(
                "attestation refused: this client pins no aggregator measurement (64 hex digits), so it sends "
                "nothing: start it with `trustformer deploy client --expected-measurement HEX` (the first line "
                f"of `trustformer attest` with the run's options; node config {MEASUREMENT_NODE_CONFIG!r}); the "
                "run config's secure.expected_measurement comes from the server and is not trusted"
            )
        return pinned

    # -- query.secagg

    def secagg_step(self, msg: Message) -> Message:
        """One secure-aggregation step (keys, shares, unmask) of an exchange round."""
        if not self.secagg:
            raise SecAggError(f"this client runs secure.mode = {self.mode!r}, which has no secure aggregation")
        self.require_session()
        config: Mapping[str, Any] = msg.content["config"]  # a ConfigRecord; Flower types its values as a union
        rnd, step = int(config["round"]), str(config["step"])
        metrics: dict[str, Any] = {"client": self.peer.client}
        timing: dict[str, float] = {}  # seconds spent opening and sealing, reported apart from the secagg step
        started = time.perf_counter()
        if step == "keys":
            spec = self.peer.payload_layout()[0]
            params = records.secagg_params(self.cfg)
            client = SecAggClient(
                self.peer.client,
                list(range(self.cfg.federation.clients)),
                params,
                records.secagg_session(self.peer.run_id, rnd),
                length=records.spec_length(spec),
            )
            keys = client.advertise_keys()
            arrays = {
                "c_pk": records.bytes_array(keys["c_pk"]),
                "s_pk": records.bytes_array(keys["s_pk"]),
                "spec": records.bytes_array(records.spec_json(spec)),
            }
            self.state["secagg/spec"] = _u8(records.spec_json(spec))
        elif step == "shares":
            client = self._secagg_client(rnd)
            broadcast_arrays = records.unpack(
                msg.content, self._open(rnd, "secagg.shares", timing, "open_s"), None, "secagg keys from the aggregator"
            )
            broadcast: dict[int, dict[str, bytes]] = {}
            for name, array in broadcast_arrays.items():
                owner, _, which = name.partition("/")
                if not owner.isdigit() or which not in ("c_pk", "s_pk"):
                    raise codec.CodecError(f"secagg keys from the aggregator: unexpected entry {name!r}")
                broadcast.setdefault(int(owner), {})[which] = array.tobytes()
            arrays = {str(r): records.bytes_array(ct) for r, ct in client.share_keys(broadcast).items()}
        elif step == "unmask":
            client = self._secagg_client(rnd)
            request = records.unpack(
                msg.content, self._open(rnd, "secagg.unmask", timing, "open_s"), None, "secagg unmask request"
            )
            if set(request) != {"survivors", "dropped"} or any(
                a.dtype != np.int64 or a.ndim != 1 for a in request.values()
            ):
                raise codec.CodecError("secagg unmask request: expected int64 lists 'survivors' and 'dropped'")
            revealed = client.unmask(request["survivors"].tolist(), request["dropped"].tolist())
            arrays = {str(owner): records.bytes_array(share) for owner, share in revealed.items()}
        else:
            raise SecAggError(f"unknown secure-aggregation step {step!r}")
        self.state["secagg/state"] = _u8(client.to_bytes())
        self.state["secagg/round"] = torch.tensor([rnd], dtype=torch.int64)
        record = records.pack(arrays, self._seal(rnd, f"secagg.{step}", timing, "seal_s"))
        self._save()
        metrics["secagg_s"] = time.perf_counter() - started - sum(timing.values())
        metrics.update(timing)  # open_s only where a sealed request was opened
        return Message(RecordDict({SECURE: record, "metrics": MetricRecord(metrics)}), reply_to=msg)

    def _secagg_client(self, rnd: int) -> SecAggClient:
        if "secagg/state" not in self.state or int(self.state["secagg/round"][0]) != rnd:
            raise SecAggError(
                f"client {self.peer.client}: no secure-aggregation state for round {rnd} "
                "(the keys step did not run here)"
            )
        return SecAggClient.from_bytes(bytes(self.state["secagg/state"].tolist()))


def _with_content(msg: Message, content: RecordDict) -> Message:
    """``msg`` with its content replaced (its metadata, the reply link, kept)."""
    msg.content = content
    return msg


__all__ = ["ClientChannel", "SecureClient", "make_secure_mod"]
