"""Shamir secret sharing over GF(2^521 - 1), as secure aggregation (``secagg.py``) uses it.

``shamir_split`` shares a secret of up to 64 bytes so that any ``threshold`` shares recover it;
``shamir_combine`` recovers it and checks the shares (threshold, length, consistency). Each share
carries its threshold, the secret's length and its share id.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from .masking import SecAggError

__all__ = ["FIELD_PRIME", "shamir_combine", "shamir_split"]

FIELD_PRIME = 2**521 - 1  # Mersenne prime; field elements fit in 66 bytes
_FIELD_BYTES = 66
_MAX_ID = 2**64 - 1
_SHARE_MAGIC = b"S"
_SHARE_HEADER = struct.Struct(">cHBQ")  # magic, threshold, secret length, share id
_SHARE_BYTES = _SHARE_HEADER.size + _FIELD_BYTES


def check_ids(ids: Sequence[int], what: str) -> list[int]:
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) <= _MAX_ID:
            raise SecAggError(f"secagg: {what} {i!r} is not an integer in [0, 2**64)")
        out.append(int(i))
    if len(set(out)) != len(out):
        raise SecAggError(f"secagg: duplicate {what}s in {sorted(out)}")
    return out


def shamir_split(secret: bytes, threshold: int, share_ids: Sequence[int]) -> dict[int, bytes]:
    """Shamir-share ``secret`` (<= 64 bytes) so that any ``threshold`` of the shares recover it.

    Share ``i`` is the random degree-(t-1) polynomial evaluated at ``x = i + 1`` over
    GF(2^521 - 1), encoded with threshold, secret length and share id so that
    ``shamir_combine`` can check them.
    """
    if not isinstance(secret, (bytes, bytearray)) or not 1 <= len(secret) <= 64:
        raise SecAggError("secagg shamir_split: secret must be 1..64 bytes")
    ids = check_ids(share_ids, "share id")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= len(ids):
        raise SecAggError(
            f"secagg shamir_split: threshold {threshold!r} must be in [1, {len(ids)}] for {len(ids)} shares"
        )
    if threshold > 0xFFFF:
        raise SecAggError(f"secagg shamir_split: threshold {threshold} exceeds 65535")
    # Coefficients come from the OS CSPRNG, not from the config seed: a seeded (reproducible)
    # polynomial would let anyone who knows the config recompute the secret from one share.
    coefficients = [int.from_bytes(secret, "big")] + [secrets.randbelow(FIELD_PRIME) for _ in range(threshold - 1)]
    shares = {}
    for i in ids:
        x = i + 1
        y = 0
        for c in reversed(coefficients):
            y = (y * x + c) % FIELD_PRIME
        shares[i] = _SHARE_HEADER.pack(_SHARE_MAGIC, threshold, len(secret), i) + y.to_bytes(_FIELD_BYTES, "big")
    return shares


def parse_share(share_id: int, share: bytes) -> tuple[int, int, int]:
    if not isinstance(share, (bytes, bytearray)) or len(share) != _SHARE_BYTES:
        raise SecAggError(f"secagg shamir_combine: share {share_id} is not a {_SHARE_BYTES}-byte share")
    magic, threshold, secret_len, labelled = _SHARE_HEADER.unpack_from(share)
    if magic != _SHARE_MAGIC:
        raise SecAggError(f"secagg shamir_combine: share {share_id} has an unknown format")
    if labelled != share_id:
        raise SecAggError(f"secagg shamir_combine: share given as id {share_id} is labelled id {labelled}")
    y = int.from_bytes(share[_SHARE_HEADER.size :], "big")
    if y >= FIELD_PRIME or threshold < 1 or not 1 <= secret_len <= 64:
        raise SecAggError(f"secagg shamir_combine: share {share_id} is malformed")
    return threshold, secret_len, y


def _interpolate(points: Sequence[tuple[int, int]], at: int) -> int:
    """Lagrange interpolation over GF(p) of the polynomial through ``points`` evaluated at ``at``."""
    total = 0
    for k, (xk, yk) in enumerate(points):
        num, den = 1, 1
        for m, (xm, _) in enumerate(points):
            if m != k:
                num = num * (at - xm) % FIELD_PRIME
                den = den * (xk - xm) % FIELD_PRIME
        total = (total + yk * num * pow(den, -1, FIELD_PRIME)) % FIELD_PRIME
    return total


def shamir_combine(shares: Mapping[int, bytes]) -> bytes:
    """Recover the secret from ``{share_id: share}``.

    Each share carries its threshold t, so fewer than t shares raise SecAggError (the
    interpolation through fewer points would give an unrelated value). With more than t shares the
    extra ones must lie on the same polynomial, otherwise the shares are inconsistent
    (SecAggError). Shares with different thresholds or secret lengths, or a reconstruction that
    does not fit the secret length, also raise SecAggError.
    """
    if not isinstance(shares, Mapping) or not shares:
        raise SecAggError("secagg shamir_combine: no shares given")
    ids = check_ids(list(shares), "share id")
    parsed = {i: parse_share(i, shares[i]) for i in ids}
    thresholds = {t for t, _, _ in parsed.values()}
    lengths = {n for _, n, _ in parsed.values()}
    if len(thresholds) != 1 or len(lengths) != 1:
        raise SecAggError(
            f"secagg shamir_combine: inconsistent shares (thresholds {sorted(thresholds)}, "
            f"secret lengths {sorted(lengths)})"
        )
    threshold, secret_len = thresholds.pop(), lengths.pop()
    if len(ids) < threshold:
        raise SecAggError(f"secagg shamir_combine: {len(ids)} shares given, {threshold} needed")
    points = [(i + 1, parsed[i][2]) for i in sorted(ids)]
    basis, extra = points[:threshold], points[threshold:]
    for x, y in extra:
        if _interpolate(basis, x) != y:
            raise SecAggError(f"secagg shamir_combine: share {x - 1} is inconsistent with the others")
    secret = _interpolate(basis, 0)
    if secret >= 2 ** (8 * secret_len):
        raise SecAggError("secagg shamir_combine: shares do not reconstruct a valid secret (wrong or tampered shares)")
    return secret.to_bytes(secret_len, "big")
