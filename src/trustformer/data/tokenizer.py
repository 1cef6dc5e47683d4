"""Subword tokenizers: a shared-vocabulary SentencePiece model trained locally, or a Hugging Face one.

Both implement :class:`Tokenizer`: ``encode`` adds no BOS/EOS (see :mod:`trustformer.data.batching`
for where they are added) and ``decode`` drops padding, BOS and EOS ids.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from ..errors import TrustformerError

__all__ = [
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "TokenizerUnavailableError",
    "load_hf_tokenizer",
    "train_sentencepiece",
]

logger = logging.getLogger(__name__)

SPM_PAD_ID, SPM_UNK_ID, SPM_BOS_ID, SPM_EOS_ID = 0, 1, 2, 3
_SPM_MODEL_TYPE = "unigram"
_SPM_CACHE_FORMAT = "spm-v1"  # bump when the training options change, so old cache entries are not reused


class TokenizerUnavailableError(TrustformerError, RuntimeError):
    """A tokenizer cannot be loaded (missing package, file or network)."""


class Tokenizer(ABC):
    """Text ↔ ids with distinct pad/BOS/EOS/unknown ids.

    Attributes: ``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``, ``unk_id`` and ``name`` (a short
    description recorded with results).
    """

    name: str
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS or EOS."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; pad, BOS and EOS ids are skipped (decoding does not stop at EOS)."""

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids that ``decode`` drops."""
        return frozenset({self.pad_id, self.bos_id, self.eos_id})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------------
# SentencePiece


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model loaded from a ``.model`` file."""

    def __init__(self, model_file: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.model_file = Path(model_file)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        self.vocab_size = int(self._sp.get_piece_size())
        self.pad_id = int(self._sp.pad_id())
        self.bos_id = int(self._sp.bos_id())
        self.eos_id = int(self._sp.eos_id())
        self.unk_id = int(self._sp.unk_id())
        self.name = name or f"sentencepiece:{self.model_file.name}:{self.vocab_size}"
        _check_special_ids(self)

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        special = self.special_ids
        return self._sp.decode([int(i) for i in ids if int(i) not in special])

    def pieces(self) -> list[str]:
        """All pieces of the vocabulary, in id order."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]


def train_sentencepiece(texts: Sequence[str], *, vocab_size: int, cache_dir: Path, seed: int) -> Tokenizer:
    """Train (or load from cache) a shared-vocabulary SentencePiece unigram model.

    Pass the texts of both languages together. Ids: pad 0, unknown 1, BOS 2, EOS 3. Training is
    single-threaded and uses every text in the given order, so it is deterministic; the model is cached
    under ``cache_dir`` keyed by a hash of (texts, vocab_size, seed) and loaded on later calls.
    ``vocab_size`` is an upper bound: a small corpus may give fewer pieces (the actual size is
    ``tokenizer.vocab_size``). Raises ``ValueError`` when ``vocab_size`` is too small for the
    characters of the texts or when there are no texts.
    """
    lines = [" ".join(text.split()) for text in texts]
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError("train_sentencepiece needs at least one non-empty text")
    if vocab_size < 5:
        raise ValueError(f"vocab_size must be >= 5 (4 special ids + pieces), got {vocab_size}")
    key = _cache_key(lines, vocab_size, seed)
    model_file = Path(cache_dir) / f"spm-{key[:20]}" / "spm.model"
    name = f"sentencepiece-{_SPM_MODEL_TYPE}(vocab<={vocab_size},seed={seed},data={key[:12]})"
    if model_file.is_file():
        logger.info("loading cached SentencePiece model %s", model_file)
        return SentencePieceTokenizer(model_file, name=name)
    logger.info("training SentencePiece (%s, vocab_size=%d) on %d texts", _SPM_MODEL_TYPE, vocab_size, len(lines))
    proto = _train_model_proto(lines, vocab_size, seed)
    _write_bytes_atomic(model_file, proto)
    return SentencePieceTokenizer(model_file, name=name)


def _cache_key(lines: Sequence[str], vocab_size: int, seed: int) -> str:
    """Hash of everything that determines the trained model."""
    digest = hashlib.sha256(f"{_SPM_CACHE_FORMAT}|{_SPM_MODEL_TYPE}|{vocab_size}|{seed}\n".encode())
    for line in lines:
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _train_model_proto(lines: Sequence[str], vocab_size: int, seed: int) -> bytes:
    """Run the SentencePiece trainer in memory and return the serialized model."""
    # Every sentence is used in the given order (no sampling, no shuffling) on one thread, so training
    # is deterministic; the seed also fixes SentencePiece's own random generator for good measure.
    spm.set_random_generator_seed(seed & 0xFFFFFFFF)
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=buffer,
            model_type=_SPM_MODEL_TYPE,
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            character_coverage=1.0,
            pad_id=SPM_PAD_ID,
            unk_id=SPM_UNK_ID,
            bos_id=SPM_BOS_ID,
            eos_id=SPM_EOS_ID,
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            minloglevel=2,
        )
    except RuntimeError as exc:
        if "smaller than required_chars" in str(exc):
            raise ValueError(
                f"vocab_size={vocab_size} is too small for the {len(set(''.join(lines)))} distinct "
                f"characters of the training texts: increase vocab_size. ({exc})"
            ) from exc
        raise
    return buffer.getvalue()


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write bytes through a temporary file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_special_ids(tokenizer: Tokenizer) -> None:
    """Pad, BOS, EOS and unknown ids must be real and distinct."""
    ids = {
        "pad": tokenizer.pad_id,
        "bos": tokenizer.bos_id,
        "eos": tokenizer.eos_id,
        "unk": tokenizer.unk_id,
    }
    if any(i < 0 or i >= tokenizer.vocab_size for i in ids.values()) or len(set(ids.values())) != 4:
        raise ValueError(f"tokenizer {tokenizer.name}: special ids must be distinct and in range, got {ids}")


# --------------------------------------------------------------------------------------------------
# Hugging Face tokenizers

_SPECIAL_TOKEN_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "bos": ("<s>", "[CLS]", "<bos>", "[BOS]", "<|startoftext|>"),
    "eos": ("</s>", "[SEP]", "<eos>", "[EOS]", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` (e.g. the XLM-R one) behind the :class:`Tokenizer` API."""

    def __init__(self, backend: Any, *, name: str) -> None:
        self._tok = backend
        self.name = name
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        ids = {role: _find_token(backend, role) for role in _SPECIAL_TOKEN_NAMES}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids["pad"], ids["bos"], ids["eos"], ids["unk"]
        _check_special_ids(self)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        special = self.special_ids
        return self._tok.decode([int(i) for i in ids if int(i) not in special], skip_special_tokens=False)


def _find_token(backend: Any, role: str) -> int:
    """Id of the first known spelling of a special token; error naming the spellings tried."""
    for token in _SPECIAL_TOKEN_NAMES[role]:
        token_id = backend.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    raise TokenizerUnavailableError(
        f"the tokenizer has no {role} token (tried {', '.join(_SPECIAL_TOKEN_NAMES[role])})"
    )


def load_hf_tokenizer(name_or_path: str) -> Tokenizer:
    """Load a Hugging Face tokenizer from a local ``tokenizer.json`` (or its folder) or the Hub.

    A name that is not an existing path (e.g. ``xlm-roberta-base``) is fetched with
    ``tokenizers.Tokenizer.from_pretrained``, which needs network access to the Hugging Face Hub.
    Raises ``TokenizerUnavailableError`` naming what failed and the alternatives.
    """
    try:
        from tokenizers import Tokenizer as Backend
    except ImportError as exc:
        raise TokenizerUnavailableError(
            "Hugging Face tokenizers are not installed: pip install trustformer[hf]. "
            f"Alternatively train a SentencePiece tokenizer (the default). ({exc})"
        ) from exc
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
            raise TokenizerUnavailableError(f"cannot read tokenizer file {path}: {exc}") from exc
        return HFTokenizer(backend, name=f"hf:{path.name}")
    if path.suffix == ".json" or name_or_path.startswith((".", "/", "~")):
        raise TokenizerUnavailableError(f"tokenizer file not found: {path}")
    try:
        backend = Backend.from_pretrained(name_or_path)
    except Exception as exc:  # noqa: BLE001 - network and hub errors come as plain Exception
        raise TokenizerUnavailableError(
            f"cannot load tokenizer {name_or_path!r} from the Hugging Face Hub ({exc}). The Hub needs "
            "network access; alternatively pass the path of a local tokenizer.json, or train a "
            "SentencePiece tokenizer on the public split (the default)."
        ) from exc
    return HFTokenizer(backend, name=f"hf:{name_or_path}")
