"""Record-level DP-SGD (``privacy.unit = "record"``) for the translation task: the client's plan (σ for its whole
run), its random sources, and its local training and fine-tuning through ``core/dpsgd.py``.

A record is one sentence pair. Its loss is its own token-averaged cross-entropy (``pair_losses``), so its
gradient depends on it alone, as per-example clipping requires. Batches are Poisson draws of
``privacy.batch_size`` pairs in expectation (``train.batch_size`` when 0), not the length-bucketed token batches
of non-private training. The run's learning-rate schedule applies per DP step, its warm-up scaled to cover as many
records as without DP (``train.warmup_steps`` × ``train.batch_size`` / the expected DP batch).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any

import torch

from ..config import RunConfig
from ..core import dp_checks
from ..core.accounting import PrivacyBudgetError
from ..core.banded_noise import BandedNoise, amplified_steps, column_norm, min_sep_groups, sqrt_coefficients
from ..core.dp import noise_generator, os_seed
from ..core.dpsgd import RecordDP, calibrate, dp_sgd, sample_rate
from ..core.grad_canaries import Canaries
from ..core.release_log import ReleaseLog
from ..core.shared import derive_seed
from ..core.subspace import public_subspace
from ..data.batching import indexed_batches
from .dp_canaries import canaries_of_group, save_release
from .optim import AdamWBiasCorrected, lr_at, optimizer_steps, set_lr
from .record_dp_checks import check_run, finetune_under_dp, watch


def _register_tied_embedding() -> None:
    """Opacus' per-example gradient of the tied embedding for both its uses (``TiedEmbedding``): a lookup
    (Opacus' embedding rule) or the output projection (its linear rule)."""
    from opacus.grad_sample.embedding import compute_embedding_grad_sample
    from opacus.grad_sample.utils import register_grad_sampler

    from ..models.transformer import TiedEmbedding

    @register_grad_sampler(TiedEmbedding)
    def tied(layer, activations, backprops):
        x = activations[0]
        if x.is_floating_point():
            return {layer.weight: torch.einsum("n...i,n...j->nij", backprops, x.to(backprops.dtype))}
        return compute_embedding_grad_sample(layer, activations, backprops)


@lru_cache(maxsize=1)
def _ready() -> bool:
    _register_tied_embedding()
    return True


def expected_batch(cfg: RunConfig, n_records: int) -> int:
    """The expected Poisson batch: ``privacy.batch_size`` (``train.batch_size`` when 0), at most the records a step
    draws from (the owner's ``n_records``, or its smallest b-min-sep group under ``privacy.noise_bands``; a rate of
    1 draws every record, and the noisy sum is divided by what it holds)."""
    return min(cfg.privacy.batch_size or cfg.train.batch_size, max(1, n_records // bands(cfg)))


def bands(cfg: RunConfig) -> int:
    """b of ``privacy.noise_bands`` (distributed noise; 1 otherwise): noise correlated over b rounds."""
    return cfg.privacy.noise_bands if distributed(cfg) else 1


def step_rate(cfg: RunConfig, n_records: int) -> float:
    """q: each record's chance to be drawn in a step it may take part in (its b-min-sep group's steps)."""
    return sample_rate(max(1, n_records // bands(cfg)), expected_batch(cfg, n_records))


def distributed(cfg: RunConfig) -> bool:
    """``privacy.noise = "distributed"``: one DP-SGD step per round, its noise shared among the owners."""
    return cfg.privacy.noise == "distributed"


def share_count(cfg: RunConfig) -> int:
    """How many shares make the noise: the round's planned participants less ``privacy.dropout_tolerance``."""
    fed = cfg.federation
    return (fed.clients_per_round or fed.clients) - cfg.privacy.dropout_tolerance


def planned_steps(cfg: RunConfig, n_records: int) -> tuple[int, int]:
    """(DP steps per round, DP steps of the client's whole run: every round, plus fine-tuning under
    ``privacy.finetune = "dp"``). Distributed noise takes one step per round: the next needs the pooled noisy
    gradient of this one."""
    per_epoch = max(1, round(1.0 / step_rate(cfg, n_records)))
    per_round = 1 if distributed(cfg) else per_epoch * cfg.train.local_epochs
    tuning = per_epoch * cfg.federation.finetune_epochs if finetune_under_dp(cfg) else 0
    return per_round, per_round * cfg.federation.rounds + tuning


@lru_cache(maxsize=256)
def _calibrated(epsilon: float, delta: float, rate: float, steps: int) -> float:
    """σ for ``steps`` DP-SGD steps at rate q spending (ε, δ): :func:`calibrate`, cached by its four numbers (the
    accountant's search is what costs)."""
    return calibrate(epsilon, delta, rate, steps)


def _sigma(cfg: RunConfig, n_records: int) -> float:
    """σ solved for (privacy.epsilon, privacy.delta) over the whole run of a client holding ``n_records``; with
    ``privacy.noise_bands`` = b, the σ of the fresh noise z that b-banded correlation over the run's T steps makes
    as private as DP-SGD's ⌈T/b⌉ steps at σ/‖C‖_col (``core/banded_noise.py``)."""
    p, b = cfg.privacy, bands(cfg)
    total = planned_steps(cfg, n_records)[1]
    sigma = _calibrated(p.epsilon, p.delta, step_rate(cfg, n_records), amplified_steps(total, b))
    return sigma * column_norm(sqrt_coefficients(b), total)


def plan(cfg: RunConfig, n_records: int, federation_sizes: tuple[int, ...] = ()) -> RecordDP:
    """The client's mechanism: σ solved for (privacy.epsilon, privacy.delta) over its whole run, or given. Under
    distributed noise σ is the noise of the pooled sum, the largest any owner's records need (``federation_sizes``:
    every owner's record count, which the run's partition fixes for all)."""
    p = cfg.privacy
    batch, rate, b = expected_batch(cfg, n_records), step_rate(cfg, n_records), bands(cfg)
    _per_round, total = planned_steps(cfg, n_records)
    if p.noise_multiplier >= 0:
        sigma = p.noise_multiplier
    else:  # distributed: every owner's share must add up to one σ that covers the owner whose records need most
        others = set(federation_sizes) if distributed(cfg) else set()
        sigma = max(_sigma(cfg, n) for n in {n_records, *others})
    mechanism = RecordDP(
        noise_multiplier=sigma,
        clip_norm=p.clip_norm,
        expected_batch=batch,
        sample_rate=rate,
        delta=p.delta,
        bands=b,
        column_norm=column_norm(sqrt_coefficients(b), total),
    )
    if p.noise_multiplier >= 0 and p.on_exceed == "refuse" and (spent := mechanism.epsilon(total)) > p.epsilon:
        raise PrivacyBudgetError(
            f"record-level DP: {total} DP-SGD steps at noise multiplier {sigma:g} and sampling rate {rate:.4g} "
            f"({n_records} records, expected batch {batch}) spend epsilon = {spent:.4g} at "
            f"delta = {p.delta:g}, more than privacy.epsilon = {p.epsilon:g}; set privacy.noise_multiplier = -1 to "
            "solve it, or lower federation.rounds / train.local_epochs"
        )
    return mechanism


def share(cfg: RunConfig, dp: RecordDP) -> RecordDP:
    """The mechanism one owner runs under distributed noise: the same clipping and batch, noise σ/√(m − d), so that
    the m − d shares secure aggregation is guaranteed to sum carry N(0, σ²C²) together."""
    return replace(dp, noise_multiplier=dp.noise_multiplier / math.sqrt(share_count(cfg)))


def generators(cfg: RunConfig, seed: int) -> tuple[torch.Generator, torch.Generator]:
    """(Poisson sampler, noise): the operating system's randomness; from the run seed only with
    ``privacy.noise_source = "seeded-not-private"``."""
    if cfg.privacy.noise_source == "seeded-not-private":
        return (noise_generator(derive_seed(seed, "dp-sampling")), noise_generator(derive_seed(seed, "dp-noise")))
    return noise_generator(os_seed()), noise_generator(os_seed())


def _dp_form(step: Any, strategy: str) -> dict[str, Any]:
    """What a protocol's own local step does under DP-SGD (``LocalStep.dp_form``: SAM's ρ, a penalty)."""
    if step is None:
        return {}
    form = getattr(step, "dp_form", None)
    if form is None:
        raise ValueError(
            f"federation.strategy = {strategy!r} trains with its own local step, which has no "
            "record-level DP form; set privacy.unit = 'client'"
        )
    return dict(form)


def train(
    cfg: RunConfig,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: list,
    *,
    seed: int,
    step: Any = None,
    canaries: Canaries | None = None,
    finetune_epochs: int = 0,
    lr: float | None = None,
    federation_sizes: tuple[int, ...] = (),
    client: int | None = None,
    public: list | None = None,
) -> dict[str, float]:
    """One round of DP-SGD local training (or, with ``finetune_epochs``, DP fine-tuning at the constant ``lr``
    after the last round); returns the usual training metrics plus σ, q, the client's DP steps so far and the ε
    they spent (``record_epsilon``, Opacus' RDP accountant). Under distributed noise a round is one plain SGD step
    with this owner's share of the noise (:func:`distributed_step`). ``canaries``: the audit's, planted here.
    ``privacy.checks``: the run so far is checked after the steps (:func:`check_run`), ``client`` named if one fails.
    ``public``: encoded public pairs, whose gradients span the subspace of ``privacy.subspace_dim`` (needed then)."""
    _ready()
    if distributed(cfg) and not finetune_epochs:
        return distributed_step(
            cfg, model, optimizer, pairs, seed=seed, canaries=canaries, sizes=federation_sizes, client=client
        )
    t = cfg.train
    dp = plan(cfg, len(pairs), federation_sizes)
    per_round, total = planned_steps(cfg, len(pairs))
    if finetune_epochs:
        done, steps = per_round * cfg.federation.rounds, dp.steps_per_epoch * finetune_epochs
        set_lr(optimizer, lr if lr is not None else t.lr)
        before_step = None
    else:
        done, steps = optimizer_steps(optimizer), per_round
        before_step = _schedule(cfg, optimizer, t.lr * cfg.privacy.lr_scale, done, total, dp.expected_batch)
    if isinstance(optimizer, AdamWBiasCorrected):  # DP-AdamBC: the noise's variance per mean-gradient coordinate
        for group in optimizer.param_groups:
            group["noise_variance"] = (dp.noise_multiplier * dp.clip_norm / dp.expected_batch) ** 2
            group["floor"] = cfg.privacy.adam_floor
    watched = watch(cfg, dp)
    planted = None if finetune_epochs else canaries
    log = ReleaseLog(planted, dp, first_step=done) if planted is not None else None
    out = run_steps(
        cfg,
        model,
        optimizer,
        pairs,
        dp,
        steps,
        seed,
        before_step,
        _dp_form(step, cfg.federation.strategy),
        planted,
        checks=watched,
        release_log=log,
        public=public,
    )
    save_release(cfg, log, client)
    out = _with_accounting(out, dp, done + steps, optimizer)
    check_run(cfg, optimizer, watched, out, dp, charged_before=done, client=client)
    return out


DISTRIBUTED_STEPS = "distributed_dp_steps"  # the client optimizer's count of its distributed rounds (checkpointed)
NOISE_HISTORY = "distributed_noise_history"  # privacy.noise_bands > 1: its last b − 1 correlated shares (checkpointed)


def distributed_step(
    cfg: RunConfig,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: list,
    *,
    seed: int,
    canaries: Canaries | None,
    sizes: tuple[int, ...],
    client: int | None = None,
) -> dict[str, float]:
    """One DP-SGD step of distributed noise: the clipped sum of this owner's Poisson batch plus N(0, σ²C²/(m − d)),
    ÷ B, and a plain SGD step at ``privacy.distributed_lr`` from the global model. The payload is then linear in
    the noisy sum, so the unweighted mean secure aggregation unmasks is w − η·(Σ clipped + N(0, σ²C²))/(m·B):
    central DP-SGD on the union of the m owners' batches. The client's own optimizer is left as it is, except
    for its count of these steps, kept in its state for accounting and resume.

    With ``privacy.noise_bands`` = b > 1, round t draws from the owner's b-min-sep group t mod b only, and its
    share is correlated with its last b − 1 shares (``core/banded_noise.py``), whose history is kept in the same
    state."""
    dp = plan(cfg, len(pairs), sizes)
    _per_round, total = planned_steps(cfg, len(pairs))
    group = optimizer.param_groups[0]
    done = int(group.get(DISTRIBUTED_STEPS, 0))
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.privacy.distributed_lr)
    pooled = dp.expected_batch * (cfg.federation.clients_per_round or cfg.federation.clients)
    before_step = _schedule(cfg, sgd, cfg.privacy.distributed_lr, done, total, pooled)
    mine = share(cfg, dp)
    banded, owned = None, len(pairs)
    if dp.bands > 1:
        groups = min_sep_groups(len(pairs), dp.bands, noise_generator(derive_seed(cfg.seed, "dp-min-sep-groups")))
        pairs = [pairs[int(i)] for i in groups[done % dp.bands]]
        banded = BandedNoise(sqrt_coefficients(dp.bands), group.setdefault(NOISE_HISTORY, {}))
        canaries = canaries_of_group(canaries, done % dp.bands, dp.bands)
    watched = watch(cfg, dp, shares=share_count(cfg), first_step=done, records=owned)
    log = ReleaseLog(canaries, mine, first_step=done) if canaries is not None else None
    out = run_steps(
        cfg, model, sgd, pairs, mine, 1, seed, before_step, {}, canaries, banded, checks=watched, release_log=log
    )
    save_release(cfg, log, client)
    group[DISTRIBUTED_STEPS] = done + 1
    out = _with_accounting(out, dp, done + 1, sgd)
    out["dp_share_sigma"] = mine.noise_multiplier
    check_run(cfg, optimizer, watched, out, dp, charged_before=done, client=client)
    return out


def _schedule(cfg: RunConfig, optimizer: torch.optim.Optimizer, peak: float, done: int, total: int, batch: int):
    """The run's learning-rate schedule per DP step, its warm-up covering as many records as without DP. The
    cosine reaches ``train.min_lr`` one step after the run's last DP step, not at it: every step is charged to ε,
    and a step at a learning rate of 0 would spend budget and move nothing (with few large batches, a tenth of
    the run's ε or more)."""
    t = cfg.train
    warmup = round(t.warmup_steps * t.batch_size / batch)

    def before_step(i: int) -> None:
        set_lr(
            optimizer,
            lr_at(
                done + i + 1,
                lr=peak,
                schedule=t.schedule,
                warmup_steps=warmup,
                decay_steps=t.decay_steps or total + 1,
                min_lr=t.min_lr,
            ),
        )

    return before_step


def run_steps(
    cfg,
    model,
    optimizer,
    pairs,
    dp: RecordDP,
    steps: int,
    seed: int,
    before_step,
    form,
    canaries,
    banded=None,
    *,
    checks: dp_checks.StepChecks | None = None,
    release_log: ReleaseLog | None = None,
    public: list | None = None,
):
    """``steps`` DP-SGD steps of ``dp`` on ``pairs`` (``core/dpsgd.py``), from the client's random sources; in the
    subspace of ``public``'s gradients where ``privacy.subspace_dim`` > 0 (:func:`public_subspace`)."""
    _ready()
    t = cfg.train
    device = next(model.parameters()).device
    pad_id = model.config.pad_id

    make_batch = indexed_batches(pairs, pad_id, device)

    def example_losses(m: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        net: Any = m  # the translation model
        return net.pair_losses(src, tgt, label_smoothing=t.label_smoothing)

    sampler, noise = generators(cfg, seed)
    torch.manual_seed(seed)  # dropout masks
    subspace = None
    if cfg.privacy.subspace_dim:
        if not public:
            raise ValueError("privacy.subspace_dim > 0 needs public pairs to estimate the subspace from")
        public_batch, count = indexed_batches(public, pad_id, device), min(cfg.privacy.subspace_pairs, len(public))

        def loss_of(i: int) -> torch.Tensor:  # public pair i's loss
            return example_losses(model, *public_batch(torch.tensor([i])))[0]

        subspace = partial(public_subspace, model, loss_of, count, cfg.privacy.subspace_dim)
    return dp_sgd(
        model,
        optimizer,
        len(pairs),
        make_batch,
        example_losses,
        dp=dp,
        steps=steps,
        sampler=sampler,
        noise=noise,
        before_step=before_step,
        sam_rho=form.get("sam_rho", 0.0),
        penalty=form.get("penalty"),
        canaries=canaries,
        banded=banded,
        checks=checks,
        release_log=release_log,
        subspace=subspace,
    )


def _with_accounting(out: dict[str, float], dp: RecordDP, spent: int, optimizer) -> dict[str, float]:
    out.update(
        record_epsilon=dp.epsilon(spent),
        dp_sigma=dp.noise_multiplier,
        dp_bands=dp.bands,
        dp_column_norm=dp.column_norm,
        dp_sample_rate=dp.sample_rate,
        dp_steps=spent,
        lr=optimizer.param_groups[0]["lr"],
    )
    return out


__all__ = [
    "expected_batch",
    "generators",
    "plan",
    "planned_steps",
    "train",
]
