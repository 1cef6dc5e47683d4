"""Per-client session keys and sealed messages: X25519 + HKDF-SHA256, AES-256-GCM.

Keys. After attestation the client and the aggregator share an X25519 secret; HKDF-SHA256 (salt:
SHA-256 of the handshake transcript — the client's nonce and both public keys) derives one 256-bit
key per direction, each bound to the run id and the client id (``up``: client → aggregator,
``down``: aggregator → client). A key is never used in the other direction or by another client.

Counters. Every sealed message has a counter: its slot in the run's message schedule,
``round * SLOTS_PER_ROUND + step`` (:data:`STEPS`), the same on both sides, so a lost or rejected
message never desynchronises the two ends. The AES-GCM nonce is that counter (96 bits, big-endian);
the sender refuses to seal a counter it has already used, so a nonce is never reused under a key,
even when a request is delivered twice — except to seal exactly the same message again (same
plaintext and associated data, hence the same ciphertext: nothing new is revealed), so a re-sent
request that is recomputed identically is answered identically. The receiver accepts a message only
if its counter is the slot it is waiting for *and* above every counter it accepted before.

Associated data (authenticated, not encrypted): run id, round, client id, direction, message type,
counter, and any extra fields the caller binds (e.g. the client's example count).

Every rejection is a :class:`SealError` (a :class:`~trustformer.wire.PayloadError`) whose ``reason`` is
one of :data:`REASONS`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..wire import PayloadError

SEALED_MAGIC = b"TFS1"
HEADER = struct.Struct(">4sQ")  # magic, counter
TAG_BYTES = 16
KEY_BYTES = 32
DIRECTIONS = ("up", "down")
# the schedule slot of each sealed message in a round (counters rise within a direction). "train.model" (a model
# the train message carries down: Phong) shares slot 3 with the train message's secure-aggregation shares, which
# never travel with it (secure aggregation refuses Phong); "train.payload" (and its retry: FedPC asking the next
# best worker for its model) follow the train reply upwards.
STEPS = {
    "secagg.keys": 1,
    "secagg.shares": 2,
    "train": 3,
    "train.model": 3,
    "secagg.unmask": 4,
    "train.apply": 5,
    "train.payload": 6,
    "train.payload.retry": 7,
}
SLOTS_PER_ROUND = 8
REASONS = ("malformed", "truncated", "replay", "out-of-order", "authentication", "nonce-reuse", "no-session")
REJECTED_TAG = "sealed message rejected"


class SealError(PayloadError):
    """A sealed message was rejected (or could not be sealed); ``reason`` says why (see :data:`REASONS`)."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        self.reason = reason
        super().__init__(f"{REJECTED_TAG} ({reason}): {detail}")


def message_counter(round_: int, kind: str) -> int:
    """The counter (schedule slot) of message ``kind`` in round ``round_``."""
    if kind not in STEPS:
        raise ValueError(f"unknown sealed message type {kind!r} (known: {', '.join(STEPS)})")
    if round_ < 1:
        raise ValueError(f"round {round_} must be >= 1")
    return round_ * SLOTS_PER_ROUND + STEPS[kind]


@dataclass(frozen=True)
class SessionKeys:
    up: bytes
    down: bytes


def derive_session_keys(shared_secret: bytes, *, run_id: int, client: int, transcript: bytes) -> SessionKeys:
    """HKDF-SHA256 of the X25519 secret: one key per direction, bound to run, client and handshake."""
    salt = hashlib.sha256(b"trustformer handshake v1\0" + transcript).digest()

    def key(direction: str) -> bytes:
        info = f"trustformer seal v1|run={run_id}|client={client}|dir={direction}".encode()
        return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(shared_secret)

    return SessionKeys(up=key("up"), down=key("down"))


def associated_data(
    *,
    run_id: int,
    round_: int,
    client: int,
    direction: str,
    kind: str,
    counter: int,
    bound: dict[str, Any] | None = None,
) -> bytes:
    """The AEAD associated data: canonical JSON of everything a sealed message is bound to."""
    fields = {
        "v": 1,
        "run": run_id,
        "round": round_,
        "client": client,
        "dir": direction,
        "type": kind,
        "counter": counter,
        "bound": dict(sorted((bound or {}).items())),
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


@dataclass
class Channel:
    """One side of a client's sealed session: the keys, and the highest counters sent and accepted."""

    run_id: int
    client: int
    keys: SessionKeys
    side: str  # "client" or "server"
    last_sent: int = 0
    last_accepted: int = 0
    last_sent_digest: bytes = b""  # SHA-256 of the last sealed (associated data, plaintext)

    @property
    def send_direction(self) -> str:
        return "up" if self.side == "client" else "down"

    @property
    def receive_direction(self) -> str:
        return "down" if self.side == "client" else "up"

    def _key(self, direction: str) -> bytes:
        return self.keys.up if direction == "up" else self.keys.down

    def seal(self, plaintext: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None) -> bytes:
        """Encrypt and authenticate ``plaintext`` as message ``kind`` of ``round_``."""
        counter = message_counter(round_, kind)
        aad = associated_data(
            run_id=self.run_id,
            round_=round_,
            client=self.client,
            direction=self.send_direction,
            kind=kind,
            counter=counter,
            bound=bound,
        )
        digest = hashlib.sha256(len(aad).to_bytes(8, "big") + aad + plaintext).digest()
        same_again = counter == self.last_sent and digest == self.last_sent_digest
        if counter <= self.last_sent and not same_again:
            raise SealError(
                "nonce-reuse",
                f"{kind} of round {round_} (counter {counter}) was already sealed "
                f"with other content (last counter sent {self.last_sent}); refusing to reuse a nonce",
            )
        body = AESGCM(self._key(self.send_direction)).encrypt(_nonce(counter), plaintext, aad)
        self.last_sent, self.last_sent_digest = counter, digest
        return HEADER.pack(SEALED_MAGIC, counter) + body

    def open(self, sealed: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None) -> bytes:
        """Check and decrypt message ``kind`` of ``round_``; raise :class:`SealError` if it is not exactly that."""
        expected = message_counter(round_, kind)
        what = f"{kind} of round {round_} from {'the aggregator' if self.side == 'client' else f'client {self.client}'}"
        if not isinstance(sealed, (bytes, bytearray)):
            raise SealError("malformed", f"{what}: expected bytes, got {type(sealed).__name__}")
        if len(sealed) < HEADER.size + TAG_BYTES:
            raise SealError("truncated", f"{what}: {len(sealed)} bytes, shorter than a header and a tag")
        magic, counter = HEADER.unpack_from(sealed)
        if magic != SEALED_MAGIC:
            raise SealError("malformed", f"{what}: not a sealed message (bad magic bytes)")
        if counter <= self.last_accepted or expected <= self.last_accepted:
            raise SealError(
                "replay",
                f"{what}: counter {counter}, but counter {self.last_accepted} "
                "was already accepted (a replayed or stale message)",
            )
        if counter < expected:
            raise SealError(
                "replay",
                f"{what}: counter {counter} belongs to an earlier message than the "
                f"expected {expected} (a replayed or stale message)",
            )
        if counter > expected:
            raise SealError(
                "out-of-order",
                f"{what}: counter {counter} belongs to a later message than the expected {expected} (reordered)",
            )
        aad = associated_data(
            run_id=self.run_id,
            round_=round_,
            client=self.client,
            direction=self.receive_direction,
            kind=kind,
            counter=counter,
            bound=bound,
        )
        try:
            plaintext = AESGCM(self._key(self.receive_direction)).decrypt(
                _nonce(counter), bytes(sealed[HEADER.size :]), aad
            )
        except InvalidTag:
            raise SealError(
                "authentication",
                f"{what}: authentication failed (tampered or truncated, "
                "sealed under another key, or bound to another run/round/client/type)",
            ) from None
        self.last_accepted = counter
        return plaintext

    # -- persistence in a client's state store (tensors only)

    def to_tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        return {
            prefix + "key_up": torch.frombuffer(bytearray(self.keys.up), dtype=torch.uint8).clone(),
            prefix + "key_down": torch.frombuffer(bytearray(self.keys.down), dtype=torch.uint8).clone(),
            prefix + "ids": torch.tensor(
                [self.run_id, self.client, self.last_sent, self.last_accepted], dtype=torch.int64
            ),
            prefix + "last_sent_digest": torch.tensor(list(self.last_sent_digest), dtype=torch.uint8),
        }

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], side: str, prefix: str = "") -> Channel:
        run_id, client, last_sent, last_accepted = (int(x) for x in tensors[prefix + "ids"].tolist())
        keys = SessionKeys(
            up=bytes(tensors[prefix + "key_up"].tolist()), down=bytes(tensors[prefix + "key_down"].tolist())
        )
        digest = bytes(tensors[prefix + "last_sent_digest"].tolist()) if prefix + "last_sent_digest" in tensors else b""
        return cls(
            run_id=run_id,
            client=client,
            keys=keys,
            side=side,
            last_sent=last_sent,
            last_accepted=last_accepted,
            last_sent_digest=digest,
        )
