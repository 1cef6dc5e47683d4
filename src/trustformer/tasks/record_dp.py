"""Record-level DP-SGD (``privacy.unit = "record"``) for the translation task: the client's plan (σ for its whole
run), its random sources, and its local training and fine-tuning through ``core/dpsgd.py``.

A record is one sentence pair. Its loss is its own token-averaged cross-entropy (``pair_losses``), so its
gradient depends on it alone, as per-example clipping requires. Batches are Poisson draws of
``privacy.batch_size`` pairs in expectation (``train.batch_size`` when 0), not the length-bucketed token batches
of non-private training. The run's learning-rate schedule applies per DP step, its warm-up scaled to cover as many
records as without DP (``train.warmup_steps`` × ``train.batch_size`` / the expected DP batch).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import re
import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig, parse_run_config
from ..core.accounting import PrivacyBudgetError
from ..core.dp import noise_generator, os_seed
from ..core.banded_noise import BandedNoise, amplified_steps, column_norm, min_sep_groups, sqrt_coefficients
from ..core import dp_checks
from ..core.dpsgd import Canaries, RecordDP, calibrate, dp_sgd, sample_rate
from ..core.release_log import ReleaseLog
from ..core.shared import derive_seed
from ..data.batching import pad_sequences
from .optim import AdamWBiasCorrected, lr_at, optimizer_steps, set_lr

AUDITED_CLIENT = 0  # privacy.audit_canaries: the client whose data holds the canaries


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


def finetune_under_dp(cfg: RunConfig) -> bool:
    """``privacy.finetune = "dp"``: the owner's fine-tuning after the last exchange is DP-SGD, charged to ε. By
    default it is plain training that spends nothing: the fine-tuned model never leaves the owner's machine."""
    return cfg.privacy.finetune == "dp"


def planned_steps(cfg: RunConfig, n_records: int) -> tuple[int, int]:
    """(DP steps per round, DP steps of the client's whole run: every round, plus fine-tuning under
    ``privacy.finetune = "dp"``). Distributed noise takes one step per round: the next needs the pooled noisy
    gradient of this one."""
    per_epoch = max(1, round(1.0 / step_rate(cfg, n_records)))
    per_round = 1 if distributed(cfg) else per_epoch * cfg.train.local_epochs
    tuning = per_epoch * cfg.federation.finetune_epochs if finetune_under_dp(cfg) else 0
    return per_round, per_round * cfg.federation.rounds + tuning


@lru_cache(maxsize=256)
def _sigma(cfg_json: str, n_records: int) -> float:
    """σ solved for (privacy.epsilon, privacy.delta) over the whole run of a client holding ``n_records``; with
    ``privacy.noise_bands`` = b, the σ of the fresh noise z that b-banded correlation over the run's T steps makes
    as private as DP-SGD's ⌈T/b⌉ steps at σ/‖C‖_col (``core/banded_noise.py``)."""
    cfg = parse_run_config(cfg_json)
    p, b = cfg.privacy, bands(cfg)
    total = planned_steps(cfg, n_records)[1]
    sigma = calibrate(p.epsilon, p.delta, step_rate(cfg, n_records), amplified_steps(total, b))
    return sigma * column_norm(sqrt_coefficients(b), total)


@lru_cache(maxsize=64)
def _plan(cfg_json: str, n_records: int, federation_sizes: tuple[int, ...]) -> RecordDP:
    cfg = parse_run_config(cfg_json)
    p = cfg.privacy
    batch, rate, b = expected_batch(cfg, n_records), step_rate(cfg, n_records), bands(cfg)
    _per_round, total = planned_steps(cfg, n_records)
    if p.noise_multiplier >= 0:
        sigma = p.noise_multiplier
    else:  # distributed: every owner's share must add up to one σ that covers the owner whose records need most
        sigma = max(_sigma(cfg_json, n) for n in {n_records, *federation_sizes})
    mechanism = RecordDP(
        noise_multiplier=sigma,
        clip_norm=p.clip_norm,
        expected_batch=batch,
        sample_rate=rate,
        delta=p.delta,
        bands=b,
        column_norm=column_norm(sqrt_coefficients(b), total),
    )
    spent = mechanism.epsilon(total)
    if p.noise_multiplier >= 0 and spent > p.epsilon and p.on_exceed == "refuse":
        raise PrivacyBudgetError(
            f"record-level DP: {total} DP-SGD steps at noise multiplier {sigma:g} and sampling rate {rate:.4g} "
            f"({n_records} records, expected batch {batch}) spend epsilon = {spent:.4g} at "
            f"delta = {p.delta:g}, more than privacy.epsilon = {p.epsilon:g}; set privacy.noise_multiplier = -1 to "
            "solve it, or lower federation.rounds / train.local_epochs"
        )
    return mechanism


def plan(cfg: RunConfig, n_records: int, federation_sizes: tuple[int, ...] = ()) -> RecordDP:
    """The client's mechanism: σ solved for (privacy.epsilon, privacy.delta) over its whole run, or given. Under
    distributed noise σ is the noise of the pooled sum, the largest any owner's records need (``federation_sizes``:
    every owner's record count, which the run's partition fixes for all)."""
    return _plan(cfg.to_json(), n_records, tuple(sorted(federation_sizes)) if distributed(cfg) else ())


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


def parameter_group(name: str) -> str:
    """The audit's parameter group of a tensor: its name with layer indices starred, so that one group holds the
    same tensor of every layer (``decoder.layers.*.ffn.fc1.bias``)."""
    return re.sub(r"\.\d+\.", ".*.", name)


def _gradient_moments(
    model: torch.nn.Module, reference: list, batch: int = 4
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(mean, mean square) per coordinate of each trainable tensor's gradient over batches of ``reference`` pairs
    (public data, not any client's): which way real records push each coordinate, and how much they move it."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    squares = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    net: Any = model  # the translation model (config.pad_id, pair_losses)
    pad_id = net.config.pad_id
    was_training = model.training
    model.eval()
    batches = [reference[i : i + batch] for i in range(0, len(reference), batch)]
    for chunk in batches:
        src = pad_sequences([s for s, _ in chunk], pad_id)
        tgt = pad_sequences([g for _, g in chunk], pad_id)
        grads = torch.autograd.grad(net.pair_losses(src, tgt).mean(), list(params.values()), allow_unused=True)
        for (n, _p), g in zip(params.items(), grads):
            if g is not None:
                sums[n] += g.double()
                squares[n] += g.double() ** 2
    model.train(was_training)
    count = max(len(batches), 1)
    return (
        {n: (v / count).flatten() for n, v in sums.items()},
        {n: (v / count).flatten() for n, v in squares.items()},
    )


def _allocate(total: int, capacity: dict[str, int]) -> dict[str, int]:
    """``total`` canaries spread evenly over the groups, none holding more than its coordinates."""
    counts = dict.fromkeys(capacity, 0)
    left = total
    while left > 0:
        open_groups = [g for g in capacity if counts[g] < capacity[g]]
        if not open_groups:
            break
        each = max(1, left // len(open_groups))
        for g in open_groups:
            take = min(each, capacity[g] - counts[g], left)
            counts[g] += take
            left -= take
            if not left:
                break
    return counts


def audit_canaries(cfg: RunConfig, model: torch.nn.Module, reference: list) -> Canaries | None:
    """The gradient canaries of an audit run (``privacy.audit_canaries`` = m), where real records do not hide them:
    spread evenly over every parameter group (:func:`parameter_group`), so noise missing from any one group shows,
    and within a group on the coordinates the ``reference`` pairs (public data) move least (Dirac canaries at
    low-variance coordinates, Nasr et al. 2023). Each canary pushes its coordinate **against** the way the
    reference pairs push it, so that what real records do to it (which an adaptive optimizer such as Adam turns into
    steps of the full learning rate) cannot pass for the canary. ``model`` is the run's initial model; the placement,
    directions and a fair coin per canary derive from it and the run seed, so the auditor recomputes them."""
    m = cfg.privacy.audit_canaries
    if not m:
        return None
    means, moments = _gradient_moments(model, reference)
    groups: dict[str, list[str]] = {}
    for name in moments:
        groups.setdefault(parameter_group(name), []).append(name)
    rng = random.Random(derive_seed(cfg.seed, "audit-canaries"))
    counts = _allocate(m, {g: sum(moments[n].numel() for n in names) for g, names in groups.items()})
    located: list[tuple[str, int, str]] = []
    for group, names in groups.items():
        values = torch.cat([moments[n] for n in names])
        starts = list(itertools.accumulate([0] + [moments[n].numel() for n in names]))
        order = torch.randperm(len(values), generator=torch.Generator().manual_seed(rng.randrange(2**62)))
        quiet = order[torch.sort(values[order], stable=True).indices[: counts[group]]]  # ties: seeded order
        for f in quiet.tolist():
            t = bisect.bisect_right(starts, f) - 1
            located.append((names[t], f - starts[t], group))
    included = tuple(rng.random() < 0.5 for _ in located)
    # the gradient's sign is the direction of descent's opposite: a canary whose gradient has the data's mean
    # gradient's opposite sign moves its coordinate against the data (a zero mean: pushed down)
    return Canaries(
        names=tuple(n for n, _, _ in located),
        coordinates=tuple(c for _, c, _ in located),
        included=included,
        groups=tuple(g for _, _, g in located),
        signs=tuple(-1.0 if float(means[n][c]) > 0 else 1.0 for n, c, _ in located),
        kinds=tuple(parameter_kinds(model)[n] for n, _, _ in located),
    )


def parameter_kinds(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter's kind, its layer type and name (``LayerNorm.bias``): a second grouping for the audit, where
    a bug in one layer type's per-record gradients would show across every tensor of that kind."""
    return {
        f"{module_name}.{name}" if module_name else name: f"{type(module).__name__}.{name}"
        for module_name, module in model.named_modules()
        for name, _ in module.named_parameters(recurse=False)
    }


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
) -> dict[str, float]:
    """One round of DP-SGD local training (or, with ``finetune_epochs``, DP fine-tuning at the constant ``lr``
    after the last round); returns the usual training metrics plus σ, q, the client's DP steps so far and the ε
    they spent (``record_epsilon``, Opacus' RDP accountant). Under distributed noise a round is one plain SGD step
    with this owner's share of the noise (:func:`distributed_step`). ``canaries``: the audit's, planted here.
    ``privacy.checks``: the run so far is checked after the steps (:func:`check_run`), ``client`` named if one fails."""
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
    banded = None
    if dp.bands > 1:
        groups = min_sep_groups(len(pairs), dp.bands, noise_generator(derive_seed(cfg.seed, "dp-min-sep-groups")))
        pairs = [pairs[int(i)] for i in groups[done % dp.bands]]
        banded = BandedNoise(sqrt_coefficients(dp.bands), group.setdefault(NOISE_HISTORY, {}))
        canaries = canaries_of_group(canaries, done % dp.bands, dp.bands)
    watched = watch(cfg, dp, shares=share_count(cfg), first_step=done)
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


def watch(cfg: RunConfig, dp: RecordDP, *, shares: int = 1, first_step: int = 0) -> dp_checks.StepChecks | None:
    """The checks' watcher of one DP-SGD call (``privacy.checks``), expecting what the accountant charges for:
    clipping at C, noise σ·C (each of the ``shares`` owners σ·C/√shares; banded: the recurrence's std at each of
    the owner's steps from ``first_step``) and draws at rate q."""
    if not cfg.privacy.checks:
        return None
    return dp_checks.StepChecks(
        dp_checks.Mechanism(
            clip_norm=dp.clip_norm,
            noise_std=dp.noise_multiplier * dp.clip_norm / math.sqrt(shares),
            sample_rate=dp.sample_rate,
            coefficients=sqrt_coefficients(dp.bands) if dp.bands > 1 else (1.0,),
            first_step=first_step,
        )
    )


def check_run(
    cfg: RunConfig,
    optimizer: torch.optim.Optimizer,
    watched: dp_checks.StepChecks | None,
    out: dict[str, float],
    dp: RecordDP,
    *,
    charged_before: int,
    client: int | None,
) -> None:
    """Add the call ``watched`` to the client's run record (its optimizer's first parameter group, saved with its
    state), test the run so far against what the accountant charged (``out``), put the results in ``out`` and
    raise :class:`~trustformer.core.dp_checks.DPCheckError` if a check fails (``core/dp_checks.py``)."""
    if watched is None:
        return
    started = time.perf_counter()
    group = optimizer.param_groups[0]
    record = dp_checks.merge(group.get(dp_checks.RECORD_KEY) or dp_checks.new_record(charged_before), watched)
    group[dp_checks.RECORD_KEY] = record
    reported = dp_checks.Reported(
        steps=int(out["dp_steps"]),
        epsilon=float(out["record_epsilon"]),
        noise_multiplier=dp.noise_multiplier,
        sample_rate=dp.sample_rate,
        delta=dp.delta,
        bands=dp.bands,
        column_norm=dp.column_norm,
    )
    looks = cfg.federation.rounds + (1 if finetune_under_dp(cfg) else 0)
    results = dp_checks.evaluate(record, reported, clients=cfg.federation.clients, looks=looks)
    out.update(dp_checks.metrics(results))
    out["dpcheck_s"] = watched.seconds + time.perf_counter() - started
    dp_checks.raise_failures(results, client=client, step=reported.steps)


def canaries_of_client(cfg: RunConfig, canaries: Canaries | None, client: int | None) -> Canaries | None:
    """The audit's canaries as ``client`` trains with them: all of them in the audited client. Under distributed noise
    every other owner holds them too, every coin "out" (it draws and adds nothing, and steps as without them), so
    that its DP-SGD logs its share of the release at their coordinates: the release the audit reads is the secure
    sum of every owner's share (``attack/release_audit.py``)."""
    if canaries is None or client == AUDITED_CLIENT:
        return canaries
    if distributed(cfg):
        return replace(canaries, included=(False,) * len(canaries.included))
    return None


def canaries_of_group(canaries: Canaries | None, group: int, bands: int) -> Canaries | None:
    """The audit's canaries take every step a record takes: under b-min-sep sampling canary c belongs to group
    c mod b, and a round of another group cannot draw it."""
    if canaries is None:
        return None
    included = tuple(inc and c % bands == group for c, inc in enumerate(canaries.included))
    return replace(canaries, included=included)


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
):
    """``steps`` DP-SGD steps of ``dp`` on ``pairs`` (``core/dpsgd.py``), from the client's random sources."""
    _ready()
    t = cfg.train
    device = next(model.parameters()).device
    pad_id = model.config.pad_id

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = [pairs[int(i)] for i in indices]
        return (
            pad_sequences([s for s, _ in chosen], pad_id).to(device),
            pad_sequences([g for _, g in chosen], pad_id).to(device),
        )

    def example_losses(m: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        net: Any = m  # the translation model
        return net.pair_losses(src, tgt, label_smoothing=t.label_smoothing)

    sampler, noise = generators(cfg, seed)
    torch.manual_seed(seed)  # dropout masks
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
    )


RELEASE_FOLDER = "audit-release"  # an audit run's release log (core/release_log.py), in the run's folder


def release_folder(cfg: RunConfig, client: int | None = None) -> Path:
    """Where a client's DP-SGD calls log their releases (``attack/release_audit.py`` reads them); without
    ``client``, the folder of every client's."""
    root = Path(cfg.out) / RELEASE_FOLDER
    return root if client is None else root / f"client-{client}"


def save_release(cfg: RunConfig, log: ReleaseLog | None, client: int | None) -> None:
    """Write one DP-SGD call's release log, named by its first step (a resumed round rewrites its own file)."""
    if log is not None:
        log.save(release_folder(cfg, AUDITED_CLIENT if client is None else client) / f"steps-{log.first_step:06d}.npz")


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


def _mechanism(reported: dict[str, Any], delta: float) -> RecordDP:
    """The mechanism a client's summary entry describes (for its ε under other threats)."""
    return RecordDP(
        noise_multiplier=reported["noise_multiplier"],
        clip_norm=1.0,
        expected_batch=1,
        sample_rate=reported["sample_rate"],
        delta=delta,
        bands=reported.get("bands", 1),
        column_norm=reported.get("column_norm", 1.0),
    )


def distributed_summary(cfg: RunConfig, per: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What distributed noise guarantees, per threat (docs/privacy.md "Distributed noise"): against the server (and
    any owner, who sees only the released models) each owner's ε; against the server colluding with one owner,
    who removes its own share, the ε of the noise left, σ·√((k − 1)/k) for the k shares the clients insist on."""
    k, p = share_count(cfg), cfg.privacy
    colluding = {  # None: with one share, the owner who added it removes all the noise
        str(c): _mechanism(v, p.delta).epsilon(v["steps"], noise_scale=math.sqrt((k - 1) / k)) if k > 1 else None
        for c, v in sorted(per.items())
    }
    worst = [e for e in colluding.values() if e is not None]
    return {
        "shares": k,
        "dropout_tolerance": cfg.privacy.dropout_tolerance,
        "steps_per_round": 1,
        "noise_bands": p.noise_bands,
        **(
            {
                "banded_accounting": "b-min-sep sampling: DP-SGD at sigma / column_norm for ceil(steps / noise_bands) "
                "steps (Choquette-Choo et al. 2023, Thm. 4); the banded square root of the prefix sum (Kalinin & "
                "Lampert 2024)"
            }
            if p.noise_bands > 1
            else {}
        ),
        "epsilon_server_and_one_owner": max(worst) if worst else None,
        "epsilon_server_and_one_owner_by_client": colluding,
        "encoding": "continuous Gaussian shares, then secure aggregation's fixed point (secure.secagg_scale_bits)",
    }


def summary(cfg: RunConfig, records: list[dict[str, Any]], final: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``summary.json["privacy"]`` of a record-level run: per client the ε its DP-SGD steps spent (fine-tuning
    included under ``privacy.finetune = "dp"``), σ, q and steps, from what each client reported; ``epsilon`` is the
    largest. ``finetune`` says what the guarantee covers of the owners' fine-tuning. ``checks``: each client's
    ``privacy.checks`` after its last round (``core/dp_checks.py``)."""
    per: dict[int, dict[str, Any]] = {}
    for r in records:
        if "record_epsilon" in r and "client" in r:
            per[int(r["client"])] = {
                "epsilon": r["record_epsilon"],
                "noise_multiplier": r["dp_sigma"],
                "sample_rate": r["dp_sample_rate"],
                "steps": r["dp_steps"],
                "bands": r.get("dp_bands", 1),
                "column_norm": r.get("dp_column_norm", 1.0),
                **({"checks": dp_checks.from_metrics(r)} if "dpcheck_failed" in r else {}),
            }
    for client, metrics in final.items():
        tuned = metrics.get("finetune_record_epsilon")
        if tuned is not None and client in per:
            per[client]["epsilon"] = max(per[client]["epsilon"], tuned)
    p = cfg.privacy
    return {
        "unit": "record",
        "noise": p.noise,
        **(distributed_summary(cfg, per) if distributed(cfg) else {}),
        "epsilon": max((v["epsilon"] for v in per.values()), default=None),
        "target_epsilon": p.epsilon,
        "delta": p.delta,
        "clip_norm": p.clip_norm,
        "expected_batch": cfg.privacy.batch_size or cfg.train.batch_size,  # configured; each client at most its records
        "accountant": "opacus RDP (Mironov et al. 2019)",
        "clients": {str(c): per[c] for c in sorted(per)},
        "noise_source": p.noise_source,
        "private": p.noise_source == "os" and not p.audit_canaries,
        "audit_canaries": p.audit_canaries,
        "finetune": _finetune_statement(cfg),
        "checks": _checks_statement(cfg, per),
    }


def _checks_statement(cfg: RunConfig, per: dict[int, dict[str, Any]]) -> dict[str, Any] | str:
    """What ``privacy.checks`` checked, at what false-alarm rate, and whether every client passed."""
    if not cfg.privacy.checks:
        return "off (privacy.checks = false)"
    verdicts = [c["verdict"] for v in per.values() for c in v.get("checks", [])]
    return {
        "passed": bool(verdicts) and "fail" not in verdicts,
        "false_alarm_rate": dp_checks.RUN_ALPHA,
        "statistics": dict(dp_checks.WHAT),
        "alpha": "the statistical checks (sampling_rate, sampling_dispersion, noise) share the run's false-alarm "
        "rate, Bonferroni over clients x 3 checks x rounds (each round tests the run so far) x tensors (noise); "
        "steps, clipping, noise_fresh and accountant are exact up to rounding three orders below their thresholds",
        "not_seen": dp_checks.NOT_SEEN,
        "skipped_under_this_config": _skipped(cfg),
    }


def _skipped(cfg: RunConfig) -> list[str]:
    out = []
    if finetune_under_dp(cfg):
        out.append("DP fine-tuning is checked by the owner (a failure stops it) but not reported here")
    if bands(cfg) > 1:
        out.append(
            "noise_bands: the noise check tests each release's marginal std (the banded recurrence's); the "
            "correlation across rounds and the b-min-sep grouping are taken as built, and the accountant check "
            "recomputes the amplified mechanism (sigma / column norm, ceil(T / b) steps) as the RDP side does"
        )
    if distributed(cfg):
        out.append(
            "distributed noise: each owner checks its own share (std sigma C / sqrt(shares)); that the shares of "
            "the round add up to sigma C in the unmasked sum is secure aggregation's, not checked here"
        )
    return out


def _finetune_statement(cfg: RunConfig) -> str:
    if not cfg.federation.finetune_epochs:
        return "none"
    if finetune_under_dp(cfg):
        return "DP-SGD, charged to epsilon (privacy.finetune = 'dp'): the fine-tuned model may be published"
    return (
        "free (privacy.finetune = 'free'): plain training after the last exchange, charged nothing; epsilon covers "
        "everything that left each owner's machine, and the fine-tuned model must not leave it (its ft_* scores "
        "here are measured for the report)"
    )


__all__ = [
    "AUDITED_CLIENT",
    "audit_canaries",
    "expected_batch",
    "finetune_under_dp",
    "generators",
    "plan",
    "planned_steps",
    "summary",
    "train",
]
