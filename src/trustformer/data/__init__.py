"""Data layer: parallel corpora, deterministic splits, tokenizers and batching."""

from trustformer.data.batching import encode_pairs, make_batches, pad_sequences
from trustformer.data.corpus import (
    CorpusUnavailableError,
    Pair,
    default_cache_dir,
    load_libreoffice_corpus,
    load_tsv,
    load_wmt19,
    write_tsv,
)
from trustformer.data.split import Splits, split_corpus
from trustformer.data.tokenizer import (
    Tokenizer,
    TokenizerUnavailableError,
    load_hf_tokenizer,
    train_sentencepiece,
)

__all__ = [
    "CorpusUnavailableError",
    "Pair",
    "Splits",
    "Tokenizer",
    "TokenizerUnavailableError",
    "default_cache_dir",
    "encode_pairs",
    "load_hf_tokenizer",
    "load_libreoffice_corpus",
    "load_tsv",
    "load_wmt19",
    "make_batches",
    "pad_sequences",
    "split_corpus",
    "train_sentencepiece",
    "write_tsv",
]
