"""Translation evaluation: held-out loss, decoded translations, corpus BLEU and chrF (sacreBLEU).

Quality is always scored on decoded translations (greedy or beam search), never on teacher-forced
argmax predictions, which would let the model see the reference prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import sacrebleu
import torch
from torch import Tensor

from trustformer.models.transformer import Seq2SeqTransformer, eval_mode

__all__ = ["Tokenizer", "evaluate_loss", "translate", "corpus_bleu", "corpus_chrf"]


class Tokenizer(Protocol):
    """What translation needs from a tokenizer (ids exclude BOS/EOS)."""

    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def evaluate_loss(model: Seq2SeqTransformer, batches: Iterable[tuple[Tensor, Tensor]]) -> float:
    """Token-averaged cross-entropy over all batches: sum of loss sums / sum of target token counts.

    Runs in eval mode under ``torch.no_grad()`` and restores the model's previous mode.
    """
    device = next(model.parameters()).device
    total, n_tokens = 0.0, 0
    with torch.no_grad(), eval_mode(model):
        for src, tgt in batches:
            loss_sum, n = model.loss(src.to(device), tgt.to(device))
            total += float(loss_sum)
            n_tokens += n
    if n_tokens == 0:
        raise ValueError("evaluate_loss: the batches contain no target tokens")
    return total / n_tokens


def translate(
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    *,
    batch_size: int = 64,
    max_len: int,
    beam_size: int = 1,
) -> list[str]:
    """Decoded translations of ``sources``, in order.

    Each source is encoded, truncated to ``max_len - 1`` tokens and terminated by EOS, then batched
    (sorted by length to limit padding) and right-padded with ``tokenizer.pad_id``. Decoding is greedy
    for ``beam_size == 1``, beam search otherwise, at most ``max_len`` steps; output ids are detokenized
    with ``tokenizer.decode``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    config = model.config
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(tokenizer, name) != getattr(config, name):
            raise ValueError(
                f"tokenizer.{name}={getattr(tokenizer, name)} differs from model config {name}={getattr(config, name)}"
            )
    device = next(model.parameters()).device
    encoded = [tokenizer.encode(text)[: max_len - 1] + [tokenizer.eos_id] for text in sources]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    outputs: list[str] = [""] * len(encoded)
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in chunk)
            src = torch.full((len(chunk), width), tokenizer.pad_id, dtype=torch.long)
            for row, i in enumerate(chunk):
                src[row, : len(encoded[i])] = torch.tensor(encoded[i], dtype=torch.long)
            src = src.to(device)
            if beam_size == 1:
                hyps = model.greedy_decode(src, max_len=max_len)
            else:
                hyps = model.beam_search(src, beam_size=beam_size, max_len=max_len)
            for i, ids in zip(chunk, hyps, strict=True):
                outputs[i] = tokenizer.decode(ids)
    return outputs


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU corpus BLEU (0-100, default 13a tokenization), one reference per hypothesis."""
    _check_pairs(hypotheses, references)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU corpus chrF (0-100, character n-grams up to 6, beta 2), one reference per hypothesis."""
    _check_pairs(hypotheses, references)
    return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)
