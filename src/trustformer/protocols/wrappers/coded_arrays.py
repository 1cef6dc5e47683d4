"""The coded arrays both coding layers send (``coding.py`` up, ``download.py`` down): every coded tensor's packed
b-bit codes in one uint8 array and its grids (offset, step) in one float32 array, per row where rows are long enough
(``core/quantize.py``). One layout, one decoder: the server and every client decode with the same arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...core import quantize as q
from ...core.shared import Tensors
from ...wire import PayloadError, TensorSpec

MIN_ROW = 16  # a row shorter than this shares one grid with its whole tensor (8 bytes of grid per row)


def per_row(shape: Sequence[int], scale: str) -> bool:
    """One grid per row where rows hold at least :data:`MIN_ROW` values (``payload_scale = "row"``)."""
    return scale == "row" and len(shape) >= 2 and int(torch.tensor(shape[1:]).prod()) >= MIN_ROW


def coded_spec(shapes: dict[str, tuple[int, ...]], bits: int, scale: str, codes: str, grid: str) -> TensorSpec:
    """The names/shapes/dtypes of the coded arrays (``codes``, ``grid``) for tensors of ``shapes``."""
    nbytes = sum(q.packed_nbytes(int(torch.tensor(s).prod()) if s else 1, bits) for s in shapes.values())
    rows = sum(q.num_rows(s, per_row(s, scale)) for s in shapes.values())
    return {codes: ((nbytes,), "uint8"), grid: ((2 * rows,), "float32")}


def decode(
    codes: torch.Tensor,
    grid: torch.Tensor,
    shapes: dict[str, tuple[int, ...]],
    reference: Tensors,
    bits: int,
    scale: str,
    what: str,
) -> Tensors:
    """``reference + deq(codes)`` per tensor of ``shapes`` (in float64, then float32); a malformed message raises
    PayloadError naming ``what``."""
    out, at_byte, at_row = {}, 0, 0
    grid = grid.double()
    try:
        for name, shape in shapes.items():
            rows_per, count = per_row(shape, scale), int(torch.tensor(shape).prod()) if shape else 1
            nbytes, rows = q.packed_nbytes(count, bits), q.num_rows(shape, rows_per)
            pairs = grid[2 * at_row : 2 * (at_row + rows)].reshape(rows, 2)
            coded = q.Quantized(
                codes[at_byte : at_byte + nbytes], pairs[:, 1].float(), pairs[:, 0].float(), shape, bits, rows_per
            )
            value = q.dequantize(coded).double()
            out[name] = (value + (reference[name].double() if name in reference else 0.0)).float()
            at_byte, at_row = at_byte + nbytes, at_row + rows
    except ValueError as exc:
        raise PayloadError(f"{what}: {exc}") from None
    if at_byte != codes.numel() or 2 * at_row != grid.numel():
        raise PayloadError(f"{what}: more codes or grids than the configuration gives")
    if not bool(torch.isfinite(grid).all()):
        raise PayloadError(f"{what}: a grid holds NaN or Inf")
    return out


__all__ = ["MIN_ROW", "coded_spec", "decode", "per_row"]
