"""Payload coding's numeric core: packing, the b-bit quantizer, its wire arrays and error feedback."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.core.quantize import (
    BITS,
    Quantized,
    array_names,
    coded_nbytes,
    coded_spec,
    dequantize,
    encode_with_feedback,
    from_arrays,
    num_rows,
    pack_codes,
    packed_nbytes,
    quantize,
    to_arrays,
    unpack_codes,
)

EPS32 = 2.0**-23  # float32's relative rounding of the decoded value


def _steps(q: Quantized) -> torch.Tensor:
    """Each value's step Δ (float64, the original shape)."""
    rows = num_rows(q.shape, q.per_row)
    count = math.prod(q.shape)
    cols = count // rows if rows else 0
    return q.scale.double().unsqueeze(1).expand(rows, cols).reshape(q.shape)


def _error_ok(x: torch.Tensor, q: Quantized, bound: float) -> bool:
    """|x̂ − x| ≤ bound·Δ, up to float32's rounding of x̂."""
    err = (dequantize(q).double() - x.double()).abs()
    return bool((err <= bound * _steps(q) + EPS32 * x.double().abs() + 1e-30).all())


def _x(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------------------------- packing


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from(BITS), data=st.data())
def test_pack_unpack_round_trip(bits, data):
    codes = data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=97))
    tensor = torch.tensor(codes, dtype=torch.int64)
    packed = pack_codes(tensor, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(len(codes), bits)
    assert torch.equal(unpack_codes(packed, bits, len(codes)), tensor)


def test_pack_layout_is_little_endian():
    assert pack_codes(torch.tensor([1, 2, 3, 0, 1]), 2).tolist() == [1 | 2 << 2 | 3 << 4, 1]
    assert pack_codes(torch.tensor([0xA, 0x5, 0x3]), 4).tolist() == [0x5A, 0x03]
    assert pack_codes(torch.tensor([0x1234, 0xFFFF]), 16).tolist() == [0x34, 0x12, 0xFF, 0xFF]
    assert pack_codes(torch.tensor([7, 255]), 8).tolist() == [7, 255]


@pytest.mark.parametrize("bits", BITS)
def test_pack_rejects_out_of_range_or_float_codes(bits):
    with pytest.raises(ValueError, match="lie in"):
        pack_codes(torch.tensor([0, 1 << bits]), bits)
    with pytest.raises(ValueError, match="lie in"):
        pack_codes(torch.tensor([-1]), bits)
    with pytest.raises(ValueError, match="integers"):
        pack_codes(torch.tensor([0.0, 1.0]), bits)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from(BITS), count=st.integers(0, 60), delta=st.sampled_from([-2, -1, 1, 2]))
def test_unpack_rejects_wrong_lengths(bits, count, delta):
    packed = pack_codes(torch.zeros(count, dtype=torch.int64), bits)
    wrong = packed.numel() + delta
    if wrong < 0:
        return
    bad = torch.zeros(wrong, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot hold exactly"):
        unpack_codes(bad, bits, count)


@pytest.mark.parametrize("bits,count", [(2, 1), (2, 3), (2, 5), (4, 1), (4, 7)])
def test_unpack_rejects_non_zero_padding(bits, count):
    packed = pack_codes(torch.full((count,), (1 << bits) - 1), bits)
    used = (count * bits) % 8
    for bit in range(used, 8):
        tampered = packed.clone()
        tampered[-1] |= 1 << bit
        with pytest.raises(ValueError, match="padding"):
            unpack_codes(tampered, bits, count)
    assert torch.equal(unpack_codes(packed, bits, count), torch.full((count,), (1 << bits) - 1))


def test_unpack_rejects_wrong_dtype_shape_bits_and_count():
    packed = pack_codes(torch.arange(4), 4)
    with pytest.raises(ValueError, match="uint8"):
        unpack_codes(packed.to(torch.int16), 4, 4)
    with pytest.raises(ValueError, match="1-D"):
        unpack_codes(packed.view(1, -1), 4, 4)
    with pytest.raises(ValueError, match="bits"):
        unpack_codes(packed, 3, 4)
    with pytest.raises(ValueError, match="count"):
        unpack_codes(packed, 4, -1)


# -------------------------------------------------------------------------------- quantization

SHAPES = [(), (1,), (7,), (5, 3), (4, 6, 2), (3, 1), (1, 9)]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_nearest_error_is_at_most_half_a_step(bits, per_row, shape):
    x = _x(bits, *shape, scale=3.0) + 1.5
    q = quantize(x, bits, per_row=per_row, generator=None)
    assert dequantize(q).dtype == torch.float32 and dequantize(q).shape == x.shape
    assert _error_ok(x, q, 0.5)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_stochastic_error_is_below_one_step(bits, per_row, shape):
    x = _x(bits + 1, *shape, scale=0.01)
    q = quantize(x, bits, per_row=per_row, generator=torch.Generator().manual_seed(3))
    assert _error_ok(x, q, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from(BITS),
    per_row=st.booleans(),
    cols=st.integers(1, 6),
    data=st.data(),
)
def test_error_bounds_on_arbitrary_values(bits, per_row, cols, data):
    values = data.draw(
        st.lists(st.floats(-1e6, 1e6, width=32), min_size=cols, max_size=6 * cols).map(
            lambda v: v[: len(v) // cols * cols]
        )
    )
    x = torch.tensor(values, dtype=torch.float32).reshape(-1, cols)
    nearest = quantize(x, bits, per_row=per_row, generator=None)
    stochastic = quantize(x, bits, per_row=per_row, generator=torch.Generator().manual_seed(0))
    assert _error_ok(x, nearest, 0.5) and _error_ok(x, stochastic, 1.0)


@pytest.mark.parametrize("bits", BITS)
def test_row_extremes_are_kept(bits):
    x = _x(5, 6, 40)
    out = dequantize(quantize(x, bits, per_row=True, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(out.amin(1), x.amin(1))  # o = min exactly; o + LΔ ≥ max within float32 rounding of Δ
    spread = (x.amax(1) - x.amin(1)).double()
    assert bool(((out.amax(1).double() - x.amax(1).double()).abs() <= spread * 2.0**-22).all())


def test_stochastic_rounding_is_unbiased():
    draws, bits = 20000, 2
    x = _x(7, 64)
    x[0], x[1] = -2.5, 2.5  # the same grid in every draw: [−2.5, 2.5], Δ = 5/3
    step = 5.0 / 3.0
    rows = x.expand(draws, -1).contiguous()  # one draw per row, one call
    mean = dequantize(quantize(rows, bits, per_row=True, generator=torch.Generator().manual_seed(11))).double().mean(0)
    # the standard deviation of one element's mean is at most Δ/2/√draws ≈ 0.0035·Δ
    assert float((mean - x.double()).abs().max()) < 0.02 * step
    nearest = dequantize(quantize(rows[:1], bits, per_row=True, generator=None)).double()[0]
    assert float((nearest - x.double()).abs().max()) > 0.2 * step  # rounding to nearest is biased


def test_same_seed_same_codes():
    x = _x(2, 8, 33)
    a = quantize(x, 4, per_row=True, generator=torch.Generator().manual_seed(5))
    b = quantize(x, 4, per_row=True, generator=torch.Generator().manual_seed(5))
    c = quantize(x, 4, per_row=True, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale) and torch.equal(a.offset, b.offset)
    assert not torch.equal(a.codes, c.codes)
    d, e = (quantize(x, 4, per_row=True, generator=None) for _ in range(2))
    assert torch.equal(d.codes, e.codes)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("generator", [None, 0])
def test_constant_rows_are_exact(bits, generator):
    gen = None if generator is None else torch.Generator().manual_seed(generator)
    x = _x(9, 5, 7)
    x[1] = 0.0
    x[3] = -0.3
    q = quantize(x, bits, per_row=True, generator=gen)
    out = dequantize(q)
    assert bool(torch.isfinite(out).all()) and q.scale[1] == 0 and q.scale[3] == 0
    assert torch.equal(out[1], x[1]) and torch.equal(out[3], x[3])
    for constant in (torch.full((4, 3), 2.75), torch.zeros(6), torch.tensor(1.5)):
        for per_row in (False, True):
            q = quantize(constant, bits, per_row=per_row, generator=gen)
            assert torch.equal(dequantize(q), constant) and bool((q.scale == 0).all())


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0), (2, 0, 5)])
@pytest.mark.parametrize("per_row", [False, True])
def test_empty_tensors(shape, per_row):
    q = quantize(torch.zeros(shape), 4, per_row=per_row, generator=None)
    assert q.scale.numel() == num_rows(shape, per_row)
    assert dequantize(q).shape == shape
    assert coded_nbytes(shape, 4, per_row) == sum(a.numel() * a.element_size() for a in to_arrays(q, "w").values())


def test_per_row_versus_per_tensor():
    x = torch.cat([_x(1, 1, 50, scale=100.0), _x(2, 3, 50, scale=0.01)])
    rowwise = quantize(x, 4, per_row=True, generator=None)
    whole = quantize(x, 4, per_row=False, generator=None)
    assert rowwise.scale.shape == (4,) and whole.scale.shape == (1,)
    small_rows = slice(1, None)
    err_row = (dequantize(rowwise)[small_rows] - x[small_rows]).abs().max()
    err_whole = (dequantize(whole)[small_rows] - x[small_rows]).abs().max()
    assert err_row < 0.01 * err_whole
    # 1-D and 0-D tensors are one row either way; 3-D tensors get shape[0] rows
    assert quantize(_x(3, 9), 4, per_row=True, generator=None).scale.shape == (1,)
    assert quantize(_x(3, 2, 3, 4), 4, per_row=True, generator=None).scale.shape == (2,)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="bits"):
        quantize(_x(0, 4), 32, per_row=False, generator=None)
    with pytest.raises(ValueError, match="bits"):
        quantize(_x(0, 4), 3, per_row=False, generator=None)
    with pytest.raises(ValueError, match="float"):
        quantize(torch.arange(4), 4, per_row=False, generator=None)
    for bad in (math.nan, math.inf, 1e300):
        x = _x(0, 4).double()
        x[2] = bad
        with pytest.raises(ValueError, match="NaN"):
            quantize(x, 4, per_row=False, generator=None)


def test_half_precision_and_float64_inputs():
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = _x(4, 3, 20).to(dtype)
        q = quantize(x, 8, per_row=True, generator=None)
        assert _error_ok(x, q, 0.5)


# ---------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("shape", SHAPES + [(13, 17), (2, 3, 5)])
def test_coded_nbytes_is_the_real_byte_count(bits, per_row, shape):
    q = quantize(_x(0, *shape), bits, per_row=per_row, generator=None)
    arrays = to_arrays(q, "layer.0.weight")
    assert coded_nbytes(shape, bits, per_row) == sum(a.numel() * a.element_size() for a in arrays.values())
    spec = coded_spec("layer.0.weight", shape, bits, per_row)
    assert spec == {n: (tuple(a.shape), str(a.numpy().dtype)) for n, a in arrays.items()}
    assert list(arrays) == list(array_names("layer.0.weight"))


# ----------------------------------------------------------------------------------- wire arrays


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("per_row", [False, True])
def test_arrays_round_trip(bits, per_row):
    x = _x(8, 6, 11)
    q = quantize(x, bits, per_row=per_row, generator=torch.Generator().manual_seed(2))
    arrays = to_arrays(q, "enc.w")
    back = from_arrays({**arrays, "other": torch.zeros(1)}, "enc.w", (6, 11), bits, per_row)
    assert back.shape == q.shape and back.bits == bits and back.per_row == per_row
    assert torch.equal(back.codes, q.codes) and torch.equal(back.scale, q.scale)
    assert torch.equal(dequantize(back), dequantize(q))


def _tamper(arrays, name, value):
    return {**arrays, name: value}


def test_from_arrays_rejects_tampered_arrays():
    x = _x(8, 6, 11)
    arrays = to_arrays(quantize(x, 2, per_row=True, generator=None), "w")
    codes, scale, offset = arrays["w.codes"], arrays["w.scale"], arrays["w.offset"]

    def rejects(bad, match, name):
        with pytest.raises(ValueError, match=match) as info:
            from_arrays(bad, "w", (6, 11), 2, True)
        assert repr(name) in str(info.value)

    rejects({k: v for k, v in arrays.items() if k != "w.scale"}, "missing", "w.scale")
    rejects(_tamper(arrays, "w.codes", codes.to(torch.int16)), "dtype", "w.codes")
    rejects(_tamper(arrays, "w.scale", scale.double()), "dtype", "w.scale")
    rejects(_tamper(arrays, "w.codes", codes[:-1]), "shape", "w.codes")
    rejects(_tamper(arrays, "w.codes", torch.cat([codes, codes[:1]])), "shape", "w.codes")
    rejects(_tamper(arrays, "w.offset", offset[:-1]), "shape", "w.offset")
    rejects(_tamper(arrays, "w.scale", scale.view(2, 3)), "shape", "w.scale")
    for bad in (math.nan, math.inf):
        s = scale.clone()
        s[2] = bad
        rejects(_tamper(arrays, "w.scale", s), "NaN", "w.scale")
        o = offset.clone()
        o[0] = bad
        rejects(_tamper(arrays, "w.offset", o), "NaN", "w.offset")
    s = scale.clone()
    s[1] = -s[1]
    rejects(_tamper(arrays, "w.scale", s), "negative", "w.scale")
    s, o = scale.clone(), offset.clone()
    s[0], o[0] = 3e38, 3e38
    rejects({**arrays, "w.scale": s, "w.offset": o}, "overflows", "w.scale")
    c = codes.clone()
    c[-1] |= 0b11000000  # 66 two-bit codes: the last byte holds 2, its top 4 bits are padding
    rejects(_tamper(arrays, "w.codes", c), "padding", "w.codes")
    rejects(_tamper(arrays, "w.codes", codes.tolist()), "not a tensor", "w.codes")
    with pytest.raises(ValueError, match="bits"):
        from_arrays(arrays, "w", (6, 11), 32, True)


# ------------------------------------------------------------------------------------ feedback


def test_feedback_transmits_what_rounding_alone_never_would():
    """A constant 0.05 on the grid {0, 1/3, 2/3, 1} (2 bits; the 0 and 1 pin the grid) is below half a step:
    without feedback nothing of it is ever sent; with feedback the sent sum tracks the input's."""
    x = torch.tensor([0.0, 1.0, 0.05])
    rounds = 60
    no_feedback = sum(dequantize(quantize(x, 2, per_row=False, generator=None))[2] for _ in range(rounds))
    assert float(no_feedback) == 0.0
    residual, sent = torch.zeros(3), torch.zeros(3, dtype=torch.float64)
    for _ in range(rounds):
        q, residual = encode_with_feedback(x, residual, 2, per_row=False, generator=None)
        sent += dequantize(q).double()
    target = rounds * x.double()
    assert abs(float(sent[2] - target[2])) <= 0.5 * float(q.scale.max()) + 1e-5
    assert float(sent[2]) > 2.5  # 60 · 0.05 = 3


@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("per_row", [False, True])
def test_feedback_sum_tracks_inputs_within_one_step(stochastic, bits, per_row):
    gen = torch.Generator().manual_seed(4) if stochastic else None
    inputs = torch.Generator().manual_seed(bits)
    residual = None
    sum_in, sum_out = torch.zeros(5, 8, dtype=torch.float64), torch.zeros(5, 8, dtype=torch.float64)
    for _ in range(40):
        x = torch.randn(5, 8, generator=inputs) * 0.1 + 0.02  # a drift rounding alone would lose
        q, residual = encode_with_feedback(x, residual, bits, per_row=per_row, generator=gen)
        sum_in += x.double()
        sum_out += dequantize(q).double()
        bound = (1.0 if stochastic else 0.5) * _steps(q)
        assert bool((residual.double().abs() <= bound + 1e-6).all())  # the residual stays bounded
    assert torch.allclose(sum_in - sum_out, residual.double(), atol=1e-5)  # Σx − Σx̂ = r_T
    assert bool(((sum_in - sum_out).abs() <= bound + 1e-5).all())


def test_feedback_checks_and_defaults():
    x = _x(1, 3, 4)
    q0, r0 = encode_with_feedback(x, None, 4, per_row=True, generator=None)
    q1, r1 = encode_with_feedback(x, torch.zeros(3, 4), 4, per_row=True, generator=None)
    assert torch.equal(q0.codes, q1.codes) and torch.equal(r0, r1) and r0.dtype == torch.float32
    assert torch.allclose(dequantize(q0) + r0, x, atol=1e-6)
    with pytest.raises(ValueError, match="residual"):
        encode_with_feedback(x, torch.zeros(4, 3), 4, per_row=True, generator=None)
