"""Tokenizers (SentencePiece, Hugging Face) and batching."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from trustformer.data import tokenizer as tokenizer_module
from trustformer.data.batching import encode_pairs, make_batches
from trustformer.data.tokenizer import (
    Tokenizer,
    TokenizerUnavailableError,
    load_hf_tokenizer,
    train_sentencepiece,
)

RU = [
    "Выберите команду Файл - Печать.",
    "Откройте вкладку Заменить.",
    "Эта команда доступна только в том случае, если курсор находится в таблице.",
    "Введите ширину выделенного графического объекта в процентах.",
    "Определение времени показа каждого слайда.",
    "Преобразует сноску в концевую сноску.",
    "Задайте расстояние между линиями обрамления и содержимым.",
    "Сохранить документ как новый файл.",
]
EN = [
    "Choose File - Print.",
    "Click the Replace tab.",
    "This command is only available if the cursor is in a table.",
    "Enter the width for the selected graphic as a percentage.",
    "Defines the amount of time for each slide display.",
    "Converts a footnote to an endnote.",
    "Select the distance between the border lines and the contents.",
    "Save the document as a new file.",
]
TEXTS = [f"{text} {i}" for i in range(12) for text in RU + EN]


@pytest.fixture(scope="module")
def spm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spm")


@pytest.fixture(scope="module")
def spm(spm_cache: Path) -> Tokenizer:
    return train_sentencepiece(TEXTS, vocab_size=200, cache_dir=spm_cache, seed=0)


# --------------------------------------------------------------------------------------------------
# SentencePiece


def test_sentencepiece_round_trip(spm: Tokenizer) -> None:
    for text in ("Выберите команду Файл - Печать.", "Click the Replace tab."):
        ids = spm.encode(text)
        assert ids and spm.bos_id not in ids and spm.eos_id not in ids
        assert spm.decode(ids) == text
        assert spm.decode([spm.bos_id, *ids, spm.eos_id, spm.pad_id, spm.pad_id]) == text


def test_sentencepiece_special_ids(spm: Tokenizer) -> None:
    assert spm.pad_id == 0
    specials = [spm.pad_id, spm.bos_id, spm.eos_id, spm.unk_id]
    assert len(set(specials)) == 4
    assert all(0 <= i < spm.vocab_size for i in specials)
    assert 50 < spm.vocab_size <= 200
    assert "sentencepiece" in spm.name


def test_sentencepiece_cache_is_reused(spm: Tokenizer, spm_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*args, **kwargs):
        raise AssertionError("the cached model should have been loaded")

    monkeypatch.setattr(tokenizer_module, "_train_model_proto", no_training)
    again = train_sentencepiece(TEXTS, vocab_size=200, cache_dir=spm_cache, seed=0)
    assert again.encode("Click the Replace tab.") == spm.encode("Click the Replace tab.")
    assert len(list(spm_cache.glob("spm-*/spm.model"))) == 1
    with pytest.raises(AssertionError):  # other texts or sizes are other models
        train_sentencepiece(TEXTS[:-1], vocab_size=200, cache_dir=spm_cache, seed=0)


def test_sentencepiece_training_is_deterministic(spm: Tokenizer, tmp_path: Path) -> None:
    other = train_sentencepiece(TEXTS, vocab_size=200, cache_dir=tmp_path, seed=0)
    assert other.pieces() == spm.pieces()  # type: ignore[attr-defined]
    assert other.model_file.read_bytes() == spm.model_file.read_bytes()  # type: ignore[attr-defined]


def test_sentencepiece_vocab_too_small(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too small"):
        train_sentencepiece(TEXTS, vocab_size=20, cache_dir=tmp_path, seed=0)
    with pytest.raises(ValueError):
        train_sentencepiece(["", "  "], vocab_size=100, cache_dir=tmp_path, seed=0)


# --------------------------------------------------------------------------------------------------
# Hugging Face tokenizers


@pytest.fixture(scope="module")
def hf_tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    backend.train_from_iterator(TEXTS, trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    backend.save(str(path))
    return path


def test_hf_tokenizer_from_file(hf_tokenizer_file: Path) -> None:
    for source in (hf_tokenizer_file, hf_tokenizer_file.parent):
        tok = load_hf_tokenizer(str(source))
        assert (tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
        text = "Откройте вкладку Заменить."
        ids = tok.encode(text)
        assert tok.bos_id not in ids and tok.eos_id not in ids
        assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
        assert tok.decode(tok.encode("Click the Replace tab.")) == "Click the Replace tab."
        assert tok.vocab_size > 4 and tok.name.startswith("hf:")


def test_hf_tokenizer_missing_file(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    with pytest.raises(TokenizerUnavailableError, match="not found"):
        load_hf_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))


# --------------------------------------------------------------------------------------------------
# Batching


class CharTokenizer(Tokenizer):
    """One id per character: 4 + its code point modulo 1000."""

    name = "chars"
    vocab_size = 1004
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def encode(self, text: str) -> list[int]:
        return [4 + ord(ch) % 1000 for ch in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(chr(i - 4) for i in ids if i >= 4)


def test_encode_pairs_convention() -> None:
    tok = CharTokenizer()
    (src, tgt), (long_src, long_tgt) = encode_pairs([("abc", "xy"), ("a" * 20, "b" * 20)], tok, max_len=8)
    assert src == tok.encode("abc") + [tok.eos_id]
    assert tgt == [tok.bos_id] + tok.encode("xy") + [tok.eos_id]
    assert len(long_src) == 8 and long_src[-1] == tok.eos_id and long_src[:-1] == tok.encode("a" * 7)
    assert len(long_tgt) == 8 and long_tgt[0] == tok.bos_id and long_tgt[-1] == tok.eos_id
    assert long_tgt[1:-1] == tok.encode("b" * 6)


def test_encode_pairs_with_sentencepiece(spm: Tokenizer) -> None:
    encoded = encode_pairs(list(zip(RU, EN, strict=True)), spm, max_len=10)
    for src, tgt in encoded:
        assert len(src) <= 10 and len(tgt) <= 10
        assert src[-1] == spm.eos_id and spm.bos_id not in src
        assert tgt[0] == spm.bos_id and tgt[-1] == spm.eos_id


def test_make_batches_shapes_and_padding() -> None:
    tok = CharTokenizer()
    pairs = [("a" * n, "b" * (n % 4 + 1)) for n in range(1, 8)]
    encoded = encode_pairs(pairs, tok, max_len=6)
    batches = make_batches(encoded, batch_size=3, pad_id=tok.pad_id, shuffle=False)
    assert [src.shape[0] for src, _ in batches] == [3, 3, 1]
    src, tgt = batches[0]
    assert src.dtype == torch.long and tgt.dtype == torch.long
    assert src.shape == (3, 4) and tgt.shape == (3, 6)  # targets "bb", "bbb", "bbbb" + BOS/EOS
    assert src[0].tolist() == tok.encode("a") + [tok.eos_id, tok.pad_id, tok.pad_id]
    assert tgt[0].tolist() == [tok.bos_id, *tok.encode("bb"), tok.eos_id, tok.pad_id, tok.pad_id]
    assert all(s.shape[1] <= 6 and t.shape[1] <= 6 for s, t in batches)


def test_make_batches_shuffle_is_deterministic_and_complete() -> None:
    tok = CharTokenizer()
    encoded = encode_pairs([(f"s{i}", f"t{i}") for i in range(23)], tok, max_len=6)

    def rows(batches):
        return [tuple(row[row != tok.pad_id].tolist()) for src, _ in batches for row in src]

    first = make_batches(encoded, batch_size=5, pad_id=0, shuffle=True, seed=1)
    again = make_batches(encoded, batch_size=5, pad_id=0, shuffle=True, seed=1)
    other = make_batches(encoded, batch_size=5, pad_id=0, shuffle=True, seed=2)
    assert rows(first) == rows(again)
    assert rows(first) != rows(other)
    assert sorted(rows(first)) == sorted(tuple(src) for src, _ in encoded)
    with pytest.raises(ValueError, match="seed"):
        make_batches(encoded, batch_size=5, pad_id=0, shuffle=True)
