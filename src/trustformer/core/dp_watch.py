"""The watcher of one ``dp_sgd`` call for the checks in every record-level DP run (``core/dp_checks.py``): what
the accountant charges for (:class:`Mechanism`) and what the call did (:class:`StepChecks`: its draws, its
clipping, its releases' noise, its optimizer's steps), summarised as it runs, never kept whole."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

CLIP_TOLERANCE = 1e-3  # the clipping check's largest relative residual (float32 rounding leaves about 1e-7)
FINGERPRINT_GROUPS = 8  # the noise fingerprint: one coordinate in each of this many largest tensors


@dataclass(frozen=True)
class Mechanism:
    """What the accountant charges for, as the checks expect to see it in one owner's DP-SGD call: C, the std of
    the noise the owner adds per coordinate (σ·C, or its share), the sampling rate, and under banded noise the
    recurrence's coefficients and the owner's step index of the call's first step (each step's noise std)."""

    clip_norm: float
    noise_std: float
    sample_rate: float
    coefficients: tuple[float, ...] = (1.0,)
    first_step: int = 0
    pool: int = 0  # banded noise: the most records one step may draw from (its b-min-sep group); 0 = the owner's

    def step_std(self, step: int) -> float:
        """The noise std of the call's ``step``-th release: y = C⁻¹z has std σC·‖row t of C⁻¹‖."""
        if len(self.coefficients) == 1:
            return self.noise_std / self.coefficients[0]
        return self.noise_std * math.sqrt(_inverse_row_square(self.coefficients, self.first_step + step))


@lru_cache(maxsize=256)
def _inverse_row_square(coefficients: tuple[float, ...], t: int) -> float:
    """Σ_{j ≤ t} h_j², h the impulse response of y_t = (z_t − Σ_{j ≥ 1} r_j y_{t−j}) / r_0 (``BandedNoise``)."""
    h: list[float] = []
    for j in range(t + 1):
        acc = (1.0 if j == 0 else 0.0) - sum(
            coefficients[i] * h[j - i] for i in range(1, min(j, len(coefficients) - 1) + 1)
        )
        h.append(acc / coefficients[0])
    return sum(v * v for v in h)


@dataclass
class StepChecks:
    """What one ``dp_sgd`` call shows the checks (see the module docstring); summaries only, no copies but the
    fixed random probe of the clipping check (one flat tensor per bucket of parameters, drawn from its own generator:
    the run's draws and noise are untouched)."""

    mechanism: Mechanism
    steps: int = 0  # the client optimizer's steps (its step method, wrapped on the instance)
    releases: int = 0
    draws: list[tuple[int, int]] = field(default_factory=list)  # (records drawn from, drawn)
    records_max: int = 0  # the most records one draw was made from
    noise: dict[str, list[float]] = field(default_factory=dict)  # name -> [draws, Σ (x/std)², Σ x² when std = 0]
    prints: list[list[float]] = field(default_factory=list)
    clip_residual: float = 0.0
    clip_first_bad: int = -1  # the call's first step whose residual exceeds the tolerance
    max_norm: float = 0.0  # the largest per-record gradient norm before clipping
    seconds: float = 0.0
    _optimizer: Any = None
    _original_clip: Any = None
    _stepper: Any = None
    _names: list[str] = field(default_factory=list)
    _buckets: list[list[int]] = field(default_factory=list)  # parameter positions clipped-checked together
    _probe: list[torch.Tensor] | None = None  # one flat probe per bucket
    _spots: list[tuple[int, int]] = field(default_factory=list)  # (parameter, coordinate) of the fingerprint
    _expected: Any = 0.0  # Σ c_i ⟨g_i, r⟩ of the step so far (float64 tensor)
    _scale: Any = 0.0  # Σ c_i ‖g_i‖ of the step so far
    _norms: list[torch.Tensor] = field(default_factory=list)

    # -- the hooks dp_sgd calls

    def attach(self, dp_optimizer: Any, optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> None:
        """Watch ``dp_optimizer``'s clipping (its own method, wrapped on the instance) and count ``optimizer``'s
        steps; ``names`` maps id(parameter) to its name."""
        params = list(dp_optimizer.params)
        self._optimizer = dp_optimizer
        self._names = [names.get(id(p), f"#{i}") for i, p in enumerate(params)]
        self._buckets = _buckets([p.numel() for p in params])
        self._spots = _spots([p.numel() for p in params])
        self._original_clip = dp_optimizer.clip_and_accumulate
        dp_optimizer.clip_and_accumulate = self._clip
        original_step = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            self.steps += 1
            return original_step(*args, **kwargs)

        optimizer.step = step  # type: ignore[method-assign]  # on the instance: each call counted once
        self._stepper = optimizer

    def detach(self) -> None:
        if self._optimizer is not None and self._original_clip is not None:
            self._optimizer.__dict__.pop("clip_and_accumulate", None)
        if self._stepper is not None:
            self._stepper.__dict__.pop("step", None)
        self._optimizer, self._original_clip, self._stepper, self._probe = None, None, None, None

    def drawn(self, population: int, count: int, records: int | None = None) -> None:
        """One Poisson draw of ``count`` from ``population`` (the records and any audit canaries), of which
        ``records`` are records."""
        self.draws.append((int(population), int(count)))
        self.records_max = max(self.records_max, int(population if records is None else records))

    def _clip(self) -> None:
        """Before Opacus clips this physical batch: each record's norm over all tensors, and the projection on the
        probe of its gradient, Σ_t ⟨g_i,t, r_t⟩ (the small tensors concatenated by bucket: few kernels)."""
        started = time.perf_counter()
        dp = self._optimizer
        with torch.no_grad():
            samples = dp.grad_samples
            rows = len(samples[0]) if samples else 0
            if rows:
                params = list(dp.params)
                if self._probe is None:
                    self._probe = _probe(params, self._buckets)
                squares, projected = [], []
                for bucket, r in zip(self._buckets, self._probe, strict=True):
                    parts = [samples[t].reshape(rows, -1) for t in bucket]
                    m = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                    m = m if m.dtype == r.dtype else m.to(r.dtype)
                    squares.append(torch.linalg.vector_norm(m, dim=1) ** 2)
                    projected.append(m @ r)
                norms = torch.stack(squares).sum(0).sqrt()
                factor = (self.mechanism.clip_norm / (norms + 1e-6)).clamp(max=1.0).double()
                self._expected = self._expected + (factor * torch.stack(projected).sum(0, dtype=torch.float64)).sum()
                self._scale = self._scale + (factor * norms.double()).sum()
                self._norms.append(norms.max())
        self.seconds += time.perf_counter() - started
        self._original_clip()

    def single_coordinate_rows(self, tensor: int, flats: torch.Tensor, values: torch.Tensor, norm: float) -> None:
        """Rows added to the clipped sum without Opacus' clipping, each one coordinate (``flats``) of tensor
        ``tensor`` (the optimizer's position) holding its clipped value (``values``), of norm ``norm`` before
        clipping (the audit's canaries beyond one per tensor, ``grad_canaries.clip_canaries``): the clipping check
        expects them in the sum."""
        started = time.perf_counter()
        with torch.no_grad():
            params = list(self._optimizer.params)
            if self._probe is None:
                self._probe = _probe(params, self._buckets)
            for bucket, r in zip(self._buckets, self._probe, strict=True):
                if tensor in bucket:
                    offset = sum(params[t].numel() for t in bucket[: bucket.index(tensor)])
                    picked = r[offset + flats.to(r.device)].double()
                    self._expected = self._expected + (values.double().to(picked.device) * picked).sum()
                    self._scale = self._scale + values.double().abs().sum()
                    break
            self._norms.append(torch.tensor(float(norm)))
        self.seconds += time.perf_counter() - started

    def released(self) -> None:
        """After the step's noise is added (``p.grad`` = noisy sum, ``p.summed_grad`` = clipped sum), before ÷ B:
        per tensor Σ x² of the noise x; the noise at the fingerprint's coordinates; ⟨clipped sum, probe⟩."""
        started = time.perf_counter()
        dp = self._optimizer
        std = self.mechanism.step_std(self.releases)
        with torch.no_grad():
            params = list(dp.params)
            clipped = [p.summed_grad.reshape(-1).to(p.grad.dtype) for p in params]
            noises = torch._foreach_sub([p.grad.reshape(-1) for p in params], clipped)
            counts = [n.numel() for n in noises]
            parts = [torch.stack(torch._foreach_norm(noises)).double() ** 2]
            parts.append(torch.stack([noises[t][k] for t, k in self._spots]).double())
            if self._probe is not None:
                for bucket, r in zip(self._buckets, self._probe, strict=True):
                    flat = clipped[bucket[0]] if len(bucket) == 1 else torch.cat([clipped[t] for t in bucket])
                    parts.append((flat * r).sum(dtype=torch.float64).reshape(1))
            values = torch.cat(parts).tolist()
            norms = float(torch.stack(self._norms).max()) if self._norms else 0.0
        k, f = len(counts), len(self._spots)
        squares_, spots_, observed_ = values[:k], values[k : k + f], values[k + f :]
        for name, n, s2 in zip(self._names, counts, squares_, strict=True):
            entry = self.noise.setdefault(name, [0, 0.0, 0.0])
            entry[0] += n
            if std > 0:
                entry[1] += s2 / (std * std)
            else:
                entry[2] = max(entry[2], s2)
        if std > 0:
            self.prints.append([x / std for x in spots_])
        if observed_:
            expected, scale = float(self._expected), float(self._scale)
            residual = abs(sum(observed_) - expected) / scale if scale > 0 else abs(sum(observed_))
            if residual > self.clip_residual:
                self.clip_residual = residual
            if residual > CLIP_TOLERANCE and self.clip_first_bad < 0:
                self.clip_first_bad = self.releases
        self.max_norm = max(self.max_norm, norms)
        self._expected, self._scale, self._norms = 0.0, 0.0, []
        self.releases += 1
        self.seconds += time.perf_counter() - started


SMALL = 1 << 12  # a tensor this small is checked concatenated with its neighbours (kernel launches, not bytes)
BUCKET = 1 << 16  # the most coordinates of small tensors concatenated (x rows: the copy's memory)


def _buckets(sizes: Sequence[int]) -> list[list[int]]:
    """Consecutive small parameters (at most :data:`SMALL` coordinates) grouped while they add up to at most
    :data:`BUCKET`; a larger one alone (concatenating it would copy its per-record gradients for nothing)."""
    out: list[list[int]] = []
    total = 0
    for t, n in enumerate(sizes):
        if out and n <= SMALL and total + n <= BUCKET and sizes[out[-1][-1]] <= SMALL:
            out[-1].append(t)
            total += n
        else:
            out.append([t])
            total = n
    return out


def _spots(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The fingerprint's coordinates: one in each of :data:`FINGERPRINT_GROUPS` tensors spread over the model (the
    largest ones, whose noise every release draws), each at a fixed pseudo-random position."""
    order = sorted(sorted(range(len(sizes)), key=lambda t: (-sizes[t], t))[:FINGERPRINT_GROUPS])
    g = torch.Generator().manual_seed(0xF1)  # fewer tensors than coordinates: several in each
    chosen = [order[i % len(order)] for i in range(FINGERPRINT_GROUPS)] if order else []
    return [(t, int(torch.randint(sizes[t], (1,), generator=g))) for t in chosen]


def _probe(params: Sequence[torch.Tensor], buckets: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The clipping check's fixed random direction, one flat vector per bucket: N(0, 1) per coordinate, from a
    generator of its own (the run's draws and noise are untouched)."""
    out = []
    generators: dict[str, torch.Generator] = {}
    for bucket in buckets:
        first = params[bucket[0]]
        device = first.device
        g = generators.setdefault(str(device), torch.Generator(device=device).manual_seed(0x5EED))
        size = sum(params[t].numel() for t in bucket)
        out.append(torch.randn(size, generator=g, device=device, dtype=first.dtype))
    return out


__all__ = ["CLIP_TOLERANCE", "FINGERPRINT_GROUPS", "Mechanism", "StepChecks"]
