"""The aggregator's side of a secure-aggregation round (module docstring of ``secagg.py``): it routes key material,
sums the masked vectors and removes the masks, learning only the survivors' sum."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .masking import KEY_BYTES, SecAggError, dequantize, mask_stream, pair_mask, self_mask_context
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
from .shamir import shamir_combine


class SecAggServer:
    """The aggregator's side: routes key material, sums masked vectors, removes the masks."""

    def __init__(self, client_ids: Sequence[int], params: SecAggParams, length: int, session: bytes):
        self.params = params
        self.client_ids = check_client_ids(client_ids, params)
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise SecAggError(f"secagg server: vector length must be a positive integer, got {length!r}")
        self.length = int(length)
        self.session = check_session(session)
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
        self._keys = check_public_keys(keys, set(self.client_ids), self.params.threshold, "collect_keys")
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
        senders = id_list(list(shares), "sender id", step)
        for sender in senders:
            if sender not in self._keys:
                raise SecAggError(f"secagg {step}: shares from unknown client {sender} (it advertised no keys)")
            entry = shares[sender]
            if not isinstance(entry, Mapping):
                raise SecAggError(f"secagg {step}: shares of client {sender} must be a mapping recipient -> ciphertext")
            recipients = set(id_list(list(entry), "recipient id", f"{step}: client {sender}"))
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
        survivors = id_list(list(masked), "client id", step)
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
        why = self.params.too_few(len(survivors))
        if why:
            raise SecAggError(
                f"secagg {step}: {len(survivors)} masked inputs arrived, {why}; too many clients dropped "
                f"({sorted(set(self._u2) - set(survivors))})"
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
        responders = id_list(list(shares), "responder id", step)
        expected = set(self._survivors) | set(self._dropped)
        for responder in responders:
            if responder not in self._survivors:
                raise SecAggError(f"secagg {step}: shares from client {responder}, which is not a survivor")
            entry = shares[responder]
            if not isinstance(entry, Mapping):
                raise SecAggError(f"secagg {step}: shares of client {responder} must be a mapping owner -> share")
            extra = sorted(set(id_list(list(entry), "owner id", f"{step}: client {responder}")) - expected)
            if extra:
                raise SecAggError(f"secagg {step}: client {responder} sent shares for unknown client(s) {extra}")
        if len(responders) < self.params.threshold:
            raise SecAggError(
                f"secagg {step}: {len(responders)} clients answered, threshold is {self.params.threshold}"
            )
        assert self._masked_sum is not None
        total = self._masked_sum.copy()
        for owner in self._survivors:
            seed = self._reconstruct(owner, TAG_SELF_SEED, shares, "self-mask seed")
            if len(seed) != SEED_BYTES:
                raise SecAggError(f"secagg {step}: self-mask seed of client {owner} has {len(seed)} bytes")
            total -= mask_stream(seed, self.length, self_mask_context(self.session, owner))
        for owner in self._dropped:
            raw = self._reconstruct(owner, TAG_MASK_KEY, shares, "masking key")
            if len(raw) != KEY_BYTES:
                raise SecAggError(f"secagg {step}: masking key of client {owner} has {len(raw)} bytes")
            s_sk = X25519PrivateKey.from_private_bytes(raw)
            if public_raw(s_sk) != self._keys[owner]["s_pk"]:
                raise SecAggError(
                    f"secagg {step}: reconstructed masking key of client {owner} does not match its public key"
                )
            for survivor in self._survivors:
                # survivor i added +PRG(s_ij) if j > i, -PRG(s_ij) if j < i; remove it
                mask = pair_mask(s_sk, self._keys[survivor]["s_pk"], self.session, survivor, owner, self.length)
                if owner > survivor:
                    total -= mask
                else:
                    total += mask
        self._step = step
        return dequantize(total, self.params.scale_bits)


__all__ = ["SecAggServer"]
