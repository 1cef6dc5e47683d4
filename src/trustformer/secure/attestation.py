"""Aggregator attestation: the measurement, signed quotes, and their verification by a client.

Measurement. SHA-256 over (1) the source of the code the aggregator runs — :data:`MEASURED_FILES`
(the apps, the round loop, the wire and the aggregation rules) plus every module of ``protocols/`` and
of ``secure/``, each as its package-relative path and bytes, in sorted order — and (2) the protocol
configuration the aggregator applies (:func:`measured_config`, canonical JSON). ``trustformer attest`` prints it.

Quote. For each client the aggregator signs (Ed25519, key provisioned out of band; clients trust
its public key) the measurement, its run's fresh X25519 public key, the client's nonce and X25519
public key, the run id, the client id, the issue time and how long the quote stays valid.

Verification (:func:`verify_quote`, on the client, before it sends anything derived from its data):
the signature under the trusted key, then the nonce, the client's own key, the run id, the client
id, the validity window, and finally that the quoted measurement equals the expected one (pinned
with ``secure.expected_measurement``, or computed by the client from its own configuration and
code). Every failure is an :class:`AttestationError` that says what did not match.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..config import ConfigError, RunConfig
from ..errors import TrustformerError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
MEASURED_FILES = (
    "app.py",
    "wire.py",
    "runtime/server.py",
    "runtime/rounds.py",
    "runtime/replies.py",
    "runtime/client_nodes.py",
    "runtime/checkpoint.py",
    "core/shared.py",
    "core/aggregation.py",
    "core/dp.py",
    "core/accounting.py",
    "core/centroids.py",
    "core/ternary.py",
    "core/quantize.py",
)
MEASURED_PACKAGES = ("protocols", "secure")
QUOTE_VERSION = 1
QUOTE_DOMAIN = b"trustformer quote v1\0"
MEASUREMENT_DOMAIN = b"trustformer measurement v1\0"
CLOCK_SKEW_S = 60.0  # a quote issued up to this far in the client's future is still accepted
EMULATED_BACKEND = "software-emulation"


class AttestationError(TrustformerError, RuntimeError):
    """The aggregator's quote does not verify; the client refuses to send anything."""


def measured_sources() -> list[str]:
    """Package-relative paths of the source files in the measurement, sorted."""
    paths = set(MEASURED_FILES)
    for package in MEASURED_PACKAGES:
        paths.update(f"{package}/{p.name}" for p in (PACKAGE_ROOT / package).glob("*.py"))
    return sorted(p for p in paths if (PACKAGE_ROOT / p).exists())


def measured_config(cfg: RunConfig) -> dict[str, Any]:
    """The protocol configuration the aggregator applies (what its behaviour depends on)."""
    fed, sec = cfg.federation, cfg.secure
    values: dict[str, Any] = {
        "strategy": fed.strategy,
        "rounds": fed.rounds,
        "clients": fed.clients,
        "agg_every": fed.agg_every,
        "min_clients": fed.min_clients,
        "secure": {
            "mode": sec.mode,
            "secagg_threshold": sec.secagg_threshold,
            "secagg_scale_bits": sec.secagg_scale_bits,
        },
    }
    try:  # the strategy's own section (Trustformer's beta and weighting, FedProx's mu, ...), defaults included
        values["protocol"] = asdict(cfg.section(fed.strategy))
    except ConfigError:  # the strategy declares none
        values["protocol"] = None
    values["privacy"] = asdict(cfg.privacy)  # a DP aggregator clips, samples and adds noise from these
    values["seed"] = cfg.seed
    return values


def measurement(cfg: RunConfig) -> str:
    """The aggregator's measurement for ``cfg`` (hex SHA-256; see the module docstring)."""
    digest = hashlib.sha256(MEASUREMENT_DOMAIN)
    for rel in measured_sources():
        content = (PACKAGE_ROOT / rel).read_bytes()
        digest.update(rel.encode() + b"\0" + len(content).to_bytes(8, "big") + content)
    config = json.dumps(measured_config(cfg), sort_keys=True, separators=(",", ":")).encode()
    digest.update(b"config\0" + len(config).to_bytes(8, "big") + config)
    return digest.hexdigest()


@dataclass(frozen=True)
class Quote:
    """What the aggregator attests to one client (signed as canonical JSON)."""

    backend: str
    measurement: str
    enclave_key: str  # hex X25519 public key of this run's aggregator
    client_key: str  # hex X25519 public key the client sent
    nonce: str  # hex, the client's fresh nonce
    run_id: int
    client: int
    issued_at: float
    valid_for_s: float
    version: int = QUOTE_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, body: bytes) -> Quote:
        try:
            values = json.loads(bytes(body).decode("utf-8"))
            quote = cls(**values)
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise AttestationError(f"attestation failed: the quote is malformed ({exc})") from None
        types: dict[str, type | tuple[type, ...]] = {
            "backend": str,
            "measurement": str,
            "enclave_key": str,
            "client_key": str,
            "nonce": str,
            "run_id": int,
            "client": int,
            "issued_at": (int, float),
            "valid_for_s": (int, float),
            "version": int,
        }
        for name, kind in types.items():
            value = getattr(quote, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise AttestationError(f"attestation failed: the quote's {name} is {value!r}")
        if quote.to_bytes() != bytes(body):
            raise AttestationError("attestation failed: the quote is not in canonical form")
        return quote


def sign_quote(signing_key: Ed25519PrivateKey, quote: Quote) -> tuple[bytes, bytes]:
    """The quote's body and its Ed25519 signature."""
    body = quote.to_bytes()
    return body, signing_key.sign(QUOTE_DOMAIN + body)


def verify_quote(
    body: bytes,
    signature: bytes,
    trusted_key: Ed25519PublicKey,
    *,
    nonce: bytes,
    client_key: bytes,
    run_id: int,
    client: int,
    expected_measurement: str,
    measurement_source: str = "computed from this client's configuration",
    now: float | None = None,
) -> Quote:
    """Check a quote (signature, freshness, binding, measurement); return it or raise AttestationError."""
    try:
        trusted_key.verify(bytes(signature), QUOTE_DOMAIN + bytes(body))
    except InvalidSignature:
        raise AttestationError(
            "attestation failed: the quote's signature does not verify under the trusted attestation key "
            f"{public_key_hex(trusted_key)[:16]}… (a foreign or forged quote)"
        ) from None
    quote = Quote.from_bytes(body)
    if quote.version != QUOTE_VERSION:
        raise AttestationError(f"attestation failed: quote version {quote.version}, expected {QUOTE_VERSION}")
    if quote.nonce != nonce.hex() or quote.client_key != client_key.hex():
        raise AttestationError("attestation failed: the quote answers another nonce or client key (a replayed quote)")
    if quote.run_id != run_id:
        raise AttestationError(f"attestation failed: the quote is for run {quote.run_id}, this is run {run_id}")
    if quote.client != client:
        raise AttestationError(f"attestation failed: the quote is for client {quote.client}, this is client {client}")
    now = time.time() if now is None else now
    if quote.issued_at > now + CLOCK_SKEW_S:
        raise AttestationError(f"attestation failed: the quote is issued {quote.issued_at - now:.0f} s in the future")
    if now > quote.issued_at + quote.valid_for_s:
        raise AttestationError(
            "attestation failed: the quote expired "
            f"{now - quote.issued_at - quote.valid_for_s:.0f} s "
            f"ago (valid for {quote.valid_for_s:.0f} s)"
        )
    if quote.measurement != expected_measurement:
        raise AttestationError(
            f"attestation failed: the aggregator's measurement does not match: expected {expected_measurement} "
            f"({measurement_source}), quoted {quote.measurement}"
        )
    return quote


# ----------------------------------------------------------------------------- attestation keys


def generate_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def trusted_key_from_hex(text: str) -> Ed25519PublicKey:
    try:
        raw = bytes.fromhex(text.strip())
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise AttestationError(f"the trusted attestation key {text[:20]!r} is not 32 bytes of hex ({exc})") from None


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """The aggregator's Ed25519 private key from a PEM (PKCS#8, unencrypted) file."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except FileNotFoundError:
        raise FileNotFoundError(f"secure.signing_key: {path} does not exist") from None
    except (ValueError, TypeError) as exc:
        raise AttestationError(f"secure.signing_key: {path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AttestationError(f"secure.signing_key: {path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_trusted_key(path: str | Path) -> Ed25519PublicKey:
    """The aggregator's Ed25519 public key: a PEM file, or a file holding its 64 hex digits."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"secure.trusted_key: {path} does not exist") from None
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise AttestationError(f"secure.trusted_key: {path} is not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise AttestationError(f"secure.trusted_key: {path} holds a {type(key).__name__}, not an Ed25519 key")
        return key
    return trusted_key_from_hex(data.decode("ascii", errors="replace"))


def write_key_pair(prefix: str | Path) -> tuple[Path, Path]:
    """Write a new attestation key pair: ``PREFIX.key`` (private, mode 0600) and ``PREFIX.pub``."""
    key = generate_signing_key()
    private_path, public_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    private_path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    private_path.touch(mode=0o600, exist_ok=False)
    private_path.write_bytes(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path
