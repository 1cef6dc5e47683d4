"""Record-level DP-SGD (``privacy.unit = "record"``) for the translation task: the client's plan (σ for its whole
run), its random sources, and its local training and fine-tuning through ``core/dpsgd.py``.

A record is one sentence pair. Its loss is its own token-averaged cross-entropy (``pair_losses``), so its
gradient depends on it alone, as per-example clipping requires. Batches are Poisson draws of
``privacy.batch_size`` pairs in expectation (``train.batch_size`` when 0), not the length-bucketed token batches
of non-private training. The run's learning-rate schedule applies per DP step, its warm-up scaled to cover as many
records as without DP (``train.warmup_steps`` × ``train.batch_size`` / the expected DP batch).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

import torch

from ..config import RunConfig
from ..core.accounting import PrivacyBudgetError
from ..core.dp import noise_generator, os_seed
from ..core.dpsgd import Canaries, RecordDP, calibrate, dp_sgd, epsilon_spent, sample_rate
from ..core.shared import derive_seed
from ..data.batching import pad_sequences
from ..optim import lr_at, optimizer_steps, set_lr

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


def expected_batch(cfg: RunConfig) -> int:
    return cfg.privacy.batch_size or cfg.train.batch_size


def planned_steps(cfg: RunConfig, n_records: int) -> tuple[int, int]:
    """(DP steps per round, DP steps of the client's whole run: every round plus fine-tuning)."""
    per_epoch = max(1, round(1.0 / sample_rate(n_records, expected_batch(cfg))))
    per_round = per_epoch * cfg.train.local_epochs
    return per_round, per_round * cfg.federation.rounds + per_epoch * cfg.federation.finetune_epochs


@lru_cache(maxsize=64)
def _plan(cfg_json: str, n_records: int) -> RecordDP:
    cfg = RunConfig.from_json(cfg_json)
    p = cfg.privacy
    rate = sample_rate(n_records, expected_batch(cfg))
    _per_round, total = planned_steps(cfg, n_records)
    sigma = calibrate(p.epsilon, p.delta, rate, total) if p.noise_multiplier < 0 else p.noise_multiplier
    spent = epsilon_spent(sigma, rate, total, p.delta)
    if p.noise_multiplier >= 0 and spent > p.epsilon and p.on_exceed == "refuse":
        raise PrivacyBudgetError(
            f"record-level DP: {total} DP-SGD steps at noise multiplier {sigma:g} and sampling rate {rate:.4g} "
            f"({n_records} records, expected batch {expected_batch(cfg)}) spend epsilon = {spent:.4g} at delta = "
            f"{p.delta:g}, more than privacy.epsilon = {p.epsilon:g}; set privacy.noise_multiplier = -1 to solve "
            "it, or lower federation.rounds / train.local_epochs"
        )
    return RecordDP(
        noise_multiplier=sigma,
        clip_norm=p.clip_norm,
        expected_batch=expected_batch(cfg),
        sample_rate=rate,
        delta=p.delta,
    )


def plan(cfg: RunConfig, n_records: int) -> RecordDP:
    """The client's mechanism: σ solved for (privacy.epsilon, privacy.delta) over its whole run, or given."""
    return _plan(cfg.to_json(), n_records)


def generators(cfg: RunConfig, seed: int) -> tuple[torch.Generator, torch.Generator]:
    """(Poisson sampler, noise): the operating system's randomness; from the run seed only with
    ``privacy.noise_source = "seeded-not-private"``."""
    if cfg.privacy.noise_source == "seeded-not-private":
        return (noise_generator(derive_seed(seed, "dp-sampling")), noise_generator(derive_seed(seed, "dp-noise")))
    return noise_generator(os_seed()), noise_generator(os_seed())


def audit_canaries(cfg: RunConfig, model: torch.nn.Module) -> Canaries | None:
    """The gradient canaries of an audit run (``privacy.audit_canaries`` = m): m distinct coordinates of the
    trainable tensors and a fair coin per canary, both from the run seed, so the auditor can recompute them."""
    m = cfg.privacy.audit_canaries
    if not m:
        return None
    names, sizes = zip(*[(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad])
    rng = random.Random(derive_seed(cfg.seed, "audit-canaries"))
    flat = rng.sample(range(sum(sizes)), m)
    located = []
    for f in flat:
        for name, size in zip(names, sizes):
            if f < size:
                located.append((name, f))
                break
            f -= size
    included = tuple(rng.random() < 0.5 for _ in range(m))
    return Canaries(names=tuple(n for n, _ in located), coordinates=tuple(c for _, c in located), included=included)


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
    client: int | None = None,
    finetune_epochs: int = 0,
    lr: float | None = None,
) -> dict[str, float]:
    """One round of DP-SGD local training (or, with ``finetune_epochs``, DP fine-tuning at the constant ``lr``
    after the last round); returns the usual training metrics plus σ, q, the client's DP steps so far and the ε
    they spent (``record_epsilon``, Opacus' RDP accountant)."""
    _ready()
    t = cfg.train
    dp = plan(cfg, len(pairs))
    per_round, total = planned_steps(cfg, len(pairs))
    device = next(model.parameters()).device
    pad_id = model.config.pad_id
    if finetune_epochs:
        done, steps = per_round * cfg.federation.rounds, dp.steps_per_epoch * finetune_epochs
        set_lr(optimizer, lr if lr is not None else t.lr)
        before_step = None
    else:
        done, steps = optimizer_steps(optimizer), per_round

        warmup = round(t.warmup_steps * t.batch_size / dp.expected_batch)  # as many records as without DP

        def before_step(i: int) -> None:
            set_lr(
                optimizer,
                lr_at(
                    done + i + 1,
                    lr=t.lr,
                    schedule=t.schedule,
                    warmup_steps=warmup,
                    decay_steps=t.decay_steps or total,
                    min_lr=t.min_lr,
                ),
            )

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = [pairs[int(i)] for i in indices]
        return (
            pad_sequences([s for s, _ in chosen], pad_id).to(device),
            pad_sequences([g for _, g in chosen], pad_id).to(device),
        )

    def example_losses(m: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return m.pair_losses(src, tgt, label_smoothing=t.label_smoothing)

    sampler, noise = generators(cfg, seed)
    form = _dp_form(step, cfg.federation.strategy)
    torch.manual_seed(seed)  # dropout masks
    out = dp_sgd(
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
        canaries=audit_canaries(cfg, model) if client == AUDITED_CLIENT and not finetune_epochs else None,
    )
    spent = done + steps
    out.update(
        record_epsilon=epsilon_spent(dp.noise_multiplier, dp.sample_rate, spent, dp.delta),
        dp_sigma=dp.noise_multiplier,
        dp_sample_rate=dp.sample_rate,
        dp_steps=spent,
        lr=optimizer.param_groups[0]["lr"],
    )
    return out


def summary(cfg: RunConfig, records: list[dict[str, Any]], final: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``summary.json["privacy"]`` of a record-level run: per client the ε its DP-SGD steps spent (fine-tuning
    included), σ, q and steps, from what each client reported; ``epsilon`` is the largest."""
    per: dict[int, dict[str, Any]] = {}
    for r in records:
        if "record_epsilon" in r and "client" in r:
            per[int(r["client"])] = {
                "epsilon": r["record_epsilon"],
                "noise_multiplier": r["dp_sigma"],
                "sample_rate": r["dp_sample_rate"],
                "steps": r["dp_steps"],
            }
    for client, metrics in final.items():
        tuned = metrics.get("finetune_record_epsilon")
        if tuned is not None and client in per:
            per[client]["epsilon"] = max(per[client]["epsilon"], tuned)
    p = cfg.privacy
    return {
        "unit": "record",
        "epsilon": max((v["epsilon"] for v in per.values()), default=None),
        "target_epsilon": p.epsilon,
        "delta": p.delta,
        "clip_norm": p.clip_norm,
        "expected_batch": expected_batch(cfg),
        "accountant": "opacus RDP (Mironov et al. 2019)",
        "clients": {str(c): per[c] for c in sorted(per)},
        "noise_source": p.noise_source,
        "private": p.noise_source == "os" and not p.audit_canaries,
        "audit_canaries": p.audit_canaries,
    }


__all__ = [
    "AUDITED_CLIENT",
    "audit_canaries",
    "expected_batch",
    "generators",
    "plan",
    "planned_steps",
    "summary",
    "train",
]
