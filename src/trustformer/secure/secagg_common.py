"""What both sides of secure aggregation share (module docstring of ``secagg.py``): the parameters, the share
tags, and the checks of client ids, sessions and advertised public keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .masking import KEY_BYTES, SecAggError, check_scale_bits
from .shamir import check_ids

SEED_BYTES = 32
TAG_SELF_SEED = b"b"
TAG_MASK_KEY = b"s"


@dataclass(frozen=True)
class SecAggParams:
    """Threshold t (shares needed to reconstruct a secret) and fixed-point scale of the inputs; ``min_survivors``:
    the fewest survivors whose sum a client agrees to unmask (distributed noise: the inputs carry shares of the
    noise, and fewer than this many shares are too little noise; 0 = t is enough)."""

    threshold: int
    scale_bits: int = 24
    min_survivors: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 2:
            raise SecAggError(f"secagg threshold must be an integer >= 2, got {self.threshold!r}")
        if not isinstance(self.min_survivors, int) or self.min_survivors < 0:
            raise SecAggError(f"secagg min_survivors must be an integer >= 0, got {self.min_survivors!r}")
        check_scale_bits(self.scale_bits)

    def too_few(self, survivors: int) -> str | None:
        """Why a sum of ``survivors`` inputs must not be unmasked (None: it may)."""
        if survivors < self.threshold:
            return f"threshold is {self.threshold}"
        if survivors < self.min_survivors:
            return (
                f"fewer than the {self.min_survivors} whose noise shares make the privacy guarantee "
                "(privacy.dropout_tolerance)"
            )
        return None


# ---------------------------------------------------------------------------------------------
# validation helpers shared by client and server


def check_session(session: bytes) -> bytes:
    if not isinstance(session, (bytes, bytearray)) or not session:
        raise SecAggError("secagg: session must be non-empty bytes binding run id and round")
    return bytes(session)


def check_client_ids(client_ids: Sequence[int], params: SecAggParams) -> list[int]:
    if not isinstance(params, SecAggParams):
        raise SecAggError(f"secagg: params must be SecAggParams, got {type(params).__name__}")
    ids = sorted(check_ids(list(client_ids), "client id"))
    if len(ids) < 2:
        raise SecAggError(f"secagg needs at least 2 clients, got {len(ids)}")
    if params.threshold > len(ids):
        raise SecAggError(f"secagg threshold {params.threshold} exceeds the number of clients {len(ids)}")
    return ids


def check_public_keys(
    keys: Mapping[int, Mapping[str, bytes]], known: set[int], threshold: int, step: str
) -> dict[int, dict[str, bytes]]:
    if not isinstance(keys, Mapping):
        raise SecAggError(f"secagg {step}: public keys must be a mapping client -> keys")
    out: dict[int, dict[str, bytes]] = {}
    seen: dict[bytes, int] = {}
    for client, entry in keys.items():
        (cid,) = id_list([client], "client id", step)
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


def id_list(values: Sequence[int], what: str, step: str) -> list[int]:
    try:
        return sorted(check_ids(list(values), what))
    except SecAggError as err:
        raise SecAggError(f"secagg {step}: {str(err).removeprefix('secagg: ')}") from None


def public_raw(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


__all__ = ["SEED_BYTES", "SecAggParams"]
