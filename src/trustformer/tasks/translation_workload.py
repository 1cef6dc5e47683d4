"""The learning task every protocol runs: data shards, tokenizer, model, local training, evaluation.

A client builds its view of the task from the run configuration alone (the corpus, the split and the
tokenizer are deterministic for a seed), so the in-process runtime and separate client processes
see exactly the same data. Built once per process and configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..config import FederationConfig, RunConfig
from ..core.shared import ALL_SHARDS, derive_seed, select_device
from ..data.batching import encode_pairs, make_batches, make_token_batches
from ..data.corpus import Pair, default_cache_dir, load_libreoffice_domains, load_tsv_domains, load_wmt19
from ..data.split import Splits, split_corpus
from ..data.tokenizer import Tokenizer, load_hf_tokenizer, train_sentencepiece
from ..errors import TrustformerError
from ..evaluation.translation import evaluate_loss
from ..models.transformer import Seq2SeqTransformer, TransformerConfig, eval_mode
from .optim import build_optimizer, lr_at, optimizer_steps, set_lr

log = logging.getLogger(__name__)


class DataError(TrustformerError, ValueError):
    """The corpus cannot be used as configured (a malformed file, too few pairs for the split)."""


@dataclass(frozen=True)
class Workload:
    """The shared, deterministic part of a run: splits, tokenizer and encoded test set."""

    splits: Splits
    tokenizer: Tokenizer
    test_encoded: list[tuple[list[int], list[int]]]
    model_config: TransformerConfig
    corpus_pairs: int
    corpus_sha256: str  # fingerprint of the corpus as loaded (identifies its version in the results)

    def describe(self, partition: int | None = None) -> dict[str, str | int | list]:
        """What a run records about its data: corpus identity, split sizes, tokenizer; with a
        ``partition``, that client's pairs per domain (``domain_names`` / ``domain_counts``), and the
        test set's (``test_domain_names`` / ``test_domain_counts``), when the corpus names domains."""
        out: dict[str, str | int | list] = {
            "corpus_pairs": self.corpus_pairs,
            "corpus_sha256": self.corpus_sha256,
            "test_pairs": len(self.splits.test),
            "public_pairs": len(self.splits.public),
            "tokenizer": self.tokenizer.name,
            "vocab_size": self.tokenizer.vocab_size,
        }
        if self.splits.client_domains and partition is not None:
            counts = (
                Counter()
                if partition != ALL_SHARDS
                else sum((Counter(d) for d in self.splits.client_domains), Counter())
            )
            if partition != ALL_SHARDS:
                counts.update(self.splits.client_domains[partition])
            out["domain_names"], out["domain_counts"] = list(counts), list(counts.values())
            out["test_domain_names"] = list(self.splits.test_domains)
            out["test_domain_counts"] = list(self.splits.test_domains.values())
        return out

    def own_test(self, partition: int) -> list[Pair]:
        """A client's held-out own-distribution pairs (``data.own_test_size`` of what it was dealt; none for the
        centralized client or without them)."""
        tests = self.splits.client_tests
        return tests[partition] if tests and 0 <= partition < len(tests) else []

    def shard(self, partition: int) -> list[Pair]:
        """A client's private training pairs (``ALL_SHARDS``: the union, for centralized training)."""
        if partition == ALL_SHARDS:
            return [pair for shard in self.splits.clients for pair in shard]
        if not 0 <= partition < len(self.splits.clients):
            raise ValueError(f"partition {partition} out of range 0..{len(self.splits.clients) - 1}")
        return self.splits.clients[partition]


def cache_dir(cfg: RunConfig) -> Path:
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()


def load_corpus(cfg: RunConfig) -> tuple[list[Pair], list[str] | None]:
    """The configured parallel corpus (Russian source, English target) and each pair's domain
    (LibreOffice: its help module; TSV: the optional third column; WMT19: none)."""
    if cfg.data.source == "tsv":
        return load_tsv_domains(cfg.data.path)
    if cfg.data.source == "wmt19":
        d = cfg.data
        sizes = sum(d.client_sizes) if d.client_sizes else d.client_size * cfg.federation.clients
        needed = sizes + d.test_size + d.public_size
        # stream only what the split needs (with a margin for duplicates and long pairs), not all of WMT19
        return load_wmt19("train", limit=2 * needed if sizes else None), None
    return load_libreoffice_domains(cache_dir(cfg), progress=lambda m: log.info("corpus: %s", m))


def load_workload(cfg: RunConfig) -> Workload:
    """Build (or fetch from this process's cache) the workload of a configuration."""
    return _load_workload_cached(_workload_key(cfg))


WorkloadKey = tuple[int, Any, Any, int]
"""What a workload depends on: the seed, the data section, the model's sizes (not its adapters) and the clients."""


def _workload_key(cfg: RunConfig) -> WorkloadKey:
    sizes = type(cfg.model)(
        **{
            f.name: getattr(cfg.model, f.name)
            for f in dataclasses.fields(cfg.model)
            if f.name != "adapters" and not f.name.startswith("lora_")
        }
    )  # no split, no size
    return (cfg.seed, cfg.data, sizes, cfg.federation.clients)


@lru_cache(maxsize=4)
def _load_workload_cached(key: WorkloadKey) -> Workload:
    seed, data, sizes, clients = key
    cfg = RunConfig(seed=seed, data=data, model=sizes, federation=FederationConfig(clients=clients))
    d = cfg.data
    started = time.perf_counter()
    try:
        pairs, domains = load_corpus(cfg)
        splits = split_corpus(
            pairs,
            n_clients=cfg.federation.clients,
            client_size=d.client_size or None,
            test_size=d.test_size,
            public_size=d.public_size,
            seed=cfg.seed,
            max_words=d.max_words or None,
            domains=domains,
            partition=d.partition,
            alpha=d.alpha,
            client_sizes=d.client_sizes or None,
            own_test_size=d.own_test_size,
        )
    except ValueError as exc:
        raise DataError(str(exc)) from exc
    if d.tokenizer == "hf":
        tokenizer = load_hf_tokenizer(d.tokenizer_name)
    else:
        texts = [side for pair in splits.public for side in pair]
        tokenizer = train_sentencepiece(
            texts, vocab_size=d.vocab_size, cache_dir=cache_dir(cfg) / "tokenizers", seed=cfg.seed
        )
    m = cfg.model
    model_config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        d_model=m.d_model,
        n_heads=m.n_heads,
        n_encoder_layers=m.n_encoder_layers,
        n_decoder_layers=m.n_decoder_layers,
        d_ff=m.d_ff,
        max_len=m.max_len,
        dropout=m.dropout,
    )
    test_encoded = encode_pairs(splits.test, tokenizer, max_len=m.max_len)
    log.info(
        "workload ready in %.1f s: %d pairs, splits %s, tokenizer %s (%d pieces)",
        time.perf_counter() - started,
        len(pairs),
        splits.sizes(),
        tokenizer.name,
        tokenizer.vocab_size,
    )
    fingerprint = hashlib.sha256("\n".join(f"{a}\t{b}" for a, b in pairs).encode()).hexdigest()[:16]
    return Workload(
        splits=splits,
        tokenizer=tokenizer,
        test_encoded=test_encoded,
        model_config=model_config,
        corpus_pairs=len(pairs),
        corpus_sha256=fingerprint,
    )


def device_of(cfg: RunConfig) -> torch.device:
    """``runtime.device``: ``auto`` is CUDA when this process sees a GPU, else the CPU."""
    return select_device(cfg.runtime.device)


def initial_model(cfg: RunConfig, workload: Workload) -> Seq2SeqTransformer:
    """The identical initial model every client starts from (seeded from the run seed; built on the
    CPU, so the same on every device, then moved to ``runtime.device``)."""
    torch.manual_seed(derive_seed(cfg.seed, "model-init"))
    return Seq2SeqTransformer(workload.model_config).to(device_of(cfg))


def new_optimizer(cfg: RunConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    t, p = cfg.train, cfg.privacy
    corrected = p.unit == "record" and p.adam_correction and p.noise != "distributed"  # DP-AdamBC (tasks/optim.py)
    return build_optimizer(
        model, name=t.optimizer, lr=t.lr, weight_decay=t.weight_decay, betas=t.betas, noise_corrected=corrected
    )


def training_batches(
    cfg: RunConfig, pairs_encoded: list[tuple[list[int], list[int]]], pad_id: int, *, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled batches: ``train.batch_tokens`` > 0 gives length-bucketed batches of about
    that many target tokens, else ``train.batch_size`` sentences."""
    if cfg.train.batch_tokens:
        return make_token_batches(pairs_encoded, max_tokens=cfg.train.batch_tokens, pad_id=pad_id, seed=seed)
    return make_batches(pairs_encoded, batch_size=cfg.train.batch_size, pad_id=pad_id, shuffle=True, seed=seed)


def planned_steps(cfg: RunConfig, pairs_encoded: list[tuple[list[int], list[int]]], pad_id: int) -> int:
    """Optimizer steps this client takes over the whole run (the cosine schedule's length when
    ``train.decay_steps`` = 0)."""
    per_epoch = len(training_batches(cfg, pairs_encoded, pad_id, seed=0))
    return per_epoch * cfg.train.local_epochs * cfg.federation.rounds


def train_local(
    cfg: RunConfig,
    model: Seq2SeqTransformer,
    optimizer: torch.optim.Optimizer,
    pairs_encoded: list[tuple[list[int], list[int]]],
    *,
    seed: int,
    step: Callable[[Seq2SeqTransformer, torch.optim.Optimizer, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]
    | None = None,
) -> dict[str, float]:
    """``local_epochs`` passes over a client's shard with the configured recipe (``optim.py``): the
    learning rate of every step follows the schedule from the optimizer's own step count, gradients
    are clipped to ``train.clip_norm``. Returns loss, timing and throughput (target tokens / s).

    ``step`` replaces the plain step (loss, backward, clip, optimizer step) on each batch, e.g. SAM or a
    regularised loss; it returns the batch loss summed over tokens and the token count. The schedule
    sets its learning rate too.
    """
    torch.manual_seed(seed)  # dropout masks: reproducible whatever the order clients run in
    model.train()
    t = cfg.train
    device = next(model.parameters()).device
    pad_id = model.config.pad_id
    total = t.decay_steps or planned_steps(cfg, pairs_encoded, pad_id)
    done = optimizer_steps(optimizer)
    started = time.perf_counter()
    loss_sum, tokens, steps = 0.0, 0, 0
    for epoch in range(t.local_epochs):
        for src, tgt in training_batches(cfg, pairs_encoded, pad_id, seed=derive_seed(seed, "epoch", epoch)):
            src, tgt = src.to(device), tgt.to(device)
            set_lr(
                optimizer,
                lr_at(
                    done + steps + 1,
                    lr=t.lr,
                    schedule=t.schedule,
                    warmup_steps=t.warmup_steps,
                    decay_steps=total,
                    min_lr=t.min_lr,
                ),
            )
            if step is not None:
                batch_loss, n_tokens = step(model, optimizer, src, tgt)
            else:
                optimizer.zero_grad(set_to_none=True)
                batch_loss, n_tokens = model.loss(src, tgt, label_smoothing=t.label_smoothing)
                (batch_loss / max(n_tokens, 1)).backward()
                if t.clip_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
                optimizer.step()
            loss_sum += float(batch_loss.detach())
            tokens += int(n_tokens)
            steps += 1
    train_loss = loss_sum / max(tokens, 1)
    if not math.isfinite(train_loss):
        raise FloatingPointError(
            f"local training diverged (train loss {train_loss}); lower train.lr or set train.clip_norm"
        )
    elapsed = time.perf_counter() - started
    return {
        "train_loss": train_loss,
        "train_s": elapsed,
        "steps": steps,
        "train_tokens": tokens,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "lr": optimizer.param_groups[0]["lr"],
    }


def test_loss(
    cfg: RunConfig,
    model: Seq2SeqTransformer,
    workload: Workload,
    encoded: list[tuple[list[int], list[int]]] | None = None,
) -> float:
    """Token-averaged cross-entropy of a model on the shared held-out test set (or on ``encoded`` pairs)."""
    batches = make_batches(
        workload.test_encoded if encoded is None else encoded,
        batch_size=cfg.eval.batch_size,
        pad_id=workload.tokenizer.pad_id,
        shuffle=False,
    )
    return evaluate_loss(model, batches)


def pair_losses(
    cfg: RunConfig, model: Seq2SeqTransformer, workload: Workload, encoded: list[tuple[list[int], list[int]]]
) -> list[float]:
    """Each pair's token-averaged cross-entropy under ``model`` (teacher forcing, padding excluded), in order."""
    losses: list[float] = []
    device = next(model.parameters()).device
    with torch.no_grad(), eval_mode(model):
        for start in range(0, len(encoded), cfg.eval.batch_size):
            chunk = encoded[start : start + cfg.eval.batch_size]
            src, tgt = make_batches(chunk, batch_size=len(chunk), pad_id=workload.tokenizer.pad_id, shuffle=False)[0]
            losses.extend(model.pair_losses(src.to(device), tgt.to(device)).tolist())
    return losses


def finetune(
    cfg: RunConfig,
    model: Seq2SeqTransformer,
    pairs_encoded: list[tuple[list[int], list[int]]],
    *,
    epochs: int,
    lr: float,
    seed: int,
) -> dict[str, float]:
    """Local fine-tuning after the last round: ``epochs`` passes over a client's own pairs with a fresh optimizer
    of the configured kind at the constant learning rate ``lr`` (no warm-up, no decay), gradients clipped."""
    torch.manual_seed(seed)
    model.train()
    optimizer = new_optimizer(cfg, model)
    set_lr(optimizer, lr)
    device = next(model.parameters()).device
    started, loss_sum, tokens = time.perf_counter(), 0.0, 0
    for epoch in range(epochs):
        for src, tgt in training_batches(cfg, pairs_encoded, model.config.pad_id, seed=derive_seed(seed, "ft", epoch)):
            optimizer.zero_grad(set_to_none=True)
            batch_loss, n_tokens = model.loss(src.to(device), tgt.to(device), label_smoothing=cfg.train.label_smoothing)
            (batch_loss / max(n_tokens, 1)).backward()
            if cfg.train.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
            optimizer.step()
            loss_sum, tokens = loss_sum + float(batch_loss.detach()), tokens + int(n_tokens)
    return {"finetune_s": time.perf_counter() - started, "finetune_loss": loss_sum / max(tokens, 1)}
