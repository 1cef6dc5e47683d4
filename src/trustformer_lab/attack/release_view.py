"""The audited client's releases, as an audit run logs them (``core/release_log.py``), read back for
``attack/release_audit.py``: each DP-SGD step's readings at the canaries' coordinates, the noise's variance per step
and tensor, and its fingerprint.

Under distributed noise the release is the round's secure sum: every owner logs its own noisy sum at the canary
coordinates (the others hold the canaries with every coin "out"), and the audit adds the logs up (:func:`secure_sum`).

**Banded noise** (``privacy.noise_bands`` = b > 1, ``core/banded_noise.py``): the release is x + C⁻¹z, with C the
b-banded Toeplitz matrix of r_0 … r_{b−1}. The auditor knows C, so it reads C·(release) = C·x + z
(:func:`decode_banded`): fresh noise z at σ per step, and a canary drawn at step s shows as r_j at steps s + j, j < b.
Under b-min-sep sampling canary i is drawn only at steps s ≡ i (mod b), so its windows [s, s + b) do not overlap: each
window's matched filter Σ_j r_j (Cx + z)_{s+j} / Σ_j r_j² reads the coin (0 or 1) plus noise of variance σ²/‖r‖², one
reading per window. That is DP-SGD at σ/‖C‖_col for T/b steps, the mechanism the accountant charges (Choquette-Choo et
al. 2023, Thm. 4), and every part of the audit reads the decoded release: the scores, μ̂, the moments, and the noise
checks on the decoded fingerprint (z at fixed coordinates, where a lost history or a missing band shows as noise off
σ). One more check reads the release before decoding: ``min_sep`` (step: sampling), the included canaries' mean
release at the steps of the other groups, where b-min-sep sampling never draws them, against the excluded canaries'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trustformer.config import RunConfig
from trustformer.core.banded_noise import column_norm, sqrt_coefficients, toeplitz
from trustformer.core.grad_canaries import Canaries
from trustformer.core.release_log import load


@dataclass
class Release:
    """The audited client's releases over the run, from its log: ``readings`` T × m (x_i,t, units of C),
    ``noise_var`` T × K (the noise's variance per step and tensor, units of C²), ``prints`` T × P (the noise at
    fixed coordinates, units of C), each canary's tensor, and the σ, C, q, B the accountant charged."""

    readings: np.ndarray
    noise_var: np.ndarray
    counts: np.ndarray
    free_var: np.ndarray  # T × K: the same away from the canary coordinates (what the scores may use)
    prints: np.ndarray
    tensor_names: list[str]
    canary_tensor: np.ndarray
    sigma: float
    clip: float
    rate: float
    batch: float
    step_index: np.ndarray | None = None  # T: each reading's DP-SGD step (the client's count)
    bands: int = 1  # privacy.noise_bands: > 1, the noise released is C⁻¹z (read through :func:`decode_banded`)
    print_tensor: np.ndarray | None = None  # P: the tensor of each fingerprint coordinate
    # decoded banded noise: each reading's noise variance (S × m), the variance of the mean over the readings of
    # each tensor's noise-variance estimate (K), ‖C‖_col
    reading_var: np.ndarray | None = None
    variance_error: np.ndarray | None = None
    column: float = 1.0
    off_group: np.ndarray | None = None  # decoded banded noise: each canary's mean release at other groups' steps

    @property
    def steps(self) -> int:
        """The readings per canary: the DP-SGD steps (decoded banded noise: its windows, T/b)."""
        return int(self.readings.shape[0])

    @property
    def releases(self) -> int:
        """The DP-SGD steps released (T)."""
        return len(self.step_index) if self.step_index is not None else self.steps

    @property
    def effective_sigma(self) -> float:
        """The noise multiplier of the DP-SGD the readings are: σ, or σ/‖C‖_col for decoded banded noise."""
        return self.sigma / self.column


def read_release(folder: Path, canaries: Canaries) -> Release:
    """The log of every DP-SGD call in ``folder``, joined in step order."""
    calls = load(folder)
    if not calls:
        raise FileNotFoundError(f"no release log in {folder}: the run planted no canaries (privacy.audit_canaries)")
    sigma, clip, rate, batch = (float(v) for v in calls[0]["accounted"])
    names = [str(n) for n in calls[0]["tensor_names"]]
    for c in calls[1:]:
        if [str(n) for n in c["tensor_names"]] != names:
            raise ValueError(f"the release log in {folder} changes its tensors between calls")
    counts = calls[0]["counts"].astype(np.float64)
    free = calls[0]["free_counts"].astype(np.float64)
    free_var = np.concatenate([c["free_squares"] for c in calls]) / np.maximum(free, 1) / clip**2
    readings = np.concatenate([c["readings"] for c in calls]).astype(np.float64)
    slot = {n: t for t, n in enumerate(names)}
    tensor = np.asarray([slot[n] for n in canaries.names])
    for k in np.flatnonzero(free == 0):  # every coordinate a canary's: the mean square of its canaries' readings,
        held = tensor == k  # the release alone (a drawn canary adds q·C² to σ²C²: a bias of q/σ² at most)
        if held.any():
            free_var[:, k] = (readings[:, held] ** 2).mean(axis=1)
    return Release(
        readings=readings,
        noise_var=np.concatenate([c["noise_squares"] for c in calls]) / np.maximum(counts, 1) / clip**2,
        counts=counts,
        free_var=free_var,
        prints=np.concatenate([c["prints"] for c in calls]).astype(np.float64),
        tensor_names=names,
        canary_tensor=tensor,
        sigma=sigma,
        clip=clip,
        rate=rate,
        batch=batch,
        step_index=np.concatenate([int(c["first_step"]) + np.arange(len(c["readings"])) for c in calls]),
        bands=int(calls[0]["bands"]) if "bands" in calls[0] else 1,
        print_tensor=calls[0].get("print_tensor", None),
    )


def secure_sum(own: Release, others: list[Release]) -> Release:
    """Distributed noise: the release is the secure sum of every owner's noisy sum (each with its share of the
    noise; only the audited owner's holds canaries). Read at the canary coordinates, the owners' logs add up to it:
    the canaries' contribution plus every share, whose variances add (σ² = Σ σ_k²)."""
    for other in others:
        if other.step_index is None or own.step_index is None or not np.array_equal(other.step_index, own.step_index):
            raise ValueError(
                "the release audit of distributed noise reads every owner's share of every round: an owner sat out "
                "or dropped (set federation.clients_per_round = 0 and no faults for the audit)"
            )
    every = [own, *others]
    return Release(
        readings=np.sum([r.readings for r in every], axis=0),
        noise_var=np.sum([r.noise_var for r in every], axis=0),
        counts=own.counts,
        free_var=np.sum([r.free_var for r in every], axis=0),
        prints=np.sum([r.prints for r in every], axis=0),
        tensor_names=own.tensor_names,
        canary_tensor=own.canary_tensor,
        sigma=math.sqrt(sum(r.sigma**2 for r in every)),
        clip=own.clip,
        rate=own.rate,
        batch=own.batch,
        step_index=own.step_index,
        bands=own.bands,
        print_tensor=own.print_tensor,
    )


def read_run(cfg: RunConfig, canaries: Canaries) -> Release:
    """The release of an audit run (folder ``cfg.out``): the audited client's log, or under distributed noise the
    secure sum of every owner's."""
    from trustformer.tasks.dp_canaries import AUDITED_CLIENT, release_folder

    own = read_release(release_folder(cfg, AUDITED_CLIENT), canaries)
    if cfg.privacy.noise != "distributed":
        return own
    clients = [c for c in range(cfg.federation.clients) if c != AUDITED_CLIENT]
    return secure_sum(own, [read_release(release_folder(cfg, c), canaries) for c in clients])


def decode_banded(rel: Release) -> Release:
    """Banded noise read as the DP-SGD it is accounted as (module docstring): readings per window of b steps, the
    fresh noise z at the fingerprint, its variance per step and tensor. Fresh noise (b = 1) is returned as it is."""
    b, steps = rel.bands, rel.releases
    if b <= 1 or rel.reading_var is not None:
        return rel
    if rel.step_index is None or not np.array_equal(rel.step_index, np.arange(steps)):
        raise ValueError(
            "the release audit of banded noise decodes the run from its first step: the log must hold every step "
            "from 0 (a fresh audit run, no resume)"
        )
    if steps % b or rel.print_tensor is None:
        raise ValueError(
            f"{steps} DP-SGD steps logged: the release audit of banded noise reads whole windows of "
            f"privacy.noise_bands = {b} steps; set federation.rounds to a multiple of {b}"
        )
    r = np.asarray(sqrt_coefficients(b))
    band = toeplitz(tuple(r), steps).numpy()
    decoded = band @ rel.readings  # C·x + z at each canary's coordinate (units of C)
    fresh = band @ rel.prints  # z at the fingerprint's coordinates
    tensors = len(rel.counts)
    counts = np.bincount(rel.print_tensor, minlength=tensors).astype(np.float64)
    noise_var = np.zeros((steps, tensors))
    for k in np.flatnonzero(counts):
        noise_var[:, k] = (fresh[:, rel.print_tensor == k] ** 2).mean(axis=1)
    pooled = np.maximum(noise_var.mean(axis=0), 1e-24)  # σ̂² per tensor, over every step
    windows, m = steps // b, rel.readings.shape[1]
    group = np.arange(m) % b  # canary i is drawn at steps ≡ i (mod b) only (tasks/dp_canaries.py canaries_of_group)
    own = (np.arange(steps)[:, None] % b) == group[None, :]  # T × m: the steps canary i may be drawn at
    readings, weight = np.zeros((windows, m)), np.zeros((windows, m))
    for g in range(b):
        cols = group == g
        for w in range(windows):
            start = g + w * b
            filt = r[: min(b, steps - start)]  # the last window of a late group ends with the run
            readings[w, cols] = filt @ decoded[start : start + len(filt)][:, cols] / (filt @ filt)
            weight[w, cols] = 1.0 / (filt @ filt)
    return Release(
        readings=readings,
        noise_var=noise_var,
        counts=counts,
        free_var=noise_var,
        prints=fresh,
        tensor_names=rel.tensor_names,
        canary_tensor=rel.canary_tensor,
        sigma=rel.sigma,
        clip=rel.clip,
        rate=rel.rate,
        batch=rel.batch,
        step_index=rel.step_index,
        bands=b,
        print_tensor=rel.print_tensor,
        reading_var=weight * pooled[rel.canary_tensor][None, :],
        variance_error=float(weight.mean()) ** 2 * 2 * pooled**2 / np.maximum(counts * steps, 1),
        column=column_norm(tuple(r), steps),
        off_group=np.where(own, 0.0, rel.readings).sum(axis=0) / (steps - steps // b),
    )


def reading_variance(rel: Release) -> np.ndarray:
    """T × m: the measured noise variance (units of C²) at each canary's reading, from the noise of its tensor's
    coordinates that hold no canary (of the step's whole release where every coordinate does): the release alone.
    Decoded banded noise: each window's, from the fresh noise at the fingerprint."""
    if rel.reading_var is not None:
        return np.maximum(rel.reading_var, 1e-24)
    return np.maximum(rel.free_var[:, rel.canary_tensor], 1e-24)


__all__ = ["Release", "decode_banded", "read_release", "read_run", "reading_variance", "secure_sum"]
