"""What the round loop needs from a trusted execution environment, and a software emulation of it.

:class:`TEEBackend` is the interface: the aggregator's measurement, a signed quote per client nonce
(which also opens that client's sealed session), opening a client's sealed message, running the
protocol's aggregation, and sealing a message for one client. :class:`SoftwareTEE` implements it
inside the server process. It is an **emulation**, labelled as such in logs, ``summary.json`` and
docs/privacy.md: it gives clients a real protocol to check (signed quotes, fresh keys, AES-GCM sessions)
but none of the hardware guarantees. In particular it does not protect against the machine that
runs the server: that process holds the session keys and sees every opened payload, and the
attestation signing key is a file (or, in-process, a key generated for the run), not a key fused
into a CPU. Its measurement is a hash the process computes over its own source files, so a modified
server could report the expected value.

A real backend must provide, in addition to this interface:

- a measurement produced by the hardware/firmware over the code actually loaded (SGX MRENCLAVE via
  Gramine's manifest; a confidential VM's launch measurement in an SEV-SNP report or TDX quote,
  extended by a vTPM's PCRs for the OS and this package);
- quotes signed by a key only the hardware holds, with a certificate chain to the vendor (Intel
  DCAP/PCS, AMD KDS) that clients verify instead of a provisioned Ed25519 key, and the run's X25519
  public key and the client's nonce in the report data;
- session keys, opened payloads and the aggregate kept in enclave memory: ``open``, the payload
  checks, ``aggregate`` and ``seal`` must run inside the enclave, the host only moving ciphertexts
  (the emulation returns opened payloads to the host round loop, which only an emulation may do).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .attestation import EMULATED_BACKEND, AttestationError, Quote, public_key_hex, sign_quote
from .sealing import Channel, SealError, derive_session_keys

NONCE_BYTES = 32
X25519_BYTES = 32


class TEEBackend(Protocol):
    """The enclave operations the aggregator's round loop uses."""

    name: str
    emulated: bool

    def measurement(self) -> str:
        """Hex digest identifying the code and protocol configuration the enclave runs."""
        ...

    def quote(self, client: int, nonce: bytes, client_key: bytes) -> tuple[bytes, bytes]:
        """A signed quote (body, signature) answering ``client``'s nonce; opens the client's session."""
        ...

    def has_session(self, client: int) -> bool: ...

    def open(self, client: int, sealed: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None) -> bytes:
        """Check and decrypt a message sealed by ``client`` (raises :class:`SealError`)."""
        ...

    def aggregate(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run the protocol's aggregation on opened payloads (inside the enclave)."""
        ...

    def seal(
        self, client: int, plaintext: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None
    ) -> bytes:
        """Encrypt and authenticate a message for ``client``."""
        ...


class SoftwareTEE:
    """:class:`TEEBackend` emulated in the server process (see the module docstring for its limits)."""

    name = EMULATED_BACKEND
    emulated = True

    def __init__(
        self,
        signing_key: Ed25519PrivateKey,
        measurement: str,
        run_id: int,
        *,
        quote_validity_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._signing_key = signing_key
        self._measurement = measurement
        self._run_id = run_id
        self._validity = quote_validity_s
        self._clock = clock
        self._kex = X25519PrivateKey.from_private_bytes(os.urandom(X25519_BYTES))  # fresh for this run
        self._channels: dict[int, Channel] = {}

    def measurement(self) -> str:
        return self._measurement

    @property
    def public_key(self) -> bytes:
        return self._kex.public_key().public_bytes_raw()

    @property
    def attestation_key(self) -> str:
        return public_key_hex(self._signing_key)

    def quote(self, client: int, nonce: bytes, client_key: bytes) -> tuple[bytes, bytes]:
        if len(nonce) != NONCE_BYTES:
            raise AttestationError(
                f"attestation: client {client} sent a {len(nonce)}-byte nonce, expected {NONCE_BYTES}"
            )
        if len(client_key) != X25519_BYTES:
            raise AttestationError(
                f"attestation: client {client} sent a {len(client_key)}-byte key, expected {X25519_BYTES}"
            )
        try:
            shared = self._kex.exchange(X25519PublicKey.from_public_bytes(client_key))
        except ValueError as exc:
            raise AttestationError(f"attestation: client {client}'s X25519 key is unusable ({exc})") from None
        keys = derive_session_keys(
            shared, run_id=self._run_id, client=client, transcript=nonce + client_key + self.public_key
        )
        self._channels[client] = Channel(run_id=self._run_id, client=client, keys=keys, side="server")
        quote = Quote(
            backend=self.name,
            measurement=self._measurement,
            enclave_key=self.public_key.hex(),
            client_key=client_key.hex(),
            nonce=nonce.hex(),
            run_id=self._run_id,
            client=client,
            issued_at=round(self._clock(), 3),
            valid_for_s=self._validity,
        )
        return sign_quote(self._signing_key, quote)

    def has_session(self, client: int) -> bool:
        return client in self._channels

    def _channel(self, client: int) -> Channel:
        try:
            return self._channels[client]
        except KeyError:
            raise SealError("no-session", f"client {client} has no attested session with the aggregator") from None

    def open(self, client: int, sealed: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None) -> bytes:
        return self._channel(client).open(sealed, round_=round_, kind=kind, bound=bound)

    def aggregate(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def seal(
        self, client: int, plaintext: bytes, *, round_: int, kind: str, bound: dict[str, Any] | None = None
    ) -> bytes:
        return self._channel(client).seal(plaintext, round_=round_, kind=kind, bound=bound)

    def clients(self) -> Sequence[int]:
        return sorted(self._channels)
