"""Turning pairs into padded id tensors.

Convention (used by the model and the decoders):

* source ids: ``encode(source)[: max_len - 1] + [EOS]`` — no BOS on the encoder side;
* target ids: ``[BOS] + encode(target)[: max_len - 2] + [EOS]``.

Both sequences are at most ``max_len`` long. For teacher forcing the decoder input is
``tgt[:, :-1]`` and the labels are ``tgt[:, 1:]`` (with ``pad_id`` ignored in the loss); greedy or beam
decoding starts from BOS and stops at EOS.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from trustformer.data.tokenizer import Tokenizer
from trustformer.data.tsv import Pair

__all__ = ["EncodedPair", "encode_pairs", "indexed_batches", "make_batches", "make_token_batches", "pad_sequences"]

EncodedPair = tuple[list[int], list[int]]


def encode_pairs(pairs: Iterable[Pair], tokenizer: Tokenizer, *, max_len: int) -> list[EncodedPair]:
    """Encode (source, target) pairs following the module's convention; lengths ≤ ``max_len``."""
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (room for BOS and EOS), got {max_len}")
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    encoded: list[EncodedPair] = []
    for source, target in pairs:
        src = tokenizer.encode(source)[: max_len - 1] + [eos]
        tgt = [bos] + tokenizer.encode(target)[: max_len - 2] + [eos]
        encoded.append((src, tgt))
    return encoded


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Right-pad sequences with ``pad_id`` into a LongTensor of shape [B, longest]."""
    longest = max((len(seq) for seq in sequences), default=0)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            out[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    return out


def make_batches(
    encoded: Sequence[EncodedPair],
    *,
    batch_size: int,
    pad_id: int,
    shuffle: bool,
    seed: int | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """Group encoded pairs into padded (src [B, S], tgt [B, T]) LongTensor batches.

    Every example is used once; the last batch may be smaller. With ``shuffle`` the order is a
    permutation drawn from ``random.Random(seed)``, so the same seed gives the same batches
    (``seed`` is then required).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(len(encoded)))
    if shuffle:
        if seed is None:
            raise ValueError("make_batches(shuffle=True) needs a seed, so that batches are reproducible")
        random.Random(seed).shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = [encoded[i] for i in order[start : start + batch_size]]
        src = pad_sequences([s for s, _ in chunk], pad_id)
        tgt = pad_sequences([t for _, t in chunk], pad_id)
        batches.append((src, tgt))
    return batches


def make_token_batches(
    encoded: Sequence[EncodedPair],
    *,
    max_tokens: int,
    pad_id: int,
    seed: int,
    pool_batches: int = 50,
) -> list[tuple[Tensor, Tensor]]:
    """Length-bucketed batches of at most ``max_tokens`` padded target tokens each (B × longest target).

    The pairs are shuffled with ``random.Random(seed)``, cut into pools of about ``pool_batches``
    batches, each pool sorted by (target, source) length and cut greedily so that padding stays small;
    the batch order is then shuffled. Every example is used once; a pair longer than ``max_tokens`` gets a
    batch of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rng = random.Random(seed)
    order = list(range(len(encoded)))
    rng.shuffle(order)
    mean_len = max(1.0, sum(len(t) for _, t in encoded) / max(len(encoded), 1))
    pool_size = max(1, int(pool_batches * max_tokens / mean_len))
    groups: list[list[int]] = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: (len(encoded[i][1]), len(encoded[i][0])))
        current: list[int] = []
        longest = 0
        for i in pool:
            length = len(encoded[i][1])
            if current and max(longest, length) * (len(current) + 1) > max_tokens:
                groups.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
        if current:
            groups.append(current)
    rng.shuffle(groups)
    batches = []
    for chunk in groups:
        src = pad_sequences([encoded[i][0] for i in chunk], pad_id)
        tgt = pad_sequences([encoded[i][1] for i in chunk], pad_id)
        batches.append((src, tgt))
    return batches


def indexed_batches(pairs: Sequence[EncodedPair], pad_id: int, device: torch.device | str = "cpu"):
    """A function of record indices giving the padded (sources, targets) of those ``pairs`` on ``device`` (DP-SGD's
    Poisson batches, the public pairs of its subspace)."""

    def batch(indices: Tensor) -> tuple[Tensor, Tensor]:
        chosen = [pairs[int(i)] for i in indices]
        return (
            pad_sequences([s for s, _ in chosen], pad_id).to(device),
            pad_sequences([g for _, g in chosen], pad_id).to(device),
        )

    return batch
