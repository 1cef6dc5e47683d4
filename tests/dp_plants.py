"""Bugs planted in each step of record-level DP-SGD, at a factor k, each monkeypatched into the real code path
(``core/dpsgd.py``, ``tasks/record_dp.py``, Opacus' optimizer); the accountant keeps reporting the ε it was asked
for. Used by tests/test_audit_plants.py, tests/test_release_audit.py and scripts/release_audit_plants.py.

The settings are the `tiny` preset's federation with 10,000 gradient canaries in client 0 (60 records), ε = 1 at
δ = 1e-5, noise from the run seed (``seeded-not-private``: the plants and their audits are reproducible):

- ``full batch``: q = 1, 4 rounds of 3 local epochs (12 steps);
- ``poisson``: an expected batch of 6 of the 60 records (q = 0.1), 4 rounds of 2 epochs (80 steps);
- ``distributed``: distributed noise over secure aggregation (each of the 3 owners adds a third of the noise's
  variance; one full-batch step a round), 8 rounds;
- ``lora``: the full-batch run training LoRA adapters (rank 4) on a public start, canaries on the adapters;
- ``banded``: distributed noise correlated over 4 rounds (``privacy.noise_bands = 4``, b-min-sep groups of 15
  records, each drawn whole in its group's rounds), 16 rounds: 4 windows per canary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from trustformer.core import dpsgd
from trustformer.tasks import record_dp

DELTA = 1e-5
REPORTED = 1.0
BASE = {
    "privacy.unit": "record",
    "privacy.epsilon": REPORTED,
    "privacy.delta": DELTA,
    "privacy.audit_canaries": 10_000,
    "privacy.noise_source": "seeded-not-private",
    "privacy.checks": False,  # the audit must see each plant, which the every-run checks would stop first
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
    "federation.rounds": 4,
}
SETTINGS = {
    "full batch": {**BASE, "privacy.batch_size": 60, "train.local_epochs": 3},
    "poisson": {**BASE, "privacy.batch_size": 6, "train.local_epochs": 2},
    "distributed": {
        **BASE,
        "privacy.batch_size": 60,
        "privacy.noise": "distributed",
        "secure.mode": "secagg",
        "federation.rounds": 8,
    },
    "banded": {
        **BASE,
        "privacy.batch_size": 60,
        "privacy.noise": "distributed",
        "secure.mode": "secagg",
        "privacy.noise_bands": 4,
        "federation.rounds": 16,
    },
    "lora": {
        **BASE,
        "privacy.batch_size": 60,
        "train.local_epochs": 3,
        "train.init": "public",
        "model.adapters": "lora",
        "model.lora_rank": 4,
    },
}


def plant_sampling(monkeypatch, k: float) -> None:
    """Sampling: the Poisson sampler draws each record at k × the rate q that σ was solved, and ε reported, for."""
    draw = dpsgd.poisson_indices
    monkeypatch.setattr(dpsgd, "poisson_indices", lambda n, rate, g: draw(n, min(1.0, k * rate), g))


def plant_clipping(monkeypatch, k: float) -> None:
    """Clipping: each record's gradient clipped to k·C while the noise stays σ·C (Opacus' noise is
    noise_multiplier × max_grad_norm, so the multiplier is divided by k)."""
    import opacus.optimizers

    original = opacus.optimizers.DPOptimizer

    class ClippedAtKC(original):
        def __init__(self, *args, noise_multiplier, max_grad_norm, **kwargs):
            super().__init__(*args, noise_multiplier=noise_multiplier / k, max_grad_norm=k * max_grad_norm, **kwargs)

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", ClippedAtKC)


def _cut_noise(monkeypatch, k: float, which: Callable[[int], bool]) -> None:
    """The noise added cut to 1/k on the tensors ``which`` picks (by position), fresh (Opacus' ``add_noise``) or
    banded (``dpsgd._add_banded_noise``; the recurrence keeps its full history: only the release is cut)."""
    import opacus.optimizers

    def cut(params) -> None:
        for i, p in enumerate(params):
            if which(i):
                clipped = p.summed_grad.view_as(p).to(p.grad.dtype)
                p.grad = clipped + (p.grad - clipped) / k

    original = opacus.optimizers.DPOptimizer

    class LessNoise(original):
        def add_noise(self):
            super().add_noise()
            cut(self.params)

    banded = dpsgd._add_banded_noise

    def less_banded(dp_optimizer, *args, **kwargs):
        banded(dp_optimizer, *args, **kwargs)
        cut(dp_optimizer.params)

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", LessNoise)
    monkeypatch.setattr(dpsgd, "_add_banded_noise", less_banded)


def plant_noise(monkeypatch, k: float) -> None:
    """Noise on part of the model: on every other tensor the noise Opacus added is cut to 1/k of itself."""
    _cut_noise(monkeypatch, k, lambda i: bool(i % 2))


def plant_noise_all(monkeypatch, k: float) -> None:
    """Noise on the whole model cut to 1/k of itself (σ/k)."""
    _cut_noise(monkeypatch, k, lambda i: True)


def plant_noise_repeat(monkeypatch, k: float) -> None:
    """Noise repeated across rounds: every client's noise generator restarts, every round, from where it stood at
    the start of the first round of its group of ``k`` (the same draws k rounds running: a cached generator state, a
    reseed by round group)."""
    train, step = record_dp.train, record_dp.dp_sgd
    training: dict[str, object] = {}
    saved: dict[object, object] = {}
    calls: dict[object, int] = {}

    def train_as(*args, client=None, **kwargs):
        training["client"] = client
        return train(*args, client=client, **kwargs)

    def repeated(*args, noise, **kwargs):
        client = training.get("client")
        done = calls.get(client, 0)
        if done % int(k) == 0:
            saved[client] = noise.get_state()
        else:
            noise.set_state(saved[client])
        calls[client] = done + 1
        return step(*args, noise=noise, **kwargs)

    monkeypatch.setattr(record_dp, "train", train_as)
    monkeypatch.setattr(record_dp, "dp_sgd", repeated)


def plant_accounting(monkeypatch, k: float) -> None:
    """Accounting, the rate: σ solved, and ε reported, for a sampling rate k × smaller than the sampler's."""
    calibrate, epsilon = record_dp.calibrate, dpsgd.RecordDP.epsilon
    monkeypatch.setattr(record_dp, "calibrate", lambda eps, delta, rate, steps: calibrate(eps, delta, rate / k, steps))

    def reported(self, steps: int, noise_scale: float = 1.0) -> float:  # every ε the run reports goes through it
        return epsilon(dataclasses.replace(self, sample_rate=self.sample_rate / k), steps, noise_scale)

    monkeypatch.setattr(dpsgd.RecordDP, "epsilon", reported)


def plant_accounting_steps(monkeypatch, k: float) -> None:
    """Accounting, the steps: σ solved, and ε reported, for 1/k of the steps taken."""
    calibrate, epsilon = record_dp.calibrate, dpsgd.RecordDP.epsilon
    monkeypatch.setattr(
        record_dp, "calibrate", lambda eps, delta, rate, steps: calibrate(eps, delta, rate, max(1, round(steps / k)))
    )

    def reported(self, steps: int, noise_scale: float = 1.0) -> float:
        return epsilon(self, max(1, round(steps / k)) if steps else 0, noise_scale)

    monkeypatch.setattr(dpsgd.RecordDP, "epsilon", reported)


def plant_min_sep(monkeypatch, k: float) -> None:
    """Banded noise, the sampling: b-min-sep groups ignored, every round draws from all the records (and every
    canary), so a record's windows of the correlated noise overlap; ``k`` is not used (the bug has one size)."""
    import torch

    monkeypatch.setattr(record_dp, "min_sep_groups", lambda n, bands, generator: [torch.arange(n)] * bands)
    monkeypatch.setattr(record_dp, "canaries_of_group", lambda canaries, group, bands: canaries)


PLANTS: dict[str, Callable] = {
    "sampling": plant_sampling,
    "clipping": plant_clipping,
    "noise": plant_noise,
    "noise_all": plant_noise_all,
    "noise_repeat": plant_noise_repeat,
    "accounting": plant_accounting,
    "accounting_steps": plant_accounting_steps,
    "min_sep": plant_min_sep,
}
BANDED_ONLY = {"min_sep"}  # plants of a step only banded noise has
# the step of DP-SGD each plant is in, as the release audit's conformance names it
STEP = {
    "sampling": "sampling",
    "clipping": "clipping",
    "noise": "noise",
    "noise_all": "noise",
    "noise_repeat": "noise",
    "accounting": "accountant",
    "accounting_steps": "accountant",
    "min_sep": "sampling",
}


def true_epsilon(
    plant: str, k: float, sigma: float, rate: float, steps: int, delta: float = DELTA, bands: int = 1
) -> float:
    """The ε of the mechanism that ran (Opacus' RDP accountant) from the σ, q and steps the run reports: clipping
    and noise: σ/k (a record whose gradient lies in the tensors with less noise); sampling: rate min(1, k·q);
    accounting: σ at the sampler's own rate and every step; a noise repeated across rounds is no DP at all (two
    releases with one noise give the difference of two rounds' gradients exactly): ∞. Banded noise (``bands`` = b >
    1) is DP-SGD at σ/‖C‖_col over ⌈T/b⌉ steps; with b-min-sep sampling broken (every record in every step at q =
    1, the banded setting), the Gaussian mechanism whose sensitivity is ‖C·1‖ over the T steps."""
    from trustformer.core.banded_noise import amplified_steps, column_norm, sqrt_coefficients, toeplitz

    coefficients = sqrt_coefficients(bands)
    if plant == "min_sep":
        sensitivity = float(toeplitz(coefficients, steps).sum(dim=1).norm())
        return dpsgd.epsilon_spent(sigma / sensitivity, 1.0, 1, delta)
    sigma, steps = sigma / column_norm(coefficients, steps), amplified_steps(steps, bands)
    if plant in ("clipping", "noise", "noise_all"):
        return dpsgd.epsilon_spent(sigma / k, rate, steps, delta)
    if plant == "sampling":
        return dpsgd.epsilon_spent(sigma, min(1.0, k * rate), steps, delta)
    if plant == "noise_repeat":
        return math.inf
    return dpsgd.epsilon_spent(sigma, rate, steps, delta)


def fresh_plans() -> None:
    """σ is solved once per (ε, δ, q, steps) (``record_dp._calibrated``): a plant in the accountant must not
    find the honest σ cached, nor leave its own behind."""
    record_dp._calibrated.cache_clear()
