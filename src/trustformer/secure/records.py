"""The secure channel's records, as both of its ends build and read them (``mod.py`` on the client,
``channel.py`` on the server): a ``secure`` ConfigRecord holding the codec bytes of named arrays, sealed
(``{"sealed": bytes}``, ``tee``) or not (``{"data": bytes}``), and the secure-aggregation parameters."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from ..config import RunConfig
from ..wire import TensorSpec
from . import codec
from .secagg_common import SecAggParams

ATTEST, SECAGG = "query.attest", "query.secagg"  # the channel's own message types
SECURE = "secure"  # message content key of a secure record: {"data": codec bytes} or {"sealed": sealed bytes}
SEALED_METRICS = "metrics.json"  # tee: a reply's metrics (JSON, uint8) inside its sealed record
CLEAR_METRICS = ("client", "round", "num_examples")  # what a sealed reply still says in clear
MODEL_KIND = "train.model"  # what a model sent down in a train message is sealed as


def secagg_threshold(cfg: RunConfig) -> int:
    """Shares needed to unmask: ``secure.secagg_threshold``, or a majority of the clients (at least 2)."""
    return cfg.secure.secagg_threshold or max(2, cfg.federation.clients // 2 + 1)


def secagg_params(cfg: RunConfig) -> SecAggParams:
    """The run's secure-aggregation parameters, the same on both sides. Distributed noise (``privacy.noise``) adds
    the fewest survivors a client agrees to unmask: the round's participants less ``privacy.dropout_tolerance``."""
    fed, p = cfg.federation, cfg.privacy
    floor = (fed.clients_per_round or fed.clients) - p.dropout_tolerance if p.noise == "distributed" else 0
    return SecAggParams(
        threshold=secagg_threshold(cfg), scale_bits=cfg.secure.secagg_scale_bits, min_survivors=max(floor, 0)
    )


def secagg_session(run_id: int, rnd: int) -> bytes:
    return f"trustformer/secagg|run={run_id}|round={rnd}".encode()


def pack(arrays: Mapping[str, Any], seal: Callable[[bytes], bytes] | None) -> ConfigRecord:
    data = codec.encode(arrays)
    return ConfigRecord({"sealed": seal(data)} if seal is not None else {"data": data})


def unpack(
    content: RecordDict, open_: Callable[[bytes], bytes] | None, expected: TensorSpec | None, what: str
) -> dict[str, np.ndarray]:
    """The arrays of a message's secure record (opened first when sealed); PayloadError otherwise."""
    if SECURE not in content:
        raise codec.CodecError(f"{what}: the message has no {SECURE!r} record")
    record = content[SECURE]
    key = "sealed" if open_ is not None else "data"
    if not isinstance(record, ConfigRecord) or set(record) != {key}:
        raise codec.CodecError(f"{what}: the {SECURE!r} record must hold exactly {key!r}")
    data = record[key]
    if not isinstance(data, bytes):
        raise codec.CodecError(f"{what}: {key!r} is not bytes")
    if open_ is not None:
        data = open_(data)
    return codec.decode_arrays(data, expected, what=what)


def bytes_array(data: bytes) -> np.ndarray:
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def id_keyed(arrays: Mapping[str, np.ndarray], what: str) -> dict[int, bytes]:
    """``{"<id>": uint8 array}`` -> ``{id: bytes}``, rejecting anything else."""
    out = {}
    for name, array in arrays.items():
        if not name.isdigit() or array.dtype != np.uint8 or array.ndim != 1:
            raise codec.CodecError(f"{what}: entry {name!r} must be a client id holding a 1-D uint8 array")
        out[int(name)] = array.tobytes()
    return out


def spec_json(spec: TensorSpec) -> bytes:
    return json.dumps([[n, list(s), d] for n, (s, d) in sorted(spec.items())], separators=(",", ":")).encode()


def parse_spec(data: bytes, what: str) -> TensorSpec:
    try:
        items = json.loads(data.decode("ascii"))
        spec = {str(n): (tuple(int(x) for x in s), str(d)) for n, s, d in items}
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise codec.CodecError(f"{what}: payload spec is malformed ({exc})") from None
    if not spec or any(d != "float32" or any(x < 1 for x in s) for s, d in spec.values()):
        raise codec.CodecError(f"{what}: payload spec must name float32 arrays with positive dimensions")
    return spec


def spec_length(spec: TensorSpec) -> int:
    return int(sum(int(np.prod(shape)) for shape, _ in spec.values()))


__all__ = [
    "ATTEST",
    "CLEAR_METRICS",
    "MODEL_KIND",
    "SEALED_METRICS",
    "SECAGG",
    "SECURE",
    "bytes_array",
    "id_keyed",
    "pack",
    "parse_spec",
    "secagg_session",
    "secagg_threshold",
    "spec_json",
    "spec_length",
    "unpack",
]
