"""What the white-box record-level audit reads of each DP-SGD step's **release** (``attack/release_audit.py``).

The release of a step is the noisy sum of clipped gradients the client's optimizer receives: after the noise and the
division by B (read back × B), before the optimizer. Every bug upstream of the optimizer (sampling, clipping,
noise, a noise that repeats) reaches it; the optimizer (Adam's per-coordinate normalisation) does not blur it.
The auditor knows every record but the canaries (the threat model of DP: everyone else's data), so it also holds the
clipped sum of the records drawn, and reads the canaries alone plus the noise:

    x_i,t = s_i · (release_t[c_i] − records_t[c_i]) / C          (units of the accounted clip bound C)

which is 1 + σ·z for a canary drawn at step t and σ·z otherwise, under the mechanism the accountant charges (Nasr
et al. 2023, "Tight auditing of differentially private machine learning": Dirac gradient canaries, read in the
update). Beside it, per step and tensor, the noise's sum of squares away from every canary coordinate (the release
minus the records' sum there: no canary's coin reaches it), and the noise at a fixed set of those coordinates (its
fingerprint, for a noise that repeats). Only audit runs keep a log; it holds summaries, not the model.

Under banded noise (``privacy.noise_bands``) the release holds the correlated noise C⁻¹z: the log reads it as it is,
and the audit decodes it (``attack/release_view.py`` ``decode_banded``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .dpsgd import RecordDP
from .grad_canaries import Canaries

PRINT_COORDINATES = 512  # noise fingerprint: about this many fixed coordinates per step, spread by size
PRINT_MIN = 16  # and at least this many in each tensor (or all of it): banded noise is checked per tensor on them


class ReleaseLog:
    """One ``dp_sgd`` call's releases at the canaries' coordinates (see the module docstring). ``dp_sgd`` calls
    :meth:`attach` once, :meth:`records` after the records' clipping and before the canaries', and
    :meth:`released` after the division by B; :meth:`save` writes the call."""

    def __init__(self, canaries: Canaries, dp: RecordDP, first_step: int = 0) -> None:
        self.canaries = canaries
        self.dp = dp
        self.first_step = first_step
        self.readings: list[np.ndarray] = []  # per step: x_i (m,)
        self.noise_squares: list[np.ndarray] = []  # per step: Σ noise² per tensor (the exact noise: conformance)
        self.free_squares: list[np.ndarray] = []  # the same, canary coordinates left out (no coin reaches it)
        self.prints: list[np.ndarray] = []  # per step: noise / C at the fingerprint coordinates
        self.tensor_names: list[str] = []
        self.counts = np.zeros(0, dtype=np.int64)  # per tensor: its coordinates
        self.free_counts = np.zeros(0, dtype=np.int64)  # per tensor: its coordinates that hold no canary
        self._params: list[nn.Parameter] = []
        self._at: list[tuple[torch.Tensor, torch.Tensor]] = []  # per tensor: (canary rows, flat coordinates)
        self._spots: list[tuple[int, torch.Tensor]] = []  # fingerprint: (tensor, flat coordinates)
        self._records: torch.Tensor | None = None

    def attach(self, params: Mapping[str, nn.Parameter], order: list[nn.Parameter]) -> None:
        """``params``: the trainable tensors by name; ``order``: the optimizer's parameter order."""
        names = {id(p): n for n, p in params.items()}
        self._params = list(order)
        self.tensor_names = [names[id(p)] for p in order]
        slot = {n: t for t, n in enumerate(self.tensor_names)}
        rows: dict[int, list[tuple[int, int]]] = {}
        for i, (name, flat) in enumerate(zip(self.canaries.names, self.canaries.coordinates, strict=True)):
            if name not in slot:
                raise ValueError(f"audit canary {i} sits on {name!r}, which this DP-SGD call does not train")
            rows.setdefault(slot[name], []).append((i, flat))
        self._at = []
        counts = []
        for t, p in enumerate(self._params):
            pairs = rows.get(t, [])
            self._at.append(
                (
                    torch.tensor([i for i, _ in pairs], dtype=torch.long),
                    torch.tensor([f for _, f in pairs], dtype=torch.long, device=p.device),
                )
            )
            counts.append(p.numel() - len({f for _, f in pairs}))
        self.counts = np.asarray([p.numel() for p in self._params], dtype=np.int64)
        self.free_counts = np.asarray(counts, dtype=np.int64)
        self._spots = _fingerprint(self._params)

    def _gather(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        out = torch.zeros(len(self.canaries.names), dtype=torch.float64)
        for (rows, flat), value in zip(self._at, tensors, strict=True):
            if len(rows) and value is not None:
                out[rows] = value.reshape(-1)[flat].double().cpu()
        return out

    def records(self) -> None:
        """The records' clipped sum at the canary coordinates (Opacus' ``p.summed_grad``; none drawn: 0)."""
        with torch.no_grad():
            self._records = self._gather([getattr(p, "summed_grad", None) for p in self._params])

    def released(self) -> None:
        """The release × B (``p.grad`` after the division by the accounted expected batch B) at the canary
        coordinates, and the noise away from them: release × B − every clipped row's sum (records and canaries)."""
        scale = float(self.dp.expected_batch)
        with torch.no_grad():
            release = [p.grad.detach() * scale if p.grad is not None else None for p in self._params]
            at = self._gather(release)
            records = self._records if self._records is not None else torch.zeros_like(at)
            signs = torch.tensor(self.canaries.signs or [1.0] * len(at), dtype=torch.float64)
            self.readings.append(((signs * (at - records)) / self.dp.clip_norm).numpy().astype(np.float32))
            squares, free = np.zeros(len(self._params)), np.zeros(len(self._params))
            noises: list[torch.Tensor | None] = []
            for t, (p, r) in enumerate(zip(self._params, release, strict=True)):
                if r is None:
                    noises.append(None)
                    continue
                summed = getattr(p, "summed_grad", None)
                noise = (r - summed.to(r.dtype) if summed is not None else r).reshape(-1).double()
                total = float((noise * noise).sum())
                flat = self._at[t][1]
                squares[t] = total
                if len(flat):
                    total -= float((noise[torch.unique(flat)] ** 2).sum())
                free[t] = total
                noises.append(noise)
            self.noise_squares.append(squares)
            self.free_squares.append(free)
            self.prints.append(self._print(noises))
        self._records = None

    def _print(self, noises: list[torch.Tensor | None]) -> np.ndarray:
        """The noise / C at the fingerprint's coordinates (0 where a tensor got no release)."""
        parts = []
        for t, flat in self._spots:
            noise = noises[t]
            parts.append(np.zeros(len(flat)) if noise is None else (noise[flat] / self.dp.clip_norm).cpu().numpy())
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, dtype=np.float32)

    def arrays(self) -> dict[str, Any]:
        """The call as arrays (what :meth:`save` writes)."""
        m = len(self.canaries.names)
        return {
            "readings": np.stack(self.readings) if self.readings else np.zeros((0, m), dtype=np.float32),
            "noise_squares": np.stack(self.noise_squares) if self.noise_squares else np.zeros((0, len(self.counts))),
            "prints": np.stack(self.prints) if self.prints else np.zeros((0, 0), dtype=np.float32),
            "free_squares": np.stack(self.free_squares) if self.free_squares else np.zeros((0, len(self.counts))),
            "counts": self.counts,
            "free_counts": self.free_counts,
            "tensor_names": np.asarray(self.tensor_names),
            "first_step": np.asarray(self.first_step),
            "accounted": np.asarray(
                [self.dp.noise_multiplier, self.dp.clip_norm, self.dp.sample_rate, self.dp.expected_batch]
            ),
            "bands": np.asarray(self.dp.bands),  # > 1: the noise is banded, C⁻¹z (core/banded_noise.py)
            "print_tensor": np.concatenate(
                [np.full(len(flat), t, dtype=np.int64) for t, flat in self._spots] or [np.zeros(0, dtype=np.int64)]
            ),
        }

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **self.arrays())
        tmp.replace(path)
        return path


def _fingerprint(params: list[nn.Parameter]) -> list[tuple[int, torch.Tensor]]:
    """:data:`PRINT_COORDINATES` fixed coordinates spread over the tensors in proportion to their size (canary
    coordinates included: the fingerprint reads the exact noise there, and a model whose every trainable coordinate
    holds a canary, LoRA's adapters, still has one), from a generator of their own (the run's draws and noise are
    untouched)."""
    sizes = np.asarray([p.numel() for p in params], dtype=np.float64)
    if not len(sizes) or sizes.sum() <= 0:
        return []
    share = np.minimum(sizes, np.maximum(PRINT_MIN, np.round(PRINT_COORDINATES * sizes / sizes.sum()))).astype(int)
    g = torch.Generator().manual_seed(0xA0D1)
    out = []
    for t, p in enumerate(params):
        if share[t] >= p.numel():
            picks = list(range(p.numel()))
        else:
            picks = sorted(set(torch.randint(p.numel(), (int(share[t]),), generator=g).tolist()))
        out.append((t, torch.tensor(picks, dtype=torch.long, device=p.device)))
    return out


def load(folder: Path) -> list[dict[str, Any]]:
    """Every call a run logged in ``folder``, in the order of their first steps."""
    files = sorted(folder.glob("steps-*.npz"))
    calls = []
    for f in files:
        with np.load(f, allow_pickle=False) as data:
            calls.append({k: data[k] for k in data.files})
    calls.sort(key=lambda c: int(c["first_step"]))
    return calls


__all__ = ["PRINT_COORDINATES", "ReleaseLog", "load"]
