"""Record-level differential privacy: DP-SGD (Abadi et al. 2016, Algorithm 1) through Opacus.

Every step of a client's local training draws a **Poisson** batch (each of its n records independently with
probability q = B/n, B the expected batch), computes each record's gradient (Opacus' ``GradSampleModule``
hooks, never hand-written), clips each to L2 norm ≤ C, sums them, adds N(0, σ²C² I) and divides by B
(Opacus' ``DPOptimizer``), then the client's own optimizer (Adam…) steps with that noisy mean.
What leaves the client afterwards (a model, an update, centroids, a coded or masked payload) is
post-processing of these releases, so the guarantee holds for every protocol that exchanges.

σ is calibrated once for the client's **whole run** (every round's steps plus fine-tuning) to the target
(ε, δ) with Opacus' RDP accountant; the same accountant reports the ε spent after each round. The noise and
the Poisson draws come from the operating system's randomness unless the run asks for the recomputable,
non-private ``seeded-not-private`` source (debugging).

Optional, both post-processing of the noisy gradient and so free in privacy:

- ``sam_rho`` > 0 (DP-FedSAM's record-level reading): the step's gradient is taken at w + ρ·ĝ/‖ĝ‖, ĝ the
  previous step's *noisy* gradient (already released), instead of a second private gradient at w;
- ``penalty(model)``: a data-independent term (DP-BLUR-LUS's bounded-update regulariser) whose exact
  gradient is added after the noise.

``Canaries`` (the one-run audit, ``attack/audit.py``): gradient-space canaries (Nasr et al. 2023, "Tight auditing of
differentially private machine learning"), each a record whose gradient is a large spike on one coordinate. An
included canary takes every step a record takes, so that a bug in any step shows in the audit: it is drawn by the
same Poisson draw as the records (one :func:`poisson_indices` call over the records and the included canaries, at
the records' rate q), its per-record gradient row is clipped to C by Opacus' own ``clip_and_accumulate`` (in
physical batches, like the records), and it then gets the same noise and the same division by B. They exist only in
audit runs; a run without canaries draws and computes exactly what it did before they existed.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from . import grad_canaries
from .banded_noise import BandedNoise
from .grad_canaries import Canaries
from .subspace import Subspace

if TYPE_CHECKING:
    from .dp_watch import StepChecks

# Opacus' full backward hooks fire on the embedding layers, whose inputs (token ids) need no gradient: added once,
# for that message only
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)

Batch = tuple[torch.Tensor, torch.Tensor]
ExampleLosses = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RecordDP:
    """The DP-SGD mechanism of one client: σ, C, the expected batch B and the sampling rate q = B/n."""

    noise_multiplier: float
    clip_norm: float
    expected_batch: int
    sample_rate: float
    delta: float
    # privacy.noise_bands: the noise is correlated over this many steps (core/banded_noise.py); 1 = fresh noise
    bands: int = 1
    column_norm: float = 1.0  # ‖C‖_col of the banded factor (1 for fresh noise)

    def epsilon(self, steps: int, noise_scale: float = 1.0) -> float:
        """ε at δ after ``steps`` steps, with the noise scaled by ``noise_scale`` (a colluder removing its share).
        A b-banded mechanism under b-min-sep sampling is DP-SGD at σ/‖C‖_col for ⌈T/b⌉ steps (banded_noise.py)."""
        sigma = self.noise_multiplier * noise_scale / self.column_norm
        return epsilon_spent(sigma, self.sample_rate, -(-steps // self.bands), self.delta)

    @property
    def steps_per_epoch(self) -> int:
        """Opacus' convention for a Poisson loader: 1/q steps make one expected pass over the records."""
        return max(1, round(1.0 / self.sample_rate))


class ReleaseReader(Protocol):
    """What reads each step's release in an audit run (``core/release_log.py:ReleaseLog``): told the parameters
    once, then called after the records' clipping (before the canaries') and after the division by B."""

    def attach(self, params: Mapping[str, nn.Parameter], order: list[nn.Parameter]) -> None: ...

    def records(self) -> None: ...

    def released(self) -> None: ...


def sample_rate(n_records: int, expected_batch: int) -> float:
    if n_records < 1:
        raise ValueError("record-level DP needs at least one training record")
    return min(1.0, expected_batch / n_records)


def calibrate(epsilon: float, delta: float, rate: float, steps: int) -> float:
    """σ such that ``steps`` Poisson-subsampled Gaussian releases at rate q spend ``epsilon`` at ``delta``
    (Opacus' RDP accountant, Mironov et al. 2019)."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():  # the search tries σ so small that the best Rényi order is the largest one
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(
            get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=rate,
                steps=max(1, steps),
                accountant="rdp",
                epsilon_tolerance=0.005,
            )
        )


def epsilon_spent(noise_multiplier: float, rate: float, steps: int, delta: float) -> float:
    """ε at ``delta`` after ``steps`` releases of the mechanism (Opacus' RDP accountant)."""
    if steps <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, rate, steps)]
    return float(accountant.get_epsilon(delta))


def poisson_indices(n_records: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Each record independently with probability q (the sampling the accountant's amplification assumes)."""
    return torch.nonzero(torch.rand(n_records, generator=generator) < rate).flatten()


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _ascend(params: dict[str, nn.Parameter], direction: dict[str, torch.Tensor], rho: float) -> dict[str, torch.Tensor]:
    """SAM's ascent w + ρ·d/‖d‖ along an already released direction; returns the offsets to undo."""
    norm = torch.sqrt(cast(torch.Tensor, sum((d.float() ** 2).sum() for d in direction.values())))
    if not torch.isfinite(norm) or norm <= 0:
        return {}
    offsets = {n: rho * d / norm for n, d in direction.items()}
    with torch.no_grad():
        for n, e in offsets.items():
            params[n].add_(e)
    return offsets


def _add_banded_noise(dp_optimizer: Any, params: dict[str, nn.Parameter], banded: BandedNoise, noise: torch.Generator):
    """Opacus' ``add_noise`` with the fresh N(0, σ²C²) replaced by its banded correlation C⁻¹z (same generator)."""
    from opacus.optimizers.optimizer import _check_processed_flag, _generate_noise, _mark_as_processed

    names = {id(p): n for n, p in params.items()}
    for p in dp_optimizer.params:
        _check_processed_flag(p.summed_grad)
        fresh = _generate_noise(
            std=dp_optimizer.noise_multiplier * dp_optimizer.max_grad_norm,
            reference=p.summed_grad,
            generator=noise,
            secure_mode=dp_optimizer.secure_mode,
        )
        p.grad = (p.summed_grad + banded.correlate(names[id(p)], fresh)).view_as(p)
        _mark_as_processed(p.summed_grad)


def _draw(
    n_records: int, planted: list[int], rate: float, sampler: torch.Generator, checks: StepChecks | None
) -> tuple[torch.Tensor, list[int]]:
    """One Poisson draw over the records and the included canaries, at the records' rate: (the records drawn, the
    canaries drawn)."""
    drawn = poisson_indices(n_records + len(planted), rate, sampler)
    if checks is not None:
        checks.drawn(n_records + len(planted), len(drawn), records=n_records)
    if not planted:
        return drawn, []
    return drawn[drawn < n_records], [planted[int(k) - n_records] for k in drawn[drawn >= n_records]]


def _clip_records(
    model: nn.Module,
    dp_optimizer: Any,
    params: dict[str, nn.Parameter],
    indices: torch.Tensor,
    make_batch: Callable[[torch.Tensor], Batch],
    example_losses: ExampleLosses,
    physical_batch: int,
    subspace: Subspace | None = None,
) -> tuple[float, int]:
    """The drawn records through Opacus' per-record clipping into ``p.summed_grad``, in physical batches (each record
    clipped once; ``subspace``: each record's gradient projected onto it first): (the sum of their losses, how
    many)."""
    loss_sum, seen = 0.0, 0
    pieces = list(torch.split(indices, physical_batch)) if len(indices) else []
    for j, piece in enumerate(pieces):
        if j:
            for p in params.values():
                grad_canaries.set_grad_sample(p, None)
        losses = example_losses(model, *make_batch(piece))
        losses.mean().backward()
        if subspace is not None:
            _project_records(params, subspace)
        dp_optimizer.clip_and_accumulate()
        loss_sum, seen = loss_sum + float(losses.detach().sum()), seen + len(piece)
    return loss_sum, seen


def _basis(subspace: Callable[[], Subspace] | None, params: dict[str, nn.Parameter]) -> Subspace | None:
    """The public subspace of this run of steps (from public pairs, at the model before them), over the trained
    tensors."""
    basis = subspace() if subspace is not None else None
    if basis is not None and list(basis.shapes) != list(params):
        raise ValueError(f"the subspace covers {list(basis.shapes)}, the trained tensors are {list(params)}")
    return basis


def _project_records(params: dict[str, nn.Parameter], subspace: Subspace) -> None:
    """Each record's gradient (Opacus' ``p.grad_sample`` rows) replaced by its projection onto ``subspace``, before the
    clipping (``core/subspace.py``)."""
    held = {n: getattr(p, "grad_sample", None) for n, p in params.items()}  # an attribute Opacus adds
    rows = next(g for g in held.values() if g is not None).shape[0]
    samples = {n: g if g is not None else params[n].new_zeros((rows, *params[n].shape)) for n, g in held.items()}
    projected = subspace.unflatten(subspace.project(subspace.flatten(samples, batch=True)), batch=True)
    for n, p in params.items():
        grad_canaries.set_grad_sample(p, projected[n].to(p.dtype))


def _project_release(params: dict[str, nn.Parameter], subspace: Subspace) -> None:
    """The step's release (``p.grad``: the noisy clipped sum ÷ B) projected onto ``subspace``: post-processing."""
    grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params.items()}
    for n, g in subspace.unflatten(subspace.project(subspace.flatten(grads))).items():
        params[n].grad = g.to(params[n].dtype)


def _step(optimizer: torch.optim.Optimizer, params: dict[str, nn.Parameter], basis: Subspace | None) -> None:
    """The optimizer's step; with a public ``basis``, the move it makes projected onto it (post-processing), so that an
    adaptive optimizer's per-coordinate scaling (Adam's) does not spread the step over every weight again."""
    before = basis.flatten({n: p.detach() for n, p in params.items()}).clone() if basis is not None else None
    optimizer.step()
    if basis is not None and before is not None:
        after = basis.flatten({n: p.detach() for n, p in params.items()})
        with torch.no_grad():
            for n, value in basis.unflatten(before + basis.project(after - before)).items():
                params[n].copy_(value)


def _release(
    dp_optimizer: Any,
    params: dict[str, nn.Parameter],
    banded: BandedNoise | None,
    noise: torch.Generator,
    checks: StepChecks | None,
    release_log: ReleaseReader | None,
    basis: Subspace | None = None,
) -> None:
    """The step's release: N(0, σ²C²) (or its banded correlation) on the clipped sum, ÷ B, watched by the checks
    (the noise as it was added) and logged; then, with a public ``basis``, projected onto it (post-processing)."""
    if banded is None:
        dp_optimizer.add_noise()
    else:
        _add_banded_noise(dp_optimizer, params, banded, noise)
    if checks is not None:
        checks.released()
    dp_optimizer.scale_grad()  # ÷ B, the expected batch
    if release_log is not None:
        release_log.released()
    if basis is not None:
        _project_release(params, basis)


def _add_penalty(
    model: nn.Module, params: dict[str, nn.Parameter], penalty: Callable[[nn.Module], torch.Tensor]
) -> None:
    """A data-independent term's exact gradient, added after the noise (to ``p.grad``, set by the release)."""
    extra = torch.autograd.grad(penalty(model), list(params.values()), allow_unused=True)
    for p, g in zip(params.values(), extra, strict=True):
        if g is not None:
            cast(torch.Tensor, p.grad).add_(g)


def dp_sgd(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    n_records: int,
    make_batch: Callable[[torch.Tensor], Batch],
    example_losses: ExampleLosses,
    *,
    dp: RecordDP,
    steps: int,
    sampler: torch.Generator,
    noise: torch.Generator,
    before_step: Callable[[int], None] | None = None,
    sam_rho: float = 0.0,
    penalty: Callable[[nn.Module], torch.Tensor] | None = None,
    canaries: Canaries | None = None,
    physical_batch: int = 32,
    banded: BandedNoise | None = None,
    checks: StepChecks | None = None,
    release_log: ReleaseReader | None = None,
    subspace: Callable[[], Subspace] | None = None,
) -> dict[str, float]:
    """``steps`` DP-SGD steps on ``model`` with the client's ``optimizer`` (see the module docstring).

    ``make_batch(indices)`` gives the (inputs, targets) of those records on the model's device;
    ``example_losses(model, inputs, targets)`` one loss per record, each depending on its record alone;
    ``before_step(i)`` sets the learning rate of step i; ``physical_batch`` bounds the records whose gradients are
    held at once (a Poisson batch is processed in pieces, each record clipped once); ``banded`` correlates each
    step's noise with the earlier steps' (``core/banded_noise.py``); ``checks`` watches the draws, the clipping,
    the noise and the optimizer's steps (``core/dp_checks.py``); ``release_log`` (audit runs) keeps each step's
    release at the canaries' coordinates (``core/release_log.py``); ``subspace`` (called once, before the steps) a
    public subspace each record's gradient and each release are projected onto (``core/subspace.py``). Returns the
    mean training loss over the records seen, the steps, the records drawn and the time."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    params = _trainable(model)
    basis = _basis(subspace, params)
    wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=False)
    dp_optimizer = DPOptimizer(
        optimizer,
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.clip_norm,
        expected_batch_size=dp.expected_batch,
        loss_reduction="mean",
        generator=noise,
    )
    planted, where, canary_rows = grad_canaries.canary_plan(canaries, dp_optimizer, params, physical_batch)
    if checks is not None:
        checks.attach(dp_optimizer, optimizer, {id(p): n for n, p in params.items()})
    if release_log is not None:
        release_log.attach(params, list(dp_optimizer.params))
    started = time.perf_counter()
    loss_sum, seen, last_grad, drawn_canaries = 0.0, 0, None, 0
    model.train()
    try:
        for i in range(steps):
            if before_step is not None:
                before_step(i)
            indices, chosen = _draw(n_records, planted, dp.sample_rate, sampler, checks)
            offsets: dict[str, torch.Tensor] = _ascend(params, last_grad, sam_rho) if sam_rho > 0 and last_grad else {}
            dp_optimizer.zero_grad(set_to_none=True)
            loss, count = _clip_records(
                model, dp_optimizer, params, indices, make_batch, example_losses, physical_batch, basis
            )
            loss_sum, seen = loss_sum + loss, seen + count
            if release_log is not None:  # the records' clipped sum, before any canary joins it
                release_log.records()
            if chosen:  # the sampled canaries: clipped per record by the same code, into the same sum
                assert canaries is not None  # only canaries are chosen
                grad_canaries.clip_canaries(dp_optimizer, where, canaries, chosen, canary_rows, checks)
                drawn_canaries += len(chosen)
            elif not count:  # an empty Poisson batch still releases noise: on a zero sum
                for p in params.values():
                    grad_canaries.set_grad_sample(p, torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device))
                dp_optimizer.clip_and_accumulate()
            with torch.no_grad():
                for n, e in offsets.items():
                    params[n].sub_(e)
            _release(dp_optimizer, params, banded, noise, checks, release_log, basis)
            if sam_rho > 0:
                last_grad = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
            if penalty is not None:
                _add_penalty(model, params, penalty)
            _step(optimizer, params, basis)
    finally:
        if checks is not None:
            checks.detach()
        dp_optimizer.zero_grad(set_to_none=True)
        wrapped._close()
    elapsed = time.perf_counter() - started
    train_loss = loss_sum / max(seen, 1)
    if not math.isfinite(train_loss):
        raise FloatingPointError(f"DP-SGD diverged (train loss {train_loss}); lower train.lr or privacy.clip_norm")
    return {
        "train_loss": train_loss,
        "steps": steps,
        "dp_records": seen,
        "train_s": elapsed,
        "examples_per_s": seen / elapsed if elapsed > 0 else 0.0,
        **({"dp_canaries": drawn_canaries} if canaries is not None else {}),
    }


__all__ = [
    "RecordDP",
    "ReleaseReader",
    "calibrate",
    "dp_sgd",
    "epsilon_spent",
    "poisson_indices",
    "sample_rate",
]
