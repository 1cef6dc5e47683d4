"""A safe binary format for named arrays (what sealed messages carry): no pickle, nothing executed.

Layout (all integers little-endian)::

    b"TFA1" | header length (u32) | header (canonical JSON, ASCII) | body | SHA-256 of everything before

The header is ``{"arrays": [{"dtype": ..., "name": ..., "shape": [...]}, ...]}`` written with sorted
keys and no spaces; the body is every array's raw little-endian bytes (C order), in header order.

:func:`decode` accepts only an exact re-encoding of what it returns: the header must be canonical,
dtypes come from an allow-list, shapes are bounded, the body has exactly the bytes the header
announces, the digest matches, floats are finite, and — when the receiver says what it expects —
names, shapes and dtypes are exactly those. Anything else raises :class:`CodecError` (a
:class:`~trustformer.wire.PayloadError`), and nothing else: a receiver needs to catch one error type.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping

import numpy as np
import torch

from ..wire import PayloadError, TensorSpec

MAGIC = b"TFA1"
DIGEST_BYTES = 32
ALLOWED_DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8", "uint64")
MAX_HEADER_BYTES = 4 << 20
MAX_ARRAYS = 100_000
MAX_NDIM = 8
MAX_NAME_CHARS = 512
MAX_BODY_BYTES = 8 << 30  # an upper bound on any payload this framework exchanges (the paper model is ~0.5 GB)


class CodecError(PayloadError):
    """An encoded payload is malformed, inconsistent, or not what the receiver expects."""


def encode(arrays: Mapping[str, torch.Tensor | np.ndarray]) -> bytes:
    """Encode named tensors/arrays (order kept); refuses dtypes outside :data:`ALLOWED_DTYPES`."""
    entries, chunks = [], []
    for name, value in arrays.items():
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        dtype = str(array.dtype)
        if dtype not in ALLOWED_DTYPES:
            raise CodecError(f"array {name!r}: dtype {dtype} cannot be encoded (allowed: {', '.join(ALLOWED_DTYPES)})")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise CodecError(f"array name {name!r} must be a non-empty string of at most {MAX_NAME_CHARS} characters")
        entries.append({"dtype": dtype, "name": name, "shape": [int(d) for d in array.shape]})
        chunks.append(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    header = _canonical({"arrays": entries})
    framed = MAGIC + struct.pack("<I", len(header)) + header + b"".join(chunks)
    return framed + hashlib.sha256(framed).digest()


def decode_arrays(data: bytes, expected: TensorSpec | None = None, *, what: str = "payload") -> dict[str, np.ndarray]:
    """Decode to numpy arrays, validating everything (see the module docstring)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"{what}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    prefix = len(MAGIC) + 4
    if len(data) < prefix + DIGEST_BYTES:
        raise CodecError(f"{what}: {len(data)} bytes is too short to be an encoded payload")
    if data[: len(MAGIC)] != MAGIC:
        raise CodecError(f"{what}: not an encoded payload (bad magic bytes)")
    (header_len,) = struct.unpack("<I", data[len(MAGIC) : prefix])
    if header_len > MAX_HEADER_BYTES or prefix + header_len + DIGEST_BYTES > len(data):
        raise CodecError(f"{what}: header length {header_len} does not fit the {len(data)} bytes received")
    framed, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if hashlib.sha256(framed).digest() != digest:
        raise CodecError(f"{what}: digest mismatch (truncated, extended or corrupted)")
    header_bytes = data[prefix : prefix + header_len]
    entries = _parse_header(header_bytes, what)
    body = memoryview(framed)[prefix + header_len :]
    sizes = []
    for entry in entries:
        count = math.prod(entry["shape"])
        sizes.append(count * np.dtype(entry["dtype"]).itemsize)
    if sum(sizes) > MAX_BODY_BYTES:
        raise CodecError(f"{what}: the header announces {sum(sizes)} bytes of arrays (limit {MAX_BODY_BYTES})")
    if sum(sizes) != len(body):
        raise CodecError(f"{what}: the header announces {sum(sizes)} bytes of arrays, the body has {len(body)}")
    if expected is not None:
        _check_expected(entries, expected, what)
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for entry, size in zip(entries, sizes, strict=True):
        dtype = np.dtype(entry["dtype"]).newbyteorder("<")
        array = np.frombuffer(body[offset : offset + size], dtype=dtype).astype(np.dtype(entry["dtype"]), copy=True)
        array = array.reshape(entry["shape"])
        offset += size
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise CodecError(f"{what}: array {entry['name']!r} contains NaN or Inf")
        arrays[entry["name"]] = array
    return arrays


def decode(data: bytes, expected: TensorSpec | None = None, *, what: str = "payload") -> dict[str, torch.Tensor]:
    """Decode to torch tensors (see :func:`decode_arrays`)."""
    return {name: torch.from_numpy(a) for name, a in decode_arrays(data, expected, what=what).items()}


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _parse_header(header_bytes: bytes, what: str) -> list[dict]:
    try:
        header = json.loads(header_bytes.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CodecError(f"{what}: header is not ASCII JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"arrays"} or not isinstance(header["arrays"], list):
        raise CodecError(f"{what}: header must be an object with exactly one key 'arrays' holding a list")
    entries = header["arrays"]
    if len(entries) > MAX_ARRAYS:
        raise CodecError(f"{what}: {len(entries)} arrays (limit {MAX_ARRAYS})")
    names = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"dtype", "name", "shape"}:
            raise CodecError(f"{what}: header entry {i} must have exactly the keys dtype, name, shape")
        name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise CodecError(f"{what}: header entry {i}: bad array name {name!r}")
        if name in names:
            raise CodecError(f"{what}: array name {name!r} appears twice")
        names.add(name)
        if dtype not in ALLOWED_DTYPES:
            raise CodecError(f"{what}: array {name!r}: dtype {dtype!r} is not allowed ({', '.join(ALLOWED_DTYPES)})")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_NDIM
            or not all(type(d) is int and 0 <= d <= MAX_BODY_BYTES for d in shape)
        ):
            raise CodecError(f"{what}: array {name!r}: bad shape {shape!r}")
    if _canonical(header) != header_bytes:
        raise CodecError(f"{what}: header is not in canonical form")
    return entries


def _check_expected(entries: list[dict], expected: TensorSpec, what: str) -> None:
    got = {e["name"]: (tuple(e["shape"]), e["dtype"]) for e in entries}
    missing = [n for n in expected if n not in got]
    extra = [n for n in got if n not in expected]
    if missing or extra:
        raise CodecError(f"{what}: missing arrays {missing[:5]}, unexpected arrays {extra[:5]}")
    for name, (shape, dtype) in expected.items():
        if got[name] != (tuple(shape), dtype):
            raise CodecError(
                f"{what}: array {name!r} has shape {got[name][0]} dtype {got[name][1]}, "
                f"expected shape {tuple(shape)} dtype {dtype}"
            )
