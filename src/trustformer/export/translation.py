"""Translation model folders (module docstring of the package): the Transformer with its SentencePiece or Hugging
Face tokenizer, saved and loaded."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..models.transformer import Seq2SeqTransformer, TransformerConfig
from .format import HF_FILE, META_FILE, SPM_FILE, TASK_TRANSLATION, ExportError
from .reading import build_config, expect_task, load_weights, read_model_meta
from .writing import save_model_folder

if TYPE_CHECKING:
    from ..data.tokenizer import Tokenizer


def _tokenizer_payload(tokenizer: Any) -> tuple[dict[str, Any], str, bytes]:
    """(model.json's tokenizer entry, file name, file bytes) of a SentencePiece or Hugging Face tokenizer."""
    from ..data.tokenizer import HFTokenizer, SentencePieceTokenizer

    if isinstance(tokenizer, SentencePieceTokenizer):
        kind, name = "sentencepiece", SPM_FILE
        proto = getattr(tokenizer, "_sp", None)
        data = bytes(proto.serialized_model_proto()) if proto is not None else b""
        if not data:  # the processor keeps its model in memory; the file is the fallback
            data = Path(tokenizer.model_file).read_bytes()
    elif isinstance(tokenizer, HFTokenizer):
        kind, name = "hf", HF_FILE
        data = tokenizer._tok.to_str().encode("utf-8")
    else:
        raise TypeError(
            f"cannot save a {type(tokenizer).__name__}: only SentencePieceTokenizer and HFTokenizer can be exported"
        )
    entry = {
        "kind": kind,
        "file": name,
        "name": tokenizer.name,
        "vocab_size": int(tokenizer.vocab_size),
        "pad_id": int(tokenizer.pad_id),
        "bos_id": int(tokenizer.bos_id),
        "eos_id": int(tokenizer.eos_id),
        "unk_id": int(tokenizer.unk_id),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return entry, name, data


def save_translation_model(
    folder: Path, model: Seq2SeqTransformer, tokenizer: Any, *, extra: dict | None = None
) -> Path:
    """Write a translation model folder (``model.safetensors``, ``model.json``, ``tokenizer.model`` or
    ``tokenizer.json``) and return its path. ``extra`` (JSON values, e.g. strategy, round, client ids)
    is stored under ``model.json["extra"]``; the fingerprint is always recorded."""
    if not isinstance(model, Seq2SeqTransformer):
        raise TypeError(f"save_translation_model needs a Seq2SeqTransformer, got {type(model).__name__}")
    config = model.config
    for attr in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        if getattr(tokenizer, attr) != getattr(config, attr):
            raise ValueError(
                f"tokenizer.{attr}={getattr(tokenizer, attr)} differs from the model config's "
                f"{attr}={getattr(config, attr)}: not the tokenizer this model was built for"
            )
    entry, name, data = _tokenizer_payload(tokenizer)
    return save_model_folder(
        folder,
        model,
        task=TASK_TRANSLATION,
        config=asdict(config),
        more_meta={"tokenizer": entry},
        more_files=[(name, data)],
        extra=extra,
    )


def _load_tokenizer(folder: Path, meta: dict[str, Any]) -> Any:
    from ..data.tokenizer import SentencePieceTokenizer, TokenizerUnavailableError, load_hf_tokenizer

    entry = meta.get("tokenizer")
    if not isinstance(entry, dict) or entry.get("kind") not in ("sentencepiece", "hf"):
        raise ExportError(f"{folder / META_FILE}: no valid 'tokenizer' entry (kind sentencepiece or hf)")
    name = entry.get("file") or (SPM_FILE if entry["kind"] == "sentencepiece" else HF_FILE)
    if Path(name).name != name:
        raise ExportError(f"{folder / META_FILE}: the tokenizer file must be a name inside the folder, got {name!r}")
    path = folder / name
    if not path.is_file():
        raise ExportError(f"{folder} lacks its tokenizer file {name}: the model folder is incomplete")
    data = path.read_bytes()
    if entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ExportError(f"{path} is not the tokenizer {META_FILE} describes (SHA-256 differs): the folder is damaged")
    tokenizer: Tokenizer
    try:
        if entry["kind"] == "sentencepiece":
            tokenizer = SentencePieceTokenizer(path, name=entry.get("name"))
        else:
            tokenizer = load_hf_tokenizer(str(path))
            if entry.get("name"):
                tokenizer.name = entry["name"]
    except TokenizerUnavailableError as exc:
        raise ExportError(f"{folder}: cannot load the tokenizer: {exc}") from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise ExportError(f"{path} cannot be read as a {entry['kind']} tokenizer ({exc})") from exc
    return tokenizer


def load_translation_model(
    folder: Path, device: str | torch.device = "cpu"
) -> tuple[Seq2SeqTransformer, Any, dict[str, Any]]:
    """(model in eval mode on ``device``, tokenizer, ``model.json`` as a dict) of a translation model
    folder; :class:`ExportError` when the folder is missing, incomplete, damaged or of another format."""
    folder = Path(folder)
    meta = read_model_meta(folder)
    expect_task(folder, meta, (TASK_TRANSLATION,))
    config = build_config(TransformerConfig, folder, meta)
    tokenizer = _load_tokenizer(folder, meta)
    for attr in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        if getattr(tokenizer, attr) != getattr(config, attr):
            raise ExportError(
                f"{folder}: the tokenizer's {attr} ({getattr(tokenizer, attr)}) differs from the "
                f"model's ({getattr(config, attr)}): the folder's files come from different models"
            )
    with torch.random.fork_rng(devices=[]):  # building draws an initialisation; the caller's RNG is untouched
        model = Seq2SeqTransformer(config)
    model = cast(Seq2SeqTransformer, load_weights(folder, meta, model, device))  # the same module, loaded
    return model, tokenizer, meta


__all__ = ["load_translation_model", "save_translation_model"]
