"""Fixed-point encoding and mask generation of secure aggregation (``secagg.py``).

Values are fixed-point: ``q = round(x * 2**scale_bits)`` as two's complement in Z_{2^64}. The only
error of an aggregated sum is that rounding (see ``quantization_error_bound``); masks cancel exactly.
Mask seeds and keys come from HKDF-SHA256 with info binding purpose, session and client ids; a seed
expands into a mask by an AES-256-CTR keystream (``mask_stream``). ``SecAggError``, the error of every
secure-aggregation step, is defined here, in the lowest of the secagg modules.
"""

from __future__ import annotations

import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import TrustformerError

__all__ = ["SecAggError", "dequantize", "mask_stream", "quantization_error_bound", "quantize"]

KEY_BYTES = 32
_RANGE_LIMIT = 2**62
DOMAIN = b"trustformer/secagg/v1/"


class SecAggError(TrustformerError, ValueError):
    """A secure-aggregation step failed; the message names the client and the step."""


# ---------------------------------------------------------------------------------------------
# fixed point


def check_scale_bits(scale_bits: int) -> None:
    if isinstance(scale_bits, bool) or not isinstance(scale_bits, int) or not 0 <= scale_bits <= 60:
        raise SecAggError(f"secagg scale_bits must be an integer in [0, 60], got {scale_bits!r}")


def quantize(x: np.ndarray, scale_bits: int, num_clients: int = 1) -> np.ndarray:
    """Fixed-point encode ``round(x * 2**scale_bits)`` as two's complement uint64 (mod 2^64).

    Refuses NaN/Inf and values with ``|x| * 2**scale_bits * num_clients >= 2**62``, so that a sum
    over ``num_clients`` inputs cannot wrap around.
    """
    check_scale_bits(scale_bits)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise SecAggError(f"secagg quantize: num_clients must be a positive integer, got {num_clients!r}")
    values = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise SecAggError(f"secagg quantize: input has {int(np.count_nonzero(~np.isfinite(values)))} NaN/Inf values")
    limit = _RANGE_LIMIT / (2.0**scale_bits * num_clients)
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    if largest >= limit:
        raise SecAggError(
            f"secagg quantize: value {largest:g} is too large for the fixed-point range: need "
            f"|x| * 2**{scale_bits} * {num_clients} clients < 2**62, i.e. |x| < {limit:g}"
        )
    return np.rint(values * 2.0**scale_bits).astype(np.int64).view(np.uint64)


def dequantize(q: np.ndarray, scale_bits: int) -> np.ndarray:
    """Decode uint64 fixed-point values (two's complement) back to signed float64."""
    check_scale_bits(scale_bits)
    arr = np.asarray(q)
    if arr.dtype != np.uint64:
        raise SecAggError(f"secagg dequantize: expected uint64 values, got dtype {arr.dtype}")
    return arr.view(np.int64).astype(np.float64) / 2.0**scale_bits


def quantization_error_bound(num_clients: int, scale_bits: int) -> float:
    """Max abs error per coordinate of the SUM of ``num_clients`` quantised vectors.

    Each input is rounded to the grid ``2**-scale_bits`` (error <= 0.5 * 2**-scale_bits), masks
    cancel exactly, so the sum is off by at most ``num_clients * 0.5 / 2**scale_bits`` (plus the
    float64 rounding of the result itself, relative 2**-53). A uniform mean divides the sum by
    ``num_clients``, so its error is at most ``0.5 / 2**scale_bits``; a weighted mean computed as
    ``sum(w_i * x_i) / sum(w_i)`` (clients pre-scale by w_i) is off by at most this bound divided
    by ``sum(w_i)``.
    """
    check_scale_bits(scale_bits)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise SecAggError(f"secagg: num_clients must be a positive integer, got {num_clients!r}")
    return num_clients * 0.5 / 2.0**scale_bits


# ---------------------------------------------------------------------------------------------
# key derivation and mask PRG


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def lp(data: bytes) -> bytes:
    """Length-prefixed bytes, so concatenated fields cannot be confused."""
    return struct.pack(">I", len(data)) + data


def derive_key(secret: bytes, purpose: bytes, session: bytes, *ids: int) -> bytes:
    """HKDF-SHA256 of ``secret`` with info binding purpose, session and client ids."""
    info = DOMAIN + lp(purpose) + lp(session) + b"".join(u64(i) for i in ids)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def mask_stream(seed: bytes, length: int, context: bytes) -> np.ndarray:
    """PRG expanding ``seed`` into ``length`` uint64 values: AES-256-CTR keystream.

    The AES key is HKDF-SHA256(seed, info=context), so one seed gives independent streams for
    different contexts (e.g. sessions); the counter starts at zero under each derived key.
    """
    if not isinstance(seed, (bytes, bytearray)) or len(seed) < 16:
        raise SecAggError("secagg mask_stream: seed must be at least 16 bytes")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise SecAggError(f"secagg mask_stream: length must be a non-negative integer, got {length!r}")
    if not isinstance(context, (bytes, bytearray)):
        raise SecAggError("secagg mask_stream: context must be bytes")
    key = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=DOMAIN + b"prg" + bytes(context)).derive(
        bytes(seed)
    )
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    stream = bytearray(encryptor.update(bytes(8 * int(length))) + encryptor.finalize())
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64, copy=False)


def self_mask_context(session: bytes, owner: int) -> bytes:
    return b"self" + lp(session) + u64(owner)


def _pair_mask_context(session: bytes, a: int, b: int) -> bytes:
    return b"pair" + lp(session) + u64(min(a, b)) + u64(max(a, b))


def agree(private: X25519PrivateKey, public_raw: bytes) -> bytes:
    return private.exchange(X25519PublicKey.from_public_bytes(public_raw))


def _pair_seed(shared: bytes, session: bytes, a: int, b: int) -> bytes:
    return derive_key(shared, b"pair-mask", session, min(a, b), max(a, b))


def pair_mask(private: X25519PrivateKey, public_raw: bytes, session: bytes, a: int, b: int, length: int) -> np.ndarray:
    seed = _pair_seed(agree(private, public_raw), session, a, b)
    return mask_stream(seed, length, _pair_mask_context(session, a, b))
