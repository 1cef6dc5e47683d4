"""Data layer: parallel corpora, deterministic splits, tokenizers and batching."""

from trustformer.data.batching import encode_pairs, make_batches, pad_sequences
from trustformer.data.corpus import default_cache_dir, load_libreoffice_corpus
from trustformer.data.corpus_errors import CorpusUnavailableError
from trustformer.data.split import Splits, split_corpus
from trustformer.data.tokenizer import (
    Tokenizer,
    TokenizerUnavailableError,
    load_hf_tokenizer,
    train_sentencepiece,
)
from trustformer.data.tsv import Pair, load_tsv, write_tsv
from trustformer.data.wmt import load_wmt19

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
