"""Payload coding's numeric core: b-bit uniform quantization of differences, with stochastic rounding and
client-side error feedback.

A client sends ``x − reference`` (a tensor the server already holds) coded to ``b`` bits per value
(QSGD, Alistarh et al. 2017; FedPAQ, Reisizadeh et al. 2020). Each row (``per_row``: the tensor viewed as
``(shape[0], -1)``; a 0-D or 1-D tensor is one row) or the whole tensor gets its own uniform grid

    levels  o + k·Δ,  k = 0 … L,  L = 2^b − 1,  o = min(row),  Δ = (max(row) − min(row)) / L      (1)

and a value ``v = (x − o)/Δ`` gets the code

    k = ⌊v + u⌋,  u ~ U[0, 1)  (stochastic),   u = ½  (round to nearest, ``generator=None``)      (2)

so ``P(k = ⌊v⌋ + 1) = v − ⌊v⌋`` and ``E[o + kΔ] = x``: QSGD's stochastic quantizer
``Q_s(v_i) = ‖v‖·sgn(v_i)·ξ_i`` with ``ξ_i = (ℓ + 1)/s`` w.p. ``|v_i|s/‖v‖ − ℓ`` and ``ℓ/s``
otherwise, on the affine grid (1) instead of QSGD's ``[0, ‖v‖]`` magnitude grid.
Errors: ``|x̂ − x| ≤ Δ/2`` (nearest), ``< Δ`` (stochastic, variance ``≤ Δ²/4``). ``o`` is rounded down
and ``Δ`` up to float32 so that every value lies on the stored grid; a float32 row's minimum is sent
exactly (its maximum up to Δ's float32 rounding); a constant row has ``Δ = 0`` and decodes to ``o``.

Why this grid and not the symmetric ``k·s``, ``s = max|x| / (2^(b−1) − 1)``: on zero-centred Gaussian
differences (256 rows × 1024, per row) the relative mean squared error of (1) is lower at every width:
nearest 0.409 / 1.60e-2 / 5.53e-5 vs 0.760 / 2.07e-2 / 6.30e-5 at b = 2 / 4 / 8; stochastic
0.807 / 3.19e-2 / 1.11e-4 vs 1.78 / 4.13e-2 / 1.26e-4 — the symmetric grid spends one code on nothing and
spans ``2·max|x| ≥ max − min``. (The symmetric grid wins, ≈ 0.6×, when half the values are exactly zero,
because 0 lies halfway between two levels of (1) for a symmetric range; a constant all-zero row is still
exact here.)

Wire form (:func:`to_arrays`): ``<prefix>.codes`` uint8, the codes packed little-endian (value ``i`` in byte
``i·b // 8`` at bit ``(i·b) % 8``; two bytes, low first, for b = 16; the last byte's unused bits zero),
``<prefix>.scale`` float32 ``Δ`` and ``<prefix>.offset`` float32 ``o``, one per row. Everything received
is checked strictly (:func:`from_arrays`, :func:`unpack_codes`); errors are ``ValueError`` (callers may
re-raise them as ``wire.PayloadError``).

Error feedback (Seide et al. 2014; EF-SGD, Karimireddy et al. 2019, Alg. 2): the client codes
``p_t = x_t + r_t`` and keeps ``r_{t+1} = p_t − x̂_t``, so ``Σ_t x̂_t = Σ_t x_t + r_0 − r_T``: what the server
has summed never drifts from what the client meant to send by more than one step (:func:`encode_with_feedback`).

Arithmetic runs on CPU in float64 (the codes are wire data anyway); results are float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

BITS = (2, 4, 8, 16)
"""Supported code widths; 32 (no coding) is the callers' business."""

SUFFIXES = ("codes", "scale", "offset")
_DTYPES = {"codes": torch.uint8, "scale": torch.float32, "offset": torch.float32}


@dataclass(frozen=True)
class Quantized:
    """A coded tensor: packed ``codes`` (uint8), ``scale`` = Δ and ``offset`` = o of Eq. (1) (float32, one per
    row, or one for the tensor), the original ``shape``, the width ``bits`` and ``per_row``."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    shape: tuple[int, ...]
    bits: int
    per_row: bool


# ----------------------------------------------------------------------------------------- sizes


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    return bits


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    return dims


def num_rows(shape: Sequence[int], per_row: bool) -> int:
    """Grids of a tensor: ``shape[0]`` per row for 2-D and more, else 1 (0-D/1-D: the tensor is one row)."""
    return int(shape[0]) if per_row and len(shape) >= 2 else 1


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes of ``count`` packed ``bits``-bit codes: ``⌈count·bits / 8⌉``."""
    return (int(count) * _check_bits(bits) + 7) // 8


def coded_nbytes(shape: Sequence[int], bits: int, per_row: bool) -> int:
    """Exact bytes of a coded tensor: packed codes plus a float32 scale and offset per row."""
    dims = _check_shape(shape)
    return packed_nbytes(math.prod(dims), bits) + 8 * num_rows(dims, per_row)


def array_names(prefix: str) -> tuple[str, str, str]:
    """The wire names ``<prefix>.codes``, ``<prefix>.scale``, ``<prefix>.offset``."""
    return tuple(f"{prefix}.{s}" for s in SUFFIXES)  # type: ignore[return-value]


def coded_spec(prefix: str, shape: Sequence[int], bits: int, per_row: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """The expected (shape, numpy dtype name) of each wire array, in ``wire.TensorSpec`` form."""
    dims = _check_shape(shape)
    rows = num_rows(dims, per_row)
    sizes = (packed_nbytes(math.prod(dims), bits), rows, rows)
    dtypes = ("uint8", "float32", "float32")
    return {name: ((n,), dt) for name, n, dt in zip(array_names(prefix), sizes, dtypes, strict=True)}


# ------------------------------------------------------------------------------------- packing


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes in ``[0, 2^bits)`` (any shape, read flat) -> uint8 bytes, little-endian (module doc)."""
    _check_bits(bits)
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise ValueError(f"codes must be integers, got {codes.dtype}")
    flat = codes.detach().reshape(-1).to("cpu", torch.int64)
    if flat.numel() and not bool(((flat >= 0) & (flat < 1 << bits)).all()):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits} bits")
    if bits == 16:
        return torch.stack([flat & 0xFF, flat >> 8], dim=1).reshape(-1).to(torch.uint8)
    per = 8 // bits
    padded = torch.zeros(packed_nbytes(flat.numel(), bits) * per, dtype=torch.int64)
    padded[: flat.numel()] = flat
    shifts = torch.arange(per, dtype=torch.int64) * bits
    return (padded.view(-1, per) << shifts).sum(dim=1).to(torch.uint8)  # disjoint bits: sum == or


def _check_packed(packed: torch.Tensor, bits: int, count: int) -> None:
    """Raise ValueError unless ``packed`` is exactly the packing of ``count`` codes (dtype, length, padding)."""
    _check_bits(bits)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 1:
        what = f"{packed.dtype} of shape {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else type(packed)
        raise ValueError(f"packed codes must be a 1-D uint8 tensor, got {what}")
    expected = packed_nbytes(count, bits)
    if packed.numel() != expected:
        raise ValueError(f"{packed.numel()} byte(s) cannot hold exactly {count} {bits}-bit codes ({expected} expected)")
    used = (count * bits) % 8  # bits of the last byte that hold codes; 0: all of them
    if used and int(packed[-1]) >> used:
        raise ValueError("the padding bits after the last code are not zero")


def unpack_codes(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``count`` codes (int64) of :func:`pack_codes`' output; ValueError on any other input."""
    _check_packed(packed, bits, count)
    raw = packed.to("cpu", torch.int64)
    if bits == 16:
        pairs = raw.view(-1, 2)
        return pairs[:, 0] | (pairs[:, 1] << 8)
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int64) * bits
    return ((raw.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count].clone()


# -------------------------------------------------------------------------------- quantization


def _as_matrix(x: torch.Tensor, per_row: bool) -> torch.Tensor:
    rows = num_rows(x.shape, per_row)
    cols = x.numel() // rows if rows else 0
    return x.detach().to("cpu", torch.float64).reshape(rows, cols)


def _grid(matrix: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (1) per row as float32 (offset o, step Δ), with o ≤ min and o + LΔ ≥ max exactly."""
    rows, cols = matrix.shape
    if cols == 0:
        return torch.zeros(rows), torch.zeros(rows)
    levels = (1 << bits) - 1
    low, high = matrix.amin(dim=1), matrix.amax(dim=1)
    offset = low.float()
    offset = torch.where(offset.double() > low, torch.nextafter(offset, torch.tensor(-math.inf)), offset)
    step = ((high - offset.double()) / levels).float()
    short = offset.double() + levels * step.double() < high
    step = torch.where(short, torch.nextafter(step, torch.tensor(math.inf)), step)
    return offset, step


def quantize(x: torch.Tensor, bits: int, *, per_row: bool, generator: torch.Generator | None) -> Quantized:
    """Code a float tensor to ``bits`` bits per value on the grid (1) with the rounding (2): stochastic and
    unbiased with a (CPU) ``generator``, round-to-nearest with ``None``."""
    _check_bits(bits)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"quantize takes a float tensor, got {getattr(x, 'dtype', type(x))}")
    if x.numel() and not bool(torch.isfinite(x.detach().float()).all()):
        raise ValueError("quantize: the tensor holds NaN, Inf or values beyond float32's range")
    matrix = _as_matrix(x, per_row)
    offset, step = _grid(matrix, bits)
    step64 = step.double().unsqueeze(1)
    scaled = torch.where(step64 > 0, (matrix - offset.double().unsqueeze(1)) / step64.clamp(min=1e-300), 0.0)
    noise = 0.5 if generator is None else torch.rand(matrix.shape, generator=generator, dtype=torch.float64)
    codes = torch.floor(scaled + noise).clamp_(0, (1 << bits) - 1).to(torch.int64)
    return Quantized(pack_codes(codes, bits), step, offset, tuple(x.shape), bits, bool(per_row))


def dequantize(q: Quantized) -> torch.Tensor:
    """``o + k·Δ`` per value (float32, the original shape)."""
    rows = num_rows(q.shape, q.per_row)
    if tuple(q.scale.shape) != (rows,) or tuple(q.offset.shape) != (rows,):
        raise ValueError(f"scale/offset must hold {rows} value(s), got {tuple(q.scale.shape)}/{tuple(q.offset.shape)}")
    count = math.prod(q.shape)
    codes = unpack_codes(q.codes, q.bits, count).double().reshape(rows, count // rows if rows else 0)
    values = q.offset.double().unsqueeze(1) + codes * q.scale.double().unsqueeze(1)
    return values.float().reshape(q.shape)


# -------------------------------------------------------------------------------------- wire


def to_arrays(q: Quantized, prefix: str) -> dict[str, torch.Tensor]:
    """The wire arrays ``<prefix>.codes`` (uint8), ``<prefix>.scale``, ``<prefix>.offset`` (float32)."""
    codes, scale, offset = array_names(prefix)
    return {codes: q.codes, scale: q.scale.to(torch.float32), offset: q.offset.to(torch.float32)}


def _check_array(arrays: Mapping[str, torch.Tensor], name: str, spec: tuple[tuple[int, ...], str]) -> torch.Tensor:
    if name not in arrays:
        raise ValueError(f"array {name!r} is missing")
    array = arrays[name]
    if not isinstance(array, torch.Tensor):
        raise ValueError(f"array {name!r} is a {type(array).__name__}, not a tensor")
    dtype = _DTYPES[name.rsplit(".", 1)[1]]
    if array.dtype != dtype:
        raise ValueError(f"array {name!r} has dtype {array.dtype}, expected {dtype}")
    if tuple(array.shape) != spec[0]:
        raise ValueError(f"array {name!r} has shape {tuple(array.shape)}, expected {spec[0]}")
    if array.is_floating_point() and not bool(torch.isfinite(array).all()):
        raise ValueError(f"array {name!r} holds NaN or Inf")
    return array


def from_arrays(
    arrays: Mapping[str, torch.Tensor], prefix: str, shape: Sequence[int], bits: int, per_row: bool
) -> Quantized:
    """Rebuild a :class:`Quantized` from its wire arrays, or raise ValueError naming the array at fault
    (missing, dtype, length, NaN/Inf, negative step, a grid top ``o + LΔ`` beyond float32, bad codes).
    Other names in ``arrays`` are ignored: checking the whole payload's names is the caller's job."""
    dims = _check_shape(shape)
    spec = coded_spec(prefix, dims, bits, per_row)
    codes, scale, offset = (_check_array(arrays, name, spec[name]) for name in spec)
    names = array_names(prefix)
    if bool((scale < 0).any()):
        raise ValueError(f"array {names[1]!r} holds a negative step")
    top = offset.double() + ((1 << bits) - 1) * scale.double()
    if not bool(torch.isfinite(top.float()).all()):
        raise ValueError(
            f"arrays {names[1]!r}/{names[2]!r}: the grid's top offset + (2^bits - 1)·scale overflows float32"
        )
    try:
        _check_packed(codes, bits, math.prod(dims))
    except ValueError as err:
        raise ValueError(f"array {names[0]!r}: {err}") from err
    return Quantized(codes, scale, offset, dims, bits, bool(per_row))


# ---------------------------------------------------------------------------------- feedback


def encode_with_feedback(
    x: torch.Tensor, residual: torch.Tensor | None, bits: int, *, per_row: bool, generator: torch.Generator | None
) -> tuple[Quantized, torch.Tensor]:
    """EF-SGD's step: code ``p = x + r`` and return ``(q, p − dequantize(q))`` (float32, CPU); ``residual``
    ``None`` means zeros. Summed over rounds, ``Σ x̂_t = Σ x_t + r_0 − r_T`` with ``|r_T| ≤ Δ/2`` (nearest)
    or ``< Δ`` (stochastic) per value."""
    target = x.detach().to("cpu", torch.float32)
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"residual has shape {tuple(residual.shape)}, the tensor {tuple(x.shape)}")
        target = target + residual.detach().to("cpu", torch.float32)
    q = quantize(target, bits, per_row=per_row, generator=generator)
    return q, target - dequantize(q)


__all__ = [
    "BITS",
    "SUFFIXES",
    "Quantized",
    "array_names",
    "coded_nbytes",
    "coded_spec",
    "dequantize",
    "encode_with_feedback",
    "from_arrays",
    "num_rows",
    "pack_codes",
    "packed_nbytes",
    "quantize",
    "to_arrays",
    "unpack_codes",
]
