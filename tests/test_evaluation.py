"""Tests of translation evaluation: held-out loss, decoding to text, corpus BLEU and chrF."""

from __future__ import annotations

import pytest
import torch

from trustformer.evaluation.translation import corpus_bleu, corpus_chrf, evaluate_loss, translate
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig

torch.set_num_threads(1)


class CharTokenizer:
    """Character-level tokenizer over a fixed alphabet: 0 pad, 1 BOS, 2 EOS, 3.. characters."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, alphabet: str = "abcdefgh ") -> None:
        self.alphabet = alphabet
        self.vocab_size = 3 + len(alphabet)

    def encode(self, text: str) -> list[int]:
        return [3 + self.alphabet.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 3] for i in ids if i >= 3)


TOK = CharTokenizer()


def tiny_model(seed: int = 0, dropout: float = 0.0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=TOK.vocab_size,
        pad_id=TOK.pad_id,
        bos_id=TOK.bos_id,
        eos_id=TOK.eos_id,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=12,
        dropout=dropout,
    )
    return Seq2SeqTransformer(config)


def batch(pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, tgt) tensors: source ids + EOS, BOS + target ids + EOS, right-padded."""
    srcs = [TOK.encode(s) + [TOK.eos_id] for s, _ in pairs]
    tgts = [[TOK.bos_id] + TOK.encode(t) + [TOK.eos_id] for _, t in pairs]

    def pad(rows):
        out = torch.full((len(rows), max(map(len, rows))), TOK.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row)
        return out

    return pad(srcs), pad(tgts)


# ----------------------------------------------------------------------------- evaluate_loss


def test_evaluate_loss_is_token_weighted_over_batches():
    model = tiny_model(dropout=0.3).train()
    first = batch([("abc", "ab"), ("de", "h")])  # 3 + 2 label tokens
    second = batch([("fgh", "abcdefg")])  # 8 label tokens
    result = evaluate_loss(model, [first, second])
    assert model.training  # mode restored
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        (l1, n1), (l2, n2) = model.loss(*first), model.loss(*second)
    assert (n1, n2) == (5, 8)
    assert result == pytest.approx((l1.item() + l2.item()) / (n1 + n2), rel=1e-6)
    mean_of_means = (l1.item() / n1 + l2.item() / n2) / 2
    assert abs(result - mean_of_means) > 1e-4  # the two averages really differ here
    assert evaluate_loss(model, iter([first, second])) == pytest.approx(result, rel=1e-6)  # dropout off
    assert not model.training


def test_evaluate_loss_rejects_empty_input():
    with pytest.raises(ValueError):
        evaluate_loss(tiny_model(), [])


# ----------------------------------------------------------------------------- translate


def test_translate_encodes_batches_and_restores_order(monkeypatch):
    model = tiny_model()
    seen: list[torch.Tensor] = []

    def reverse_source(src, *, max_len):
        seen.append(src.clone())
        return [[t for t in row.tolist() if t >= 3][::-1] for row in src]

    monkeypatch.setattr(model, "greedy_decode", reverse_source)
    sources = ["abcdefghabcdef", "a", "bad", "", "cafe", "hh"]
    out = translate(model, TOK, sources, batch_size=2, max_len=6)
    assert out == ["edcba", "a", "dab", "", "efac", "hh"]  # long source truncated to 5 tokens + EOS
    assert [len(s) for s in seen] == [2, 2, 2]
    for src in seen:
        for row in src.tolist():
            n = row.index(TOK.eos_id)
            assert all(t >= 3 for t in row[:n]) and all(t == TOK.pad_id for t in row[n + 1 :])
            assert len(row) <= 6


def test_translate_uses_beam_search_when_asked(monkeypatch):
    model = tiny_model()
    calls = []
    monkeypatch.setattr(
        model, "beam_search", lambda src, *, beam_size, max_len: calls.append(beam_size) or [[3]] * len(src)
    )
    assert translate(model, TOK, ["ab", "cd", "e"], max_len=8, beam_size=3) == ["a", "a", "a"]
    assert calls == [3]


def test_translate_with_a_real_model_matches_greedy_decode():
    model = tiny_model(seed=1).train()
    sources = ["abc", "hgfe", "a b"]
    out = translate(model, TOK, sources, max_len=8, batch_size=2)
    assert model.training
    src, _ = batch([(s, "") for s in sources])
    expected = [TOK.decode(ids) for ids in model.greedy_decode(src, max_len=8)]
    assert out == expected
    assert len(translate(model, TOK, sources, max_len=8, beam_size=2)) == 3


def test_translate_rejects_mismatched_special_ids():
    model = tiny_model()
    other = CharTokenizer()
    other.pad_id = 5
    with pytest.raises(ValueError, match="pad_id"):
        translate(model, other, ["ab"], max_len=8)


# ----------------------------------------------------------------------------- corpus scores


def test_corpus_bleu_and_chrf_bounds():
    refs = ["the cat sat on the mat today", "a quick brown fox jumps over the lazy dog"]
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)
    assert corpus_chrf(refs, refs) == pytest.approx(100.0)
    disjoint = ["zzz yyy xxx www vvv uuu", "qqq ppp ooo nnn mmm lll kkk jjj"]
    assert corpus_bleu(disjoint, refs) < 1.0
    assert corpus_chrf(disjoint, refs) < 10.0
    partial = ["the cat sat on a mat today", "a quick brown fox jumps over the lazy cat"]
    assert 0.0 < corpus_bleu(partial, refs) < 100.0


def test_corpus_scores_reject_length_mismatch():
    with pytest.raises(ValueError):
        corpus_bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        corpus_chrf(["a", "b"], ["a"])
