"""The safe payload codec: exact round trips, and nothing but CodecError on malformed input."""

import hashlib
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trustformer.secure import codec
from trustformer.secure.codec import CodecError, decode, decode_arrays, encode
from trustformer.wire import PayloadError, spec_of

PAYLOAD = {
    "encoder.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
    "encoder.bias": torch.tensor([0.5, -1.25], dtype=torch.float32),
    "indices": torch.tensor([3, 1, 4], dtype=torch.int64),
    "scalar": torch.tensor(2.0, dtype=torch.float64),
}


def frame(header: bytes, body: bytes) -> bytes:
    """A frame with a valid digest around any header and body (to reach the parser's checks)."""
    framed = codec.MAGIC + struct.pack("<I", len(header)) + header + body
    return framed + hashlib.sha256(framed).digest()


def header_of(entries) -> bytes:
    return json.dumps({"arrays": entries}, sort_keys=True, separators=(",", ":")).encode()


def test_round_trip_keeps_names_order_dtypes_values():
    out = decode(encode(PAYLOAD), spec_of(PAYLOAD))
    assert list(out) == list(PAYLOAD)
    for name, tensor in PAYLOAD.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_uint64_and_empty_arrays_round_trip():
    arrays = {"masked": np.array([0, 1, 2**64 - 1], dtype=np.uint64), "empty": np.zeros((0, 3), dtype=np.float32)}
    out = decode_arrays(encode(arrays))
    assert out["masked"].dtype == np.uint64 and out["masked"].tolist() == [0, 1, 2**64 - 1]
    assert out["empty"].shape == (0, 3)


def test_expected_spec_mismatches_are_rejected():
    data = encode(PAYLOAD)
    spec = spec_of(PAYLOAD)
    with pytest.raises(CodecError, match="missing arrays"):
        decode(data, {**spec, "extra": ((1,), "float32")})
    with pytest.raises(CodecError, match="unexpected arrays"):
        decode(data, {k: v for k, v in spec.items() if k != "scalar"})
    with pytest.raises(CodecError, match="expected shape"):
        decode(data, {**spec, "encoder.bias": ((3,), "float32")})
    with pytest.raises(CodecError, match="dtype"):
        decode(data, {**spec, "indices": ((3,), "int32")})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_are_rejected(bad):
    data = encode({"x": torch.tensor([1.0, bad])})
    with pytest.raises(CodecError, match="NaN or Inf"):
        decode(data)


def test_malformed_frames_each_have_a_clear_error():
    good = encode(PAYLOAD)
    body = np.arange(2, dtype="<f4").tobytes()
    entry = {"dtype": "float32", "name": "x", "shape": [2]}
    cases = [
        ("too short", b"TFA1"),
        ("bad magic", b"XXXX" + good[4:]),
        ("digest mismatch", good[:-40] + good[-39:]),  # one byte of the body cut out
        ("digest mismatch", good + b"\0"),  # a trailing byte
        ("does not fit", good[:8] + b"\0" * 40),
        ("not ASCII JSON", frame(b"\xff\xfe", b"")),
        ("exactly one key", frame(header_of([entry])[:-1] + b',"more":1}', body)),
        ("bad array name", frame(header_of([{**entry, "name": ""}]), body)),
        ("appears twice", frame(header_of([entry, entry]), body + body)),
        ("is not allowed", frame(header_of([{**entry, "dtype": "object"}]), body)),
        ("bad shape", frame(header_of([{**entry, "shape": [-2]}]), body)),
        ("the body has", frame(header_of([entry]), body + b"\0\0\0\0")),
        ("the body has", frame(header_of([entry]), body[:-1])),
        ("limit", frame(header_of([{**entry, "shape": [2**31, 2**31]}]), body)),
        ("canonical", frame(json.dumps({"arrays": [entry]}).encode(), body)),
    ]
    for expected, data in cases:
        with pytest.raises(CodecError, match=expected):
            decode(data)


def test_codec_error_is_a_payload_error_and_there_is_no_pickle():
    assert issubclass(CodecError, PayloadError)
    with pytest.raises(CodecError, match="cannot be encoded"):
        encode({"x": np.array([object()], dtype=object)})
    package = Path(codec.__file__).parent
    for module in package.glob("*.py"):  # nothing in the secure exchange can unpickle what it receives
        assert not re.search(r"import pickle|pickle\.|torch\.load|np\.load|allow_pickle=True", module.read_text()), (
            module
        )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_ever_raise_codec_error(data):
    try:
        decode_arrays(data)
    except CodecError:
        return
    raise AssertionError("random bytes were accepted")  # pragma: no cover (a 2^-256 digest collision)


@st.composite
def payloads(draw):
    names = draw(
        st.lists(
            st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=8),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(codec.ALLOWED_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        size = int(np.prod(shape))
        if np.dtype(dtype).kind == "f":
            values = draw(
                st.lists(st.floats(-1e4, 1e4, width=16 if dtype == "float16" else 32), min_size=size, max_size=size)
            )
        else:
            info = np.iinfo(dtype)
            values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size))
        out[name] = np.array(values, dtype=dtype).reshape(shape)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads(), st.data())
def test_mutated_encodings_are_rejected_never_accepted_as_another_payload(arrays, data):
    encoded = encode(arrays)
    decoded = decode_arrays(encoded, spec_of(arrays))
    assert list(decoded) == list(arrays)
    assert all(np.array_equal(decoded[n], arrays[n]) and decoded[n].dtype == arrays[n].dtype for n in arrays)
    kind = data.draw(st.sampled_from(["flip", "cut", "append", "splice"]))
    mutated = bytearray(encoded)
    if kind == "flip":
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "cut":
        i = data.draw(st.integers(0, len(mutated) - 1))
        del mutated[i : i + data.draw(st.integers(1, 8))]
    elif kind == "append":
        mutated += data.draw(st.binary(min_size=1, max_size=8))
    else:
        i = data.draw(st.integers(0, len(mutated)))
        mutated[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    with pytest.raises(CodecError):
        decode_arrays(bytes(mutated), spec_of(arrays))


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=12,
    ),
    st.binary(max_size=64),
)
def test_any_json_header_with_a_valid_digest_raises_only_codec_error(header, body):
    data = frame(json.dumps(header, sort_keys=True, separators=(",", ":")).encode(), body)
    try:
        arrays = decode_arrays(data)
    except CodecError:
        return
    # accepted: then it is exactly what re-encoding the result gives
    assert encode(arrays) == data
