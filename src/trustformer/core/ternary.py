"""FedPC's ternary vectors (Eq. 4 and 5) and their 2-bit wire form: four values per byte.

Codes (FedPC Section 3.3: "00, 01 and 11"): ``0 -> 0b00``, ``+1 -> 0b01``, ``-1 -> 0b11``; ``0b10`` is
unused and rejected. Value ``i`` sits in byte ``i // 4`` at bits ``2·(i % 4)`` (the lowest bits first); the
last byte's unused slots are ``0b00``. A vector of ``n`` values is one uint8 array of ``ceil(n / 4)``
bytes; :func:`unpack` checks that length against the ``n`` the configuration gives and refuses the unused
code and non-zero padding, so a malformed vector never reaches the master's update.
"""

from __future__ import annotations

import torch

from ..wire import PayloadError

ZERO, PLUS, MINUS, UNUSED = 0b00, 0b01, 0b11, 0b10


def packed_length(n: int) -> int:
    """Bytes of ``n`` packed ternary values."""
    return (int(n) + 3) // 4


def pack(values: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor of values in {-1, 0, +1} -> its uint8 packing (``ceil(n / 4)`` bytes)."""
    flat = values.reshape(-1).to(torch.int64)
    if flat.numel() and not bool(((flat >= -1) & (flat <= 1)).all()):
        raise ValueError("a ternary vector holds only -1, 0 and +1")
    codes = torch.zeros(packed_length(flat.numel()) * 4, dtype=torch.int64)
    codes[: flat.numel()] = torch.where(flat < 0, MINUS, flat)  # 0 -> 00, 1 -> 01, -1 -> 11
    codes = codes.view(-1, 4)
    packed = codes[:, 0] | (codes[:, 1] << 2) | (codes[:, 2] << 4) | (codes[:, 3] << 6)
    return packed.to(torch.uint8)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` values (int8 in {-1, 0, +1}) of a packed vector; PayloadError when it is not exactly the
    packing of ``n`` values (wrong dtype, shape or length, the unused code, non-zero padding)."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise PayloadError(
            f"ternary vector: expected a 1-D uint8 array, got {packed.dtype} of shape {tuple(packed.shape)}"
        )
    if packed.numel() != packed_length(n):
        raise PayloadError(
            f"ternary vector: {packed.numel()} byte(s) cannot hold exactly {n} values ({packed_length(n)} expected)"
        )
    raw = packed.to(torch.int64)
    codes = torch.stack([(raw >> shift) & 0b11 for shift in (0, 2, 4, 6)], dim=1).reshape(-1)
    if bool((codes == UNUSED).any()):
        raise PayloadError("ternary vector: the unused code 0b10 appears")
    if bool((codes[n:] != ZERO).any()):
        raise PayloadError("ternary vector: the padding after the last value is not zero")
    values = codes[:n]
    return torch.where(values == MINUS, -1, values).to(torch.int8)


def ternary_initial(local: torch.Tensor, initial: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 4 (t = 1): sign(Q − P⁰) where |Q − P⁰| > α, else 0 (α: the worker's learning rate)."""
    change = local.double() - initial.double()
    out = torch.zeros_like(change, dtype=torch.int8)
    out[change > alpha] = 1
    out[change < -alpha] = -1
    return out


def ternary_evolution(local: torch.Tensor, last: torch.Tensor, before: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 5 (t ≥ 2): 0 where |Q − P^{t−1}| < β·|P^{t−1} − P^{t−2}|, else sign((Q − P^{t−1})(P^{t−1} − P^{t−2}))."""
    step = local.double() - last.double()
    previous = last.double() - before.double()
    out = torch.sign(step * previous).to(torch.int8)
    out[step.abs() < beta * previous.abs()] = 0
    return out


def shares(values: torch.Tensor) -> dict[str, float]:
    """The share of −1, 0 and +1 in a ternary vector (``ternary_neg``, ``ternary_zero``, ``ternary_pos``)."""
    n = max(values.numel(), 1)
    return {
        "ternary_neg": float((values < 0).sum()) / n,
        "ternary_zero": float((values == 0).sum()) / n,
        "ternary_pos": float((values > 0).sum()) / n,
    }


__all__ = ["pack", "packed_length", "shares", "ternary_evolution", "ternary_initial", "unpack"]
