"""Noise correlated across DP-SGD steps: DP-FTRL with a banded matrix factorization (``privacy.noise_bands``).

DP-SGD releases each step's clipped gradient sum x_t plus fresh noise z_t, and the model after t steps carries the
prefix sum of those noises: error that grows like √t. The matrix mechanism (Denisov et al. 2022; Choquette-Choo et
al. 2023) factors the prefix-sum workload A (lower-triangular ones) as A = B·C and releases x + C⁻¹z instead: the
model then carries B·z = A·C⁻¹z. Here C is the **banded square root** of A (Kalinin & Lampert 2024, "Banded Square
Root Matrix Factorization for Differentially Private Model Training"): A^{1/2} is the lower-triangular Toeplitz
matrix of the coefficients r_j = binom(2j, j) / 4^j of (1 − x)^{−1/2}, and C keeps its first b diagonals. No
optimization is needed, and C⁻¹z is computed step by step from the last b − 1 outputs (:class:`BandedNoise`).

Privacy (Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization", Thm. 4): split the records into b
fixed groups, let step t Poisson-sample from group t mod b at rate q (**b-min-sep sampling**: a record takes part at
most once in any b consecutive steps, so its columns of the b-banded C never overlap). The mechanism is then as
private as DP-SGD at rate q with noise multiplier σ/‖C‖_col for ⌈T/b⌉ steps, where ‖C‖_col is the largest column
norm of C. b = 1 is DP-SGD itself: C = I, every record's group is all the records, fresh noise each step.

Under distributed noise each owner runs the same recurrence on its own noise share: C⁻¹ is linear, so the owners'
correlated shares sum to C⁻¹ of the summed shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def sqrt_coefficients(bands: int) -> tuple[float, ...]:
    """r_0 … r_{b−1}: the first ``bands`` Toeplitz coefficients of A^{1/2}, r_j = binom(2j, j) / 4^j
    (Kalinin & Lampert 2024, Sec. 3; r_0 = 1)."""
    if bands < 1:
        raise ValueError(f"bands = {bands}: at least 1")
    out = [1.0]
    for j in range(1, bands):
        out.append(out[-1] * (2 * j - 1) / (2 * j))  # binom(2j, j)/4^j = r_{j-1} (2j − 1)/(2j)
    return tuple(out)


def column_norm(coefficients: tuple[float, ...], steps: int) -> float:
    """‖C‖_col, the largest column norm of the banded Toeplitz C over ``steps`` steps: its first column,
    √(Σ_{j < min(b, T)} r_j²)."""
    return math.sqrt(sum(c * c for c in coefficients[: max(1, min(len(coefficients), steps))]))


def amplified_steps(steps: int, bands: int) -> int:
    """⌈T/b⌉: the DP-SGD steps a b-banded mechanism under b-min-sep sampling is as private as (Thm. 4)."""
    return -(-steps // bands)


def toeplitz(coefficients: tuple[float, ...], steps: int) -> torch.Tensor:
    """C as a dense T × T float64 matrix (the reference the recurrence is tested against, and the error bench)."""
    c = torch.zeros(steps, steps, dtype=torch.float64)
    for j, r in enumerate(coefficients[:steps]):
        c += torch.diag(torch.full((steps - j,), r, dtype=torch.float64), -j)
    return c


def prefix_noise(coefficients: tuple[float, ...], steps: int) -> torch.Tensor:
    """A·C⁻¹ (T × T): row t says how much of each unit noise z_s the model holds after step t."""
    a = torch.tril(torch.ones(steps, steps, dtype=torch.float64))
    return torch.linalg.solve_triangular(toeplitz(coefficients, steps), a, upper=False, left=False)


@dataclass
class BandedNoise:
    """The recurrence y_t = (z_t − Σ_{j=1}^{b−1} r_j y_{t−j}) / r_0, i.e. y = C⁻¹z, one tensor of noise per name.
    ``history`` holds each name's last b − 1 outputs, newest first: the state an owner keeps between steps (in
    its checkpoint), the only thing that makes step t's noise depend on the earlier ones."""

    coefficients: tuple[float, ...]
    history: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def correlate(self, name: str, fresh: torch.Tensor) -> torch.Tensor:
        """y_t for the fresh noise z_t of ``name``; remembers it."""
        past = self.history.get(name, [])
        out = fresh.clone()
        for r, y in zip(self.coefficients[1:], past, strict=False):
            out.sub_(y.to(out.device, out.dtype), alpha=r)
        out.div_(self.coefficients[0])
        self.history[name] = [out.detach().clone(), *past][: len(self.coefficients) - 1]
        return out


def min_sep_groups(n_records: int, bands: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The b fixed groups of b-min-sep sampling: a seeded permutation of the records cut into b near-equal parts;
    step t samples from group t mod b."""
    if n_records < bands:
        raise ValueError(f"{n_records} records cannot fill {bands} groups of b-min-sep sampling (privacy.noise_bands)")
    order = torch.randperm(n_records, generator=generator)
    return [g.sort().values for g in torch.tensor_split(order, bands)]


__all__ = [
    "BandedNoise",
    "amplified_steps",
    "column_norm",
    "min_sep_groups",
    "prefix_noise",
    "sqrt_coefficients",
    "toeplitz",
]
