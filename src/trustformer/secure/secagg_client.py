"""One client's side of a secure-aggregation round (module docstring of ``secagg.py``): its keys, its encrypted
Shamir shares, its masked input, the shares it reveals for the unmasking, and its state between messages."""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .masking import (
    DOMAIN,
    KEY_BYTES,
    SecAggError,
    agree,
    derive_key,
    lp,
    mask_stream,
    pair_mask,
    quantize,
    self_mask_context,
    u64,
)
from .secagg_common import (
    SEED_BYTES,
    TAG_MASK_KEY,
    TAG_SELF_SEED,
    SecAggParams,
    check_client_ids,
    check_public_keys,
    check_session,
    id_list,
    public_raw,
)
from .shamir import check_ids, parse_share, shamir_split

_ENVELOPE_MAGIC = b"SAE1"
_NONCE_BYTES = 12
_STATE_FORMAT = "trustformer-secagg-client/1"


def _share_aad(session: bytes, sender: int, recipient: int) -> bytes:
    return DOMAIN + b"shares" + lp(session) + u64(sender) + u64(recipient)


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
        self.client_ids = check_client_ids(client_ids, params)
        (self.client_id,) = check_ids([client_id], "client id")
        if self.client_id not in self.client_ids:
            raise SecAggError(f"secagg: client {self.client_id} is not among the clients {self.client_ids}")
        self.session = check_session(session)
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
        return {"c_pk": public_raw(self._c_sk), "s_pk": public_raw(self._s_sk)}

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
        keys = check_public_keys(public_keys, set(self.client_ids), self.params.threshold, where)
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
                + u64(self.client_id)
                + u64(recipient)
                + lp(b_shares[recipient])
                + lp(s_shares[recipient])
            )
            key = self._share_key(recipient, self.client_id, recipient)
            nonce = os.urandom(_NONCE_BYTES)
            aad = _share_aad(self.session, self.client_id, recipient)
            out[recipient] = nonce + AESGCM(key).encrypt(nonce, plaintext, aad)
        self._step = step
        return out

    def _share_key(self, peer: int, sender: int, recipient: int) -> bytes:
        shared = agree(self._c_sk, self._public_keys[peer]["c_pk"])
        return derive_key(shared, b"share-encryption", self.session, sender, recipient)

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
                threshold, _, _ = parse_share(self.client_id, share)
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
        senders = id_list(list(shares_for_me), "sender id", f"{step}: client {self.client_id}")
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
        y = q + mask_stream(self._b, x.size, self_mask_context(self.session, self.client_id))
        for other in senders:
            mask = pair_mask(self._s_sk, self._public_keys[other]["s_pk"], self.session, self.client_id, other, x.size)
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
        alive, gone = id_list(survivors, "survivor id", where), id_list(dropped, "dropped id", where)
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
        why = self.params.too_few(len(alive))
        if why:
            raise SecAggError(f"{self._where(step)} refuses to unmask: {len(alive)} survivors, {why}")
        assert self._own_shares is not None
        held = dict(self._received)
        held[self.client_id] = self._own_shares
        out = {j: TAG_SELF_SEED + held[j][0] for j in alive}
        out.update({j: TAG_MASK_KEY + held[j][1] for j in gone})
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
            "min_survivors": self.params.min_survivors,
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
                SecAggParams(data["threshold"], data["scale_bits"], int(data.get("min_survivors", 0))),
                _unb64(data["session"]),
                length=data["length"],
            )
            client._c_sk = X25519PrivateKey.from_private_bytes(_unb64(data["c_sk"]))
            client._s_sk = X25519PrivateKey.from_private_bytes(_unb64(data["s_sk"]))
            client._step = str(data["step"])
            client._b = None if data["b"] is None else _unb64(data["b"])
            client._public_keys = {int(k): {n: _unb64(v) for n, v in e.items()} for k, e in data["public_keys"].items()}
            client._own_shares = (
                None
                if data["own_shares"] is None
                else cast("tuple[bytes, bytes]", tuple(_unb64(s) for s in data["own_shares"]))
            )
            client._received = {
                int(k): cast("tuple[bytes, bytes]", tuple(_unb64(s) for s in v)) for k, v in data["received"].items()
            }
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


def _private_raw(private: X25519PrivateKey) -> bytes:
    return private.private_bytes_raw()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


__all__ = ["SecAggClient"]
