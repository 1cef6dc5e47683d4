"""Secure aggregation of client vectors (Bonawitz et al. 2017; SecAgg+ semantics, Bell et al. 2020).

The server learns only the SUM of the survivors' vectors, and the sum is still recovered when
clients drop out after the masking setup.

Protocol (one instance per round; ``session`` binds run id and round so no mask ever repeats):

1. ``advertise_keys``: every client makes two fresh X25519 key pairs, ``c`` (to encrypt shares)
   and ``s`` (to agree pairwise mask seeds), and sends both public keys. The server checks and
   broadcasts them (``collect_keys``); the clients that advertised form U1.
2. ``share_keys``: client i draws a self-mask seed ``b_i`` and Shamir-shares ``b_i`` and its masking
   private key ``s_sk_i`` among U1 (threshold t). Each recipient's pair of shares is encrypted
   with AES-256-GCM under a key derived (HKDF-SHA256) from X25519(c_sk_i, c_pk_j); the associated
   data binds session, sender and recipient. The server only routes ciphertexts (``route_shares``);
   the senders form U2.
3. ``masked_input``: client i sends, in Z_{2^64},
   ``y_i = q(x_i) + PRG(b_i) + sum_{j in U2, j>i} PRG(s_ij) - sum_{j in U2, j<i} PRG(s_ij)``
   where ``q`` is fixed-point quantisation and ``s_ij`` = HKDF(X25519(s_sk_i, s_pk_j)). The
   clients whose ``y`` arrives are the survivors U3, the rest of U2 the dropped ones.
4. ``unmask``: each survivor reveals its shares of ``b_j`` for every survivor j and of ``s_sk_j``
   for every dropped j -- never both for one client (that would unmask an individual input).
   The server reconstructs the seeds, removes the self masks of the survivors and the pairwise
   masks the survivors added against the dropped clients; the pairwise masks between survivors
   cancel exactly in the integer sum.

Threat model: semi-honest (honest-but-curious) server and clients. The server follows the protocol
but tries to learn individual inputs from what it sees; it learns nothing beyond the sum of the
survivors' inputs as long as fewer than t clients collude with it. The consistency-check round of
the actively secure variant (signatures over U3) is not implemented, so a server that lies to
different clients about who dropped is out of scope; each client still refuses to reveal both
secrets of one client within its own view, across repeated requests too. For correctness, at least
t clients must survive each step; t > n/2 is the usual choice. The neighbour graph is the complete
graph (every pair of clients masks against each other), which is what SecAgg+ reduces to for the
few clients of a federation here.

Message flow per round (client ids are any distinct integers in [0, 2^64), e.g. partition ids)::

    broadcast = server.collect_keys({i: clients[i].advertise_keys() for i in ids})
    routed = server.route_shares({i: clients[i].share_keys(broadcast) for i in ids})
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(x[i], routed[i]) for i in alive})
    total = server.unmask({i: clients[i].unmask(survivors, dropped) for i in survivors})

A client's own shares never leave it (``share_keys`` returns ciphertexts for the other clients
only). Client state spans several messages: ``SecAggClient.to_bytes``/``from_bytes`` keep it in
the client's own state store (JSON, no pickle; it contains the client's private keys).

Fixed-point encoding, key derivation and the mask PRG are in ``masking.py``, Shamir sharing over the
prime 2^521 - 1 in ``shamir.py``; the encrypted shares use AES-256-GCM (``cryptography`` package).
"""

from __future__ import annotations

import base64
import json
import os
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .masking import (
    _DOMAIN,
    KEY_BYTES,
    SecAggError,
    _agree,
    _check_scale_bits,
    _derive_key,
    _lp,
    _pair_mask,
    _self_mask_context,
    _u64,
    dequantize,
    mask_stream,
    quantization_error_bound,
    quantize,
)
from .shamir import _check_ids, _parse_share, shamir_combine, shamir_split

__all__ = [
    "SecAggClient",
    "SecAggError",
    "SecAggParams",
    "SecAggServer",
    "benchmark",
    "quantization_error_bound",
]

SEED_BYTES = 32
_ENVELOPE_MAGIC = b"SAE1"
_NONCE_BYTES = 12
_TAG_SELF_SEED = b"b"
_TAG_MASK_KEY = b"s"
_STATE_FORMAT = "trustformer-secagg-client/1"


@dataclass(frozen=True)
class SecAggParams:
    """Threshold t (shares needed to reconstruct a secret) and fixed-point scale of the inputs."""

    threshold: int
    scale_bits: int = 24

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 2:
            raise SecAggError(f"secagg threshold must be an integer >= 2, got {self.threshold!r}")
        _check_scale_bits(self.scale_bits)


# ---------------------------------------------------------------------------------------------
# validation helpers shared by client and server


def _check_session(session: bytes) -> bytes:
    if not isinstance(session, (bytes, bytearray)) or not session:
        raise SecAggError("secagg: session must be non-empty bytes binding run id and round")
    return bytes(session)


def _check_client_ids(client_ids: Sequence[int], params: SecAggParams) -> list[int]:
    if not isinstance(params, SecAggParams):
        raise SecAggError(f"secagg: params must be SecAggParams, got {type(params).__name__}")
    ids = sorted(_check_ids(list(client_ids), "client id"))
    if len(ids) < 2:
        raise SecAggError(f"secagg needs at least 2 clients, got {len(ids)}")
    if params.threshold > len(ids):
        raise SecAggError(f"secagg threshold {params.threshold} exceeds the number of clients {len(ids)}")
    return ids


def _check_public_keys(
    keys: Mapping[int, Mapping[str, bytes]], known: set[int], threshold: int, step: str
) -> dict[int, dict[str, bytes]]:
    if not isinstance(keys, Mapping):
        raise SecAggError(f"secagg {step}: public keys must be a mapping client -> keys")
    out: dict[int, dict[str, bytes]] = {}
    seen: dict[bytes, int] = {}
    for client, entry in keys.items():
        (cid,) = _id_list([client], "client id", step)
        if cid not in known:
            raise SecAggError(f"secagg {step}: unknown client id {cid}")
        if not isinstance(entry, Mapping) or set(entry) != {"c_pk", "s_pk"}:
            got = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
            raise SecAggError(f"secagg {step}: client {cid} must send exactly 'c_pk' and 's_pk', got {got}")
        for name in ("c_pk", "s_pk"):
            value = entry[name]
            if not isinstance(value, (bytes, bytearray)) or len(value) != KEY_BYTES:
                size = len(value) if isinstance(value, (bytes, bytearray)) else type(value).__name__
                raise SecAggError(f"secagg {step}: client {cid} key {name!r} has {size} bytes, expected {KEY_BYTES}")
            if bytes(value) in seen:
                raise SecAggError(
                    f"secagg {step}: client {cid} key {name!r} repeats a key of client {seen[bytes(value)]}"
                )
            seen[bytes(value)] = cid
        out[cid] = {"c_pk": bytes(entry["c_pk"]), "s_pk": bytes(entry["s_pk"])}
    if len(out) < threshold:
        raise SecAggError(f"secagg {step}: {len(out)} clients sent keys, threshold is {threshold}")
    return out


def _share_aad(session: bytes, sender: int, recipient: int) -> bytes:
    return _DOMAIN + b"shares" + _lp(session) + _u64(sender) + _u64(recipient)


def _id_list(values: Sequence[int], what: str, step: str) -> list[int]:
    try:
        return sorted(_check_ids(list(values), what))
    except SecAggError as err:
        raise SecAggError(f"secagg {step}: {str(err).removeprefix('secagg: ')}") from None


# ---------------------------------------------------------------------------------------------
# client


class SecAggClient:
    """One client's side of a secure-aggregation round (steps must run in protocol order)."""

    def __init__(
        self,
        client_id: int,
        client_ids: Sequence[int],
        params: SecAggParams,
        session: bytes,
        *,
        length: int | None = None,
    ):
        self.params = params
        self.client_ids = _check_client_ids(client_ids, params)
        (self.client_id,) = _check_ids([client_id], "client id")
        if self.client_id not in self.client_ids:
            raise SecAggError(f"secagg: client {self.client_id} is not among the clients {self.client_ids}")
        self.session = _check_session(session)
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise SecAggError(f"secagg client {self.client_id}: length must be a positive integer, got {length!r}")
        self.length = length
        # Key pairs come from the OS CSPRNG, never from the config seed: the config (and so its
        # seed) is shared with the server and the other clients, who could then recompute the keys,
        # the mask seeds and hence this client's input. Fresh keys per session also mean no mask
        # is ever reused across rounds.
        self._c_sk = X25519PrivateKey.from_private_bytes(os.urandom(KEY_BYTES))
        self._s_sk = X25519PrivateKey.from_private_bytes(os.urandom(KEY_BYTES))
        self._step = "init"
        self._b: bytes | None = None
        self._public_keys: dict[int, dict[str, bytes]] = {}
        self._own_shares: tuple[bytes, bytes] | None = None  # (share of b_i, share of s_sk_i) for itself
        self._received: dict[int, tuple[bytes, bytes]] = {}  # sender -> (share of b_j, share of s_sk_j)
        self._u2: list[int] = []
        self._revealed: tuple[list[int], list[int]] | None = None

    def _where(self, step: str) -> str:
        return f"secagg {step}: client {self.client_id}"

    def _expect(self, step: str, *allowed: str) -> None:
        if self._step not in allowed:
            raise SecAggError(
                f"{self._where(step)}: called after step {self._step!r}, expected after {' or '.join(allowed)}"
            )

    def _raw_public(self) -> dict[str, bytes]:
        return {"c_pk": _public_raw(self._c_sk), "s_pk": _public_raw(self._s_sk)}

    def advertise_keys(self) -> dict[str, bytes]:
        """Round 0: the two raw 32-byte X25519 public keys ``{"c_pk", "s_pk"}``."""
        self._expect("advertise_keys", "init", "advertise_keys")
        self._step = "advertise_keys"
        return self._raw_public()

    def share_keys(self, public_keys: Mapping[int, Mapping[str, bytes]]) -> dict[int, bytes]:
        """Round 1: Shamir-share ``b_i`` and ``s_sk_i`` among the advertised clients (threshold t).

        Returns ``{recipient: ciphertext}``; each recipient's pair of shares is AES-256-GCM
        encrypted under HKDF(X25519(c_sk_i, c_pk_j)). The share for this client itself stays here.
        """
        step = "share_keys"
        self._expect(step, "advertise_keys")
        where = f"{step}: client {self.client_id}"
        keys = _check_public_keys(public_keys, set(self.client_ids), self.params.threshold, where)
        if keys.get(self.client_id) != self._raw_public():
            raise SecAggError(f"{self._where(step)}: the broadcast keys do not contain this client's own public keys")
        self._public_keys = keys
        # Self-mask seed from the OS CSPRNG for the same reason as the key pairs.
        self._b = os.urandom(SEED_BYTES)
        holders = sorted(keys)
        b_shares = shamir_split(self._b, self.params.threshold, holders)
        s_shares = shamir_split(_private_raw(self._s_sk), self.params.threshold, holders)
        out = {}
        for recipient in holders:
            if recipient == self.client_id:
                self._own_shares = (b_shares[recipient], s_shares[recipient])
                continue
            plaintext = (
                _ENVELOPE_MAGIC
                + _u64(self.client_id)
                + _u64(recipient)
                + _lp(b_shares[recipient])
                + _lp(s_shares[recipient])
            )
            key = self._share_key(recipient, self.client_id, recipient)
            nonce = os.urandom(_NONCE_BYTES)
            aad = _share_aad(self.session, self.client_id, recipient)
            out[recipient] = nonce + AESGCM(key).encrypt(nonce, plaintext, aad)
        self._step = step
        return out

    def _share_key(self, peer: int, sender: int, recipient: int) -> bytes:
        shared = _agree(self._c_sk, self._public_keys[peer]["c_pk"])
        return _derive_key(shared, b"share-encryption", self.session, sender, recipient)

    def _open_shares(self, sender: int, ciphertext: bytes) -> tuple[bytes, bytes]:
        step = "masked_input"
        if not isinstance(ciphertext, (bytes, bytearray)) or len(ciphertext) <= _NONCE_BYTES + 16:
            raise SecAggError(f"{self._where(step)}: share ciphertext from client {sender} is malformed")
        ciphertext = bytes(ciphertext)
        key = self._share_key(sender, sender, self.client_id)
        try:
            plain = AESGCM(key).decrypt(
                ciphertext[:_NONCE_BYTES], ciphertext[_NONCE_BYTES:], _share_aad(self.session, sender, self.client_id)
            )
        except InvalidTag:
            raise SecAggError(
                f"{self._where(step)}: share ciphertext from client {sender} fails authentication "
                "(tampered, wrong session or wrong key)"
            ) from None
        try:
            head = len(_ENVELOPE_MAGIC) + 16
            magic, snd, rcp = plain[: len(_ENVELOPE_MAGIC)], *struct.unpack(">QQ", plain[len(_ENVELOPE_MAGIC) : head])
            (n_b,) = struct.unpack(">I", plain[head : head + 4])
            b_share = plain[head + 4 : head + 4 + n_b]
            rest = plain[head + 4 + n_b :]
            (n_s,) = struct.unpack(">I", rest[:4])
            s_share = rest[4 : 4 + n_s]
            ok = magic == _ENVELOPE_MAGIC and len(rest) == 4 + n_s and (snd, rcp) == (sender, self.client_id)
        except struct.error:
            ok = False
        if not ok:
            raise SecAggError(f"{self._where(step)}: share envelope from client {sender} is malformed")
        for name, share in (("self-mask seed", b_share), ("masking key", s_share)):
            try:
                threshold, _, _ = _parse_share(self.client_id, share)
            except SecAggError:
                raise SecAggError(f"{self._where(step)}: share of the {name} of client {sender} is malformed") from None
            if threshold != self.params.threshold:
                raise SecAggError(
                    f"{self._where(step)}: share of the {name} of client {sender} has threshold {threshold}, "
                    f"expected {self.params.threshold}"
                )
        return b_share, s_share

    def masked_input(self, vector: np.ndarray, shares_for_me: Mapping[int, bytes]) -> np.ndarray:
        """Round 2: decrypt and keep the shares sent here; return the masked uint64 vector.

        ``y_i = q(x_i) + PRG(b_i) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij)`` (mod 2^64) over the
        clients j that sent shares. Refuses NaN/Inf, a wrong length or shape, values outside the
        fixed-point range, and a second call (two inputs under one mask would leak their difference).
        """
        step = "masked_input"
        self._expect(step, "share_keys")
        if not isinstance(shares_for_me, Mapping):
            raise SecAggError(f"{self._where(step)}: shares must be a mapping sender -> ciphertext")
        senders = _id_list(list(shares_for_me), "sender id", f"{step}: client {self.client_id}")
        for sender in senders:
            if sender == self.client_id:
                raise SecAggError(f"{self._where(step)}: received a share ciphertext from itself")
            if sender not in self._public_keys:
                raise SecAggError(
                    f"{self._where(step)}: share ciphertext from unknown client {sender} (it advertised no keys)"
                )
        u2 = sorted([*senders, self.client_id])
        if len(u2) < self.params.threshold:
            raise SecAggError(
                f"{self._where(step)}: only {len(u2)} clients shared keys, threshold is {self.params.threshold}"
            )
        x = np.asarray(vector)
        if x.ndim != 1 or x.size == 0:
            raise SecAggError(f"{self._where(step)}: input must be a non-empty 1-D vector, got shape {x.shape}")
        if self.length is not None and x.size != self.length:
            raise SecAggError(f"{self._where(step)}: input has length {x.size}, expected {self.length}")
        if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
            raise SecAggError(f"{self._where(step)}: input dtype {x.dtype} is not numeric")
        try:
            q = quantize(x, self.params.scale_bits, num_clients=len(self.client_ids))
        except SecAggError as err:
            raise SecAggError(f"{self._where(step)}: {str(err).removeprefix('secagg quantize: ')}") from None
        received = {sender: self._open_shares(sender, shares_for_me[sender]) for sender in senders}
        assert self._b is not None
        y = q + mask_stream(self._b, x.size, _self_mask_context(self.session, self.client_id))
        for other in senders:
            mask = _pair_mask(self._s_sk, self._public_keys[other]["s_pk"], self.session, self.client_id, other, x.size)
            if other > self.client_id:
                y += mask
            else:
                y -= mask
        self._received = received
        self._u2 = u2
        self.length = int(x.size)
        self._step = step
        return y

    def unmask(self, survivors: Sequence[int], dropped: Sequence[int]) -> dict[int, bytes]:
        """Round 3: shares of ``b_j`` for every survivor j and of ``s_sk_j`` for every dropped j.

        Refuses a client listed in both (or, over repeated calls, asked for both secrets of one
        client), lists that do not partition the clients that shared keys, fewer than t survivors,
        and being listed as dropped itself. Each returned value is a one-byte tag (``b`` or ``s``)
        followed by the Shamir share.
        """
        step = "unmask"
        self._expect(step, "masked_input", "unmask")
        where = f"{step}: client {self.client_id}"
        alive, gone = _id_list(survivors, "survivor id", where), _id_list(dropped, "dropped id", where)
        both = sorted(set(alive) & set(gone))
        if both:
            raise SecAggError(
                f"{self._where(step)} refuses: the server asks for both the self-mask share and the masking-key "
                f"share of client(s) {both}, which would reveal their individual input"
            )
        if self._revealed is not None and (alive, gone) != self._revealed:
            earlier_alive, earlier_gone = self._revealed
            switched = sorted((set(alive) & set(earlier_gone)) | (set(gone) & set(earlier_alive)))
            raise SecAggError(
                f"{self._where(step)} refuses: a repeated unmask request changes who survived "
                f"(clients {switched or sorted(set(alive) ^ set(earlier_alive))}); revealing both secrets of a client "
                "would reveal its input"
            )
        unknown = sorted((set(alive) | set(gone)) - set(self._u2))
        if unknown:
            raise SecAggError(f"{self._where(step)}: unknown client(s) {unknown} (they did not share keys)")
        missing = sorted(set(self._u2) - set(alive) - set(gone))
        if missing:
            raise SecAggError(
                f"{self._where(step)}: client(s) {missing} are listed neither as survivors nor as dropped"
            )
        if self.client_id in gone:
            raise SecAggError(f"{self._where(step)}: this client is listed as dropped in its own unmask request")
        if len(alive) < self.params.threshold:
            raise SecAggError(f"{self._where(step)}: {len(alive)} survivors, threshold is {self.params.threshold}")
        assert self._own_shares is not None
        held = dict(self._received)
        held[self.client_id] = self._own_shares
        out = {j: _TAG_SELF_SEED + held[j][0] for j in alive}
        out.update({j: _TAG_MASK_KEY + held[j][1] for j in gone})
        self._revealed = (alive, gone)
        self._step = step
        return out

    def to_bytes(self) -> bytes:
        """Serialize the full client state (including private keys) as JSON, to keep it between messages.

        The blob holds this client's secrets: store it only where the client's own data is kept.
        """
        data = {
            "format": _STATE_FORMAT,
            "client_id": self.client_id,
            "client_ids": self.client_ids,
            "threshold": self.params.threshold,
            "scale_bits": self.params.scale_bits,
            "session": _b64(self.session),
            "length": self.length,
            "step": self._step,
            "c_sk": _b64(_private_raw(self._c_sk)),
            "s_sk": _b64(_private_raw(self._s_sk)),
            "b": None if self._b is None else _b64(self._b),
            "public_keys": {str(k): {n: _b64(v) for n, v in e.items()} for k, e in self._public_keys.items()},
            "own_shares": None if self._own_shares is None else [_b64(s) for s in self._own_shares],
            "received": {str(k): [_b64(s) for s in v] for k, v in self._received.items()},
            "u2": self._u2,
            "revealed": None if self._revealed is None else [self._revealed[0], self._revealed[1]],
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> SecAggClient:
        """Restore a client saved with ``to_bytes``."""
        try:
            data = json.loads(bytes(blob).decode())
            if data.get("format") != _STATE_FORMAT:
                raise SecAggError(f"secagg: client state has format {data.get('format')!r}, expected {_STATE_FORMAT!r}")
            client = cls(
                data["client_id"],
                data["client_ids"],
                SecAggParams(data["threshold"], data["scale_bits"]),
                _unb64(data["session"]),
                length=data["length"],
            )
            client._c_sk = X25519PrivateKey.from_private_bytes(_unb64(data["c_sk"]))
            client._s_sk = X25519PrivateKey.from_private_bytes(_unb64(data["s_sk"]))
            client._step = str(data["step"])
            client._b = None if data["b"] is None else _unb64(data["b"])
            client._public_keys = {int(k): {n: _unb64(v) for n, v in e.items()} for k, e in data["public_keys"].items()}
            client._own_shares = None if data["own_shares"] is None else tuple(_unb64(s) for s in data["own_shares"])
            client._received = {int(k): tuple(_unb64(s) for s in v) for k, v in data["received"].items()}
            client._u2 = [int(i) for i in data["u2"]]
            revealed = data["revealed"]
            client._revealed = None if revealed is None else ([*map(int, revealed[0])], [*map(int, revealed[1])])
        except SecAggError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
            raise SecAggError(f"secagg: client state is malformed ({type(err).__name__}: {err})") from None
        if client._step not in {"init", "advertise_keys", "share_keys", "masked_input", "unmask"}:
            raise SecAggError(f"secagg: client state has unknown step {client._step!r}")
        return client


def _public_raw(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


def _private_raw(private: X25519PrivateKey) -> bytes:
    return private.private_bytes_raw()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


# ---------------------------------------------------------------------------------------------
# server


class SecAggServer:
    """The aggregator's side: routes key material, sums masked vectors, removes the masks."""

    def __init__(self, client_ids: Sequence[int], params: SecAggParams, length: int, session: bytes):
        self.params = params
        self.client_ids = _check_client_ids(client_ids, params)
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise SecAggError(f"secagg server: vector length must be a positive integer, got {length!r}")
        self.length = int(length)
        self.session = _check_session(session)
        self._step = "init"
        self._keys: dict[int, dict[str, bytes]] = {}
        self._u2: list[int] = []
        self._survivors: list[int] = []
        self._dropped: list[int] = []
        self._masked_sum: np.ndarray | None = None

    def _expect(self, step: str, allowed: str) -> None:
        if self._step != allowed:
            raise SecAggError(f"secagg {step}: server called after step {self._step!r}, expected after {allowed!r}")

    def collect_keys(self, keys: Mapping[int, Mapping[str, bytes]]) -> dict[int, dict[str, bytes]]:
        """Validate the advertised public keys (known ids, 32 bytes, >= t clients); return the broadcast."""
        self._expect("collect_keys", "init")
        self._keys = _check_public_keys(keys, set(self.client_ids), self.params.threshold, "collect_keys")
        self._step = "collect_keys"
        return {cid: dict(entry) for cid, entry in sorted(self._keys.items())}

    def route_shares(self, shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """Turn ``sender -> {recipient: ct}`` into ``recipient -> {sender: ct}`` for the clients that sent shares.

        Each sender must address exactly the other clients that advertised keys.
        """
        step = "route_shares"
        self._expect(step, "collect_keys")
        if not isinstance(shares, Mapping):
            raise SecAggError(f"secagg {step}: shares must be a mapping sender -> {{recipient: ciphertext}}")
        senders = _id_list(list(shares), "sender id", step)
        for sender in senders:
            if sender not in self._keys:
                raise SecAggError(f"secagg {step}: shares from unknown client {sender} (it advertised no keys)")
            entry = shares[sender]
            if not isinstance(entry, Mapping):
                raise SecAggError(f"secagg {step}: shares of client {sender} must be a mapping recipient -> ciphertext")
            recipients = set(_id_list(list(entry), "recipient id", f"{step}: client {sender}"))
            expected = set(self._keys) - {sender}
            if recipients != expected:
                raise SecAggError(
                    f"secagg {step}: client {sender} addressed recipients {sorted(recipients)}, "
                    f"expected {sorted(expected)}"
                )
            for recipient, ct in entry.items():
                if not isinstance(ct, (bytes, bytearray)) or not ct:
                    raise SecAggError(f"secagg {step}: ciphertext from client {sender} to {recipient} is not bytes")
        if len(senders) < self.params.threshold:
            raise SecAggError(
                f"secagg {step}: {len(senders)} clients sent shares, threshold is {self.params.threshold}"
            )
        self._u2 = senders
        self._step = step
        return {
            recipient: {sender: bytes(shares[sender][recipient]) for sender in senders if sender != recipient}
            for recipient in senders
        }

    def collect_masked(self, masked: Mapping[int, np.ndarray]) -> tuple[list[int], list[int]]:
        """Sum the masked vectors; return (survivors, dropped) among the clients that sent shares."""
        step = "collect_masked"
        self._expect(step, "route_shares")
        if not isinstance(masked, Mapping):
            raise SecAggError(f"secagg {step}: masked inputs must be a mapping client -> uint64 vector")
        survivors = _id_list(list(masked), "client id", step)
        total = np.zeros(self.length, dtype=np.uint64)
        for cid in survivors:
            if cid not in self._u2:
                raise SecAggError(f"secagg {step}: masked input from client {cid}, which did not share keys")
            y = np.asarray(masked[cid])
            if y.dtype != np.uint64 or y.shape != (self.length,):
                raise SecAggError(
                    f"secagg {step}: masked input of client {cid} is {y.dtype} with shape {y.shape}, "
                    f"expected uint64 with shape ({self.length},)"
                )
            total += y
        if len(survivors) < self.params.threshold:
            raise SecAggError(
                f"secagg {step}: {len(survivors)} masked inputs arrived, threshold is {self.params.threshold}; "
                f"too many clients dropped ({sorted(set(self._u2) - set(survivors))})"
            )
        self._survivors = survivors
        self._dropped = sorted(set(self._u2) - set(survivors))
        self._masked_sum = total
        self._step = step
        return list(self._survivors), list(self._dropped)

    def _reconstruct(self, owner: int, tag: bytes, responses: Mapping[int, Mapping[int, bytes]], what: str) -> bytes:
        shares = {}
        for responder, entry in responses.items():
            if owner not in entry:
                continue
            value = entry[owner]
            if not isinstance(value, (bytes, bytearray)) or value[:1] != tag:
                raise SecAggError(
                    f"secagg unmask: client {responder} sent a share of the wrong kind for the {what} of client {owner}"
                )
            shares[responder] = bytes(value[1:])
        try:
            return shamir_combine(shares)
        except SecAggError as err:
            raise SecAggError(
                f"secagg unmask: cannot reconstruct the {what} of client {owner} from the shares of clients "
                f"{sorted(shares)}: {str(err).removeprefix('secagg shamir_combine: ')}"
            ) from None

    def unmask(self, shares: Mapping[int, Mapping[int, bytes]]) -> np.ndarray:
        """Reconstruct ``b_j`` (survivors) and ``s_sk_j`` (dropped), remove the masks, return the float64 SUM."""
        step = "unmask"
        self._expect(step, "collect_masked")
        if not isinstance(shares, Mapping):
            raise SecAggError(f"secagg {step}: shares must be a mapping responder -> {{owner: share}}")
        responders = _id_list(list(shares), "responder id", step)
        expected = set(self._survivors) | set(self._dropped)
        for responder in responders:
            if responder not in self._survivors:
                raise SecAggError(f"secagg {step}: shares from client {responder}, which is not a survivor")
            entry = shares[responder]
            if not isinstance(entry, Mapping):
                raise SecAggError(f"secagg {step}: shares of client {responder} must be a mapping owner -> share")
            extra = sorted(set(_id_list(list(entry), "owner id", f"{step}: client {responder}")) - expected)
            if extra:
                raise SecAggError(f"secagg {step}: client {responder} sent shares for unknown client(s) {extra}")
        if len(responders) < self.params.threshold:
            raise SecAggError(
                f"secagg {step}: {len(responders)} clients answered, threshold is {self.params.threshold}"
            )
        assert self._masked_sum is not None
        total = self._masked_sum.copy()
        for owner in self._survivors:
            seed = self._reconstruct(owner, _TAG_SELF_SEED, shares, "self-mask seed")
            if len(seed) != SEED_BYTES:
                raise SecAggError(f"secagg {step}: self-mask seed of client {owner} has {len(seed)} bytes")
            total -= mask_stream(seed, self.length, _self_mask_context(self.session, owner))
        for owner in self._dropped:
            raw = self._reconstruct(owner, _TAG_MASK_KEY, shares, "masking key")
            if len(raw) != KEY_BYTES:
                raise SecAggError(f"secagg {step}: masking key of client {owner} has {len(raw)} bytes")
            s_sk = X25519PrivateKey.from_private_bytes(raw)
            if _public_raw(s_sk) != self._keys[owner]["s_pk"]:
                raise SecAggError(
                    f"secagg {step}: reconstructed masking key of client {owner} does not match its public key"
                )
            for survivor in self._survivors:
                # survivor i added +PRG(s_ij) if j > i, -PRG(s_ij) if j < i; remove it
                mask = _pair_mask(s_sk, self._keys[survivor]["s_pk"], self.session, survivor, owner, self.length)
                if owner > survivor:
                    total -= mask
                else:
                    total += mask
        self._step = step
        return dequantize(total, self.params.scale_bits)


# ---------------------------------------------------------------------------------------------
# measured cost


def _run_protocol(
    vectors: Mapping[int, np.ndarray], params: SecAggParams, session: bytes, drop_after_shares: Sequence[int] = ()
) -> tuple[np.ndarray, dict[str, float], dict[str, int]]:
    """One full protocol instance; returns the sum, seconds per step and bytes per message kind."""
    ids = sorted(vectors)
    length = len(next(iter(vectors.values())))
    seconds: dict[str, float] = {}

    def timed(name: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return result

    server = SecAggServer(ids, params, length, session)
    clients = {i: SecAggClient(i, ids, params, session, length=length) for i in ids}
    advertised = {i: timed("advertise_keys", c.advertise_keys) for i, c in clients.items()}
    broadcast = timed("collect_keys", server.collect_keys, advertised)
    sent = {i: timed("share_keys", c.share_keys, broadcast) for i, c in clients.items()}
    routed = timed("route_shares", server.route_shares, sent)
    live = [i for i in ids if i not in set(drop_after_shares)]
    masked = {i: timed("masked_input", clients[i].masked_input, vectors[i], routed[i]) for i in live}
    survivors, dropped = timed("collect_masked", server.collect_masked, masked)
    revealed = {i: timed("client_unmask", clients[i].unmask, survivors, dropped) for i in survivors}
    total = timed("server_unmask", server.unmask, revealed)
    sizes = {
        "keys_bytes": sum(len(v) for e in advertised.values() for v in e.values()),
        "share_ciphertext_bytes": sum(len(ct) for e in sent.values() for ct in e.values()),
        "masked_bytes": sum(y.nbytes for y in masked.values()),
        "unmask_share_bytes": sum(len(s) for e in revealed.values() for s in e.values()),
    }
    return total, seconds, sizes


def benchmark(length: int, num_clients: int) -> dict:
    """Measure seconds per protocol step for ``num_clients`` clients masking ``length``-element vectors.

    Client steps are reported as the mean per client; server steps as totals. A second instance
    with one client dropped after ``share_keys`` measures the dropout recovery (when the threshold
    allows it). Also reports the plain float sum time as a baseline, the bytes per message kind, and
    the measured max error against the plain sum next to ``quantization_error_bound``.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise SecAggError(f"secagg benchmark: length must be a positive integer, got {length!r}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 2:
        raise SecAggError(f"secagg benchmark: num_clients must be an integer >= 2, got {num_clients!r}")
    params = SecAggParams(threshold=max(2, num_clients // 2 + 1))
    rng = np.random.default_rng(0)
    vectors = {i: rng.normal(0.0, 1.0, length).astype(np.float32) for i in range(num_clients)}
    start = time.perf_counter()
    plain = np.zeros(length, dtype=np.float64)
    for v in vectors.values():
        plain += v
    plain_s = time.perf_counter() - start
    total, seconds, sizes = _run_protocol(vectors, params, b"benchmark/all-survive")
    per_client = {"advertise_keys", "share_keys", "masked_input", "client_unmask"}
    result: dict = {
        "length": length,
        "num_clients": num_clients,
        "threshold": params.threshold,
        "scale_bits": params.scale_bits,
        "plain_sum_s": plain_s,
    }
    for name, value in seconds.items():
        result[f"{name}_s"] = value / num_clients if name in per_client else value
    result["total_s"] = sum(seconds.values())
    result.update(sizes)
    result["plain_float32_bytes"] = 4 * length * num_clients
    result["max_abs_error"] = float(np.max(np.abs(total - plain)))
    result["error_bound"] = quantization_error_bound(num_clients, params.scale_bits)
    if num_clients - 1 >= params.threshold:
        survivors = {i: v for i, v in vectors.items() if i != num_clients - 1}
        dropped_total, dropped_seconds, _ = _run_protocol(
            vectors, params, b"benchmark/one-dropped", drop_after_shares=[num_clients - 1]
        )
        result["server_unmask_one_dropped_s"] = dropped_seconds["server_unmask"]
        plain_survivors = np.sum([v.astype(np.float64) for v in survivors.values()], axis=0)
        result["max_abs_error_one_dropped"] = float(np.max(np.abs(dropped_total - plain_survivors)))
    return result
