"""Tests of the encoder-decoder Transformer: masks, target shift, decoding, config, optimizer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from trustformer.models import transformer as tr
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.tasks.optim import build_optimizer

torch.set_num_threads(1)

PAD, BOS, EOS = 0, 1, 2
VOCAB = 12  # content tokens are 3..11


def tiny_config(**overrides) -> TransformerConfig:
    sizes = dict(
        vocab_size=VOCAB,
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        max_len=16,
        dropout=0.0,
    )
    sizes.update(overrides)
    return TransformerConfig(**sizes)


def one_layer() -> TransformerConfig:
    return tiny_config(n_encoder_layers=1, n_decoder_layers=1)


def tiny_model(seed: int = 0, **overrides) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(tiny_config(**overrides)).eval()


def random_tokens(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def pad_rows(rows: list[list[int]], *, bos: bool) -> torch.Tensor:
    """Rows -> [BOS] + row + [EOS] (or row + [EOS]) right-padded with PAD."""
    rows = [([BOS] if bos else []) + row + [EOS] for row in rows]
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(n_heads=0), "n_heads"),
        (dict(n_encoder_layers=0), "n_encoder_layers"),
        (dict(n_decoder_layers=-1), "n_decoder_layers"),
        (dict(d_ff=0), "d_ff"),
        (dict(max_len=0), "max_len"),
        (dict(dropout=1.0), "dropout"),
        (dict(eos_id=VOCAB), "eos_id"),
        (dict(bos_id=PAD), "bos_id"),
    ],
)
def test_config_validation_names_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config().d_model = 64  # type: ignore[misc]


# ----------------------------------------------------------------------------- structure


def expected_parameters(c: TransformerConfig) -> int:
    d, f = c.d_model, c.d_ff
    attn, ffn, ln = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    encoder = c.n_encoder_layers * (attn + ffn + 2 * ln) + ln
    decoder = c.n_decoder_layers * (2 * attn + ffn + 3 * ln) + ln
    embeddings = c.vocab_size * d if c.tie_embeddings else 3 * c.vocab_size * d
    return embeddings + encoder + decoder


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_count_and_names(tie):
    model = tiny_model(tie_embeddings=tie)
    assert model.num_parameters() == expected_parameters(model.config)
    names = list(model.state_dict())
    assert len(names) == len(set(names))
    assert "positions" not in names  # sinusoidal encoding is not a parameter
    if tie:
        assert "embedding.weight" in names and "lm_head.weight" not in names
    else:
        assert {"src_embedding.weight", "tgt_embedding.weight", "lm_head.weight"} <= set(names)
    assert "decoder.layers.1.cross_attn.q_proj.weight" in names
    assert "encoder.norm.weight" in names and "decoder.norm.bias" in names


def test_init_is_deterministic_given_seed():
    a, b, c = tiny_model(seed=3), tiny_model(seed=3), tiny_model(seed=4)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name])
    assert not torch.equal(a.embedding.weight, c.embedding.weight)


# ----------------------------------------------------------------------------- masks


def future_leaks(model: Seq2SeqTransformer, src: torch.Tensor, tgt_in: torch.Tensor) -> bool:
    """True if changing tgt_in[:, t+1:] changes the logits at some position <= t."""
    base = model(src, tgt_in)
    for t in range(tgt_in.size(1) - 1):
        changed = tgt_in.clone()
        changed[:, t + 1 :] = 3 + (changed[:, t + 1 :] - 3 + 1) % (VOCAB - 3)  # different content tokens
        logits = model(src, changed)
        if not torch.allclose(logits[:, : t + 1], base[:, : t + 1], atol=1e-5):
            return True
        assert not torch.allclose(logits[:, t + 1 :], base[:, t + 1 :], atol=1e-5)  # the change is visible
    return False


def test_causal_mask_hides_the_future():
    model = tiny_model()
    src, tgt_in = random_tokens((3, 7), seed=1), random_tokens((3, 6), seed=2)
    tgt_in[:, 0] = BOS
    assert not future_leaks(model, src, tgt_in)


def test_causal_check_detects_a_model_that_sees_the_answer(monkeypatch):
    model = tiny_model()
    src, tgt_in = random_tokens((3, 7), seed=1), random_tokens((3, 6), seed=2)
    for leaky in (
        lambda n, device=None: torch.ones(n, n, dtype=torch.bool, device=device),  # no mask
        lambda n, device=None: torch.ones(n, n, dtype=torch.bool, device=device).triu(),
    ):  # inverted
        monkeypatch.setattr(tr, "causal_mask", leaky)
        assert future_leaks(model, src, tgt_in)


def test_source_padding_does_not_change_logits():
    model = tiny_model()
    src, tgt_in = random_tokens((2, 5), seed=3), random_tokens((2, 4), seed=4)
    padded = torch.cat([src, torch.full((2, 3), PAD)], dim=1)
    assert torch.allclose(model(src, tgt_in), model(padded, tgt_in), atol=1e-5)
    # batching a short source with a long one (padding) gives its unbatched logits
    long_src = random_tokens((1, 9), seed=5)
    batch = torch.cat([torch.cat([src[:1], torch.full((1, 4), PAD)], dim=1), long_src])
    assert torch.allclose(model(batch, tgt_in)[:1], model(src[:1], tgt_in[:1]), atol=1e-5)


def test_source_padding_is_not_ignored_without_the_mask(monkeypatch):
    model = tiny_model()
    src, tgt_in = random_tokens((2, 5), seed=3), random_tokens((2, 4), seed=4)
    padded = torch.cat([src, torch.full((2, 3), PAD)], dim=1)
    monkeypatch.setattr(model, "_key_padding_mask", lambda tokens: None)
    assert not torch.allclose(model(src, tgt_in), model(padded, tgt_in), atol=1e-5)


def test_target_padding_does_not_change_non_pad_logits():
    model = tiny_model()
    src, tgt_in = random_tokens((2, 6), seed=6), random_tokens((2, 5), seed=7)
    padded = torch.cat([tgt_in, torch.full((2, 3), PAD)], dim=1)
    assert torch.allclose(model(src, padded)[:, :5], model(src, tgt_in), atol=1e-5)
    assert torch.isfinite(model(src, padded)).all()


def test_all_pad_rows_give_finite_logits():
    model = tiny_model()
    src = torch.full((2, 4), PAD)
    tgt_in = torch.tensor([[BOS, 3, PAD], [PAD, PAD, PAD]])
    assert torch.isfinite(model(src, tgt_in)).all()


def test_positions_beyond_max_len():
    model = tiny_model(max_len=4)
    src, tgt_in = random_tokens((1, 9), seed=8), random_tokens((1, 7), seed=9)
    assert model(src, tgt_in).shape == (1, 7, VOCAB)


# ----------------------------------------------------------------------------- loss and target shift


def test_loss_feeds_tgt_without_last_and_scores_next_tokens(monkeypatch):
    model = tiny_model()
    src = pad_rows([[3, 4, 5], [6, 7]], bos=False)
    tgt = pad_rows([[8, 9, 10, 11], [4, 5]], bos=True)
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda s, t: seen.append(t.clone()) or forward(s, t))
    loss_sum, n_tokens = model.loss(src, tgt)
    assert torch.equal(seen[0], tgt[:, :-1])
    logits = forward(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    keep = labels != PAD
    manual = F.cross_entropy(logits[keep], labels[keep], reduction="sum")
    assert n_tokens == int(keep.sum()) == 5 + 3  # 4 tokens + EOS, 2 tokens + EOS
    assert torch.allclose(loss_sum, manual, atol=1e-5)
    smoothed, _ = model.loss(src, tgt, label_smoothing=0.1)
    assert not torch.allclose(smoothed, loss_sum)


def loss_on_fresh_random_targets(model: Seq2SeqTransformer, steps: int = 150) -> float:
    """Train on targets drawn anew every step (independent of the source); return the last loss.

    A correct model cannot beat the entropy of the targets (~1.8 nats/token here); a model whose
    decoder input contains the labels copies them and drives the loss towards 0.
    """
    model.train()
    optimizer = build_optimizer(model, name="adam", lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src = torch.randint(3, 11, (16, 6), generator=g)
        body = torch.randint(3, 11, (16, 6), generator=g)
        tgt = torch.cat([torch.full((16, 1), BOS), body, torch.full((16, 1), EOS)], dim=1)
        loss_sum, n_tokens = model.loss(src, tgt)
        optimizer.zero_grad()
        (loss_sum / n_tokens).backward()
        optimizer.step()
    return loss_sum.item() / n_tokens


class LabelsAsInput(Seq2SeqTransformer):
    """The reference code's bug: the decoder input is the label sequence (target not shifted)."""

    def loss(self, src, tgt, *, label_smoothing=0.0):
        labels = tgt[:, 1:]
        logits = self(src, labels)
        return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=PAD, reduction="sum"), int(
            (labels != PAD).sum()
        )


def test_labels_are_not_visible_to_the_model():
    torch.manual_seed(0)
    assert loss_on_fresh_random_targets(Seq2SeqTransformer(one_layer())) > 1.5


def test_leak_detector_fires_on_unshifted_target_and_on_missing_mask(monkeypatch):
    torch.manual_seed(0)
    model = LabelsAsInput(one_layer())
    assert loss_on_fresh_random_targets(model) < 0.5
    monkeypatch.setattr(tr, "causal_mask", lambda n, device=None: torch.ones(n, n, dtype=torch.bool))
    torch.manual_seed(0)
    assert loss_on_fresh_random_targets(Seq2SeqTransformer(one_layer())) < 0.5


# ----------------------------------------------------------------------------- toy training


TOY_SOURCES = [
    torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(100 + i)).tolist()
    for i, n in enumerate([3, 4, 5, 3, 4, 5, 5, 4, 3, 5, 4, 3])
]


@pytest.fixture(scope="module")
def reverser() -> tuple[Seq2SeqTransformer, torch.Tensor, list[list[int]], float]:
    """A tiny model trained to reverse TOY_SOURCES (full batch, 250 Adam steps)."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(one_layer())
    optimizer = build_optimizer(model, name="adam", lr=3e-3, weight_decay=0.0)
    src = pad_rows(TOY_SOURCES, bos=False)
    tgt = pad_rows([row[::-1] for row in TOY_SOURCES], bos=True)
    for _ in range(250):
        loss_sum, n_tokens = model.loss(src, tgt)
        optimizer.zero_grad()
        (loss_sum / n_tokens).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        loss_sum, n_tokens = model.loss(src, tgt)
    return model, src, [row[::-1] for row in TOY_SOURCES], float(loss_sum / n_tokens)


def test_trained_toy_model_reaches_low_loss_and_decodes(reverser):
    model, src, expected, loss = reverser
    assert loss < 0.05
    assert model.greedy_decode(src, max_len=10) == expected


def test_beam_search_with_one_beam_equals_greedy(reverser):
    model, src, expected, _ = reverser
    assert model.beam_search(src, beam_size=1, max_len=10) == model.greedy_decode(src, max_len=10)
    assert model.beam_search(src, beam_size=3, max_len=10) == expected
    noisy = random_tokens((6, 5), seed=11)  # outside the training set: greedy output is arbitrary
    assert model.beam_search(noisy, beam_size=1, max_len=7) == model.greedy_decode(noisy, max_len=7)


# ----------------------------------------------------------------------------- decoding


def uncached_greedy(model: Seq2SeqTransformer, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding that reruns the whole decoder on the prefix every step (no cache)."""
    out = []
    with torch.no_grad():
        for row in src:
            prefix = [BOS]
            for _ in range(max_len):
                logits = model(row[None], torch.tensor([prefix]))[0, -1]
                logits[[PAD, BOS]] = float("-inf")
                prefix.append(int(logits.argmax()))
                if prefix[-1] == EOS:
                    break
            out.append([t for t in prefix[1:] if t != EOS])
    return out


def test_cached_greedy_matches_uncached_decoding():
    model = tiny_model(seed=5)
    src = pad_rows([[3, 4, 5, 6], [7, 8], [9, 10, 11, 3, 4, 5]], bos=False)
    assert model.greedy_decode(src, max_len=12) == uncached_greedy(model, src, 12)


def scripted_steps(eos_at: list[int | None], calls: list[int]):
    """A stand-in for _decode_step: row i emits 3+i until step eos_at[i] (1-based), there EOS, then 5."""

    def step(last_tokens, state):
        calls.append(1)
        n = len(calls)
        logits = torch.full((len(eos_at), VOCAB), -10.0)
        for i, at in enumerate(eos_at):
            token = 3 + i if at is None or n < at else (EOS if n == at else 5)
            logits[i, token] = 10.0
        return logits

    return step


def test_decoding_stops_at_eos_per_sequence_and_respects_max_len(monkeypatch):
    model = tiny_model()
    src = random_tokens((3, 4), seed=12)
    calls: list[int] = []
    monkeypatch.setattr(model, "_decode_step", scripted_steps([3, 5, None], calls))
    assert model.greedy_decode(src, max_len=7) == [[3, 3], [4, 4, 4, 4], [5] * 7]
    assert len(calls) == 7
    calls.clear()
    monkeypatch.setattr(model, "_decode_step", scripted_steps([3, 5, 2], calls))
    assert model.greedy_decode(src, max_len=10) == [[3, 3], [4, 4, 4, 4], [5]]
    assert len(calls) == 5  # stops once every sequence has emitted EOS


def test_beam_search_stops_at_eos_and_respects_max_len(monkeypatch):
    model = tiny_model()
    src = random_tokens((3, 4), seed=12)
    calls: list[int] = []
    monkeypatch.setattr(model, "_decode_step", scripted_steps([3, 5, None], calls))
    assert model.beam_search(src, beam_size=1, max_len=7) == [[3, 3], [4, 4, 4, 4], [5] * 7]


def test_beam_search_finds_a_better_sequence_than_greedy(monkeypatch):
    """After BOS: A (0.6) or B (0.4). After A: EOS 0.3, the rest spread thin. After B: EOS ~1.

    Greedy picks A then EOS (log 0.18); the best sequence is B EOS (log ~0.4).
    """
    a, b = 3, 4
    table = torch.full((VOCAB, VOCAB), 1e-6)
    table[BOS, a], table[BOS, b] = 0.6, 0.4
    table[a, EOS], table[a, 5:] = 0.3, 0.7 / (VOCAB - 5)
    table[b, EOS] = 1.0
    logits_table = table.log()
    model = tiny_model()
    monkeypatch.setattr(model, "_decode_step", lambda last, state: logits_table[last].clone())
    src = random_tokens((2, 3), seed=13)
    assert model.greedy_decode(src, max_len=5) == [[a], [a]]
    assert model.beam_search(src, beam_size=2, max_len=5) == [[b], [b]]


def test_decoding_restores_training_mode():
    model = tiny_model(dropout=0.5).train()
    src = random_tokens((2, 4), seed=14)
    first = model.greedy_decode(src, max_len=6)
    assert model.training
    assert model.greedy_decode(src, max_len=6) == first  # dropout is off while decoding
    model.beam_search(src, beam_size=2, max_len=6)
    assert model.training
