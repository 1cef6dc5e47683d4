"""Trained models as self-contained folders: the format, its fingerprint, saving and loading.

The ``trustformer translate`` / ``predict`` commands that use these folders are in ``model_commands.py``, and
their image decoding is in ``image_files.py``.

After a federated run each distinct final model is written to the run folder, so a user can use it
without the corpus, the data set or the run configuration. A *model folder* holds:

- ``model.safetensors``: the model's ``state_dict`` (contiguous CPU copies; tensors that share
  memory are stored once and listed under ``aliases`` in ``model.json``; the Transformer's tied
  embedding already appears once in its ``state_dict``, as ``embedding.weight``);
- ``model.json``: format name and version, the task, the architecture and its config, the model's
  fingerprint, the tokenizer (translation) or the input preprocessing and class names (images),
  the trustformer version, the UTC time of writing and the caller's ``extra`` (strategy, round …);
- translation only: ``tokenizer.model`` (SentencePiece, the serialized model proto) or
  ``tokenizer.json`` (Hugging Face ``tokenizers``).

A new folder is assembled in a hidden temporary folder beside it and renamed into place, so a crash
leaves no half-written model folder; rewriting an existing folder replaces its files one by one
(each through a temporary file and ``os.replace``), ``model.json`` last.

A finished run lists its models in ``summary.json`` under ``"models"``: client id (a string) →
model folder relative to the run folder, e.g. ``{"0": "models/3f2a…", "1": "models/3f2a…"}``;
clients that hold the same model (same :func:`model_fingerprint`) share one folder
(:func:`export_model` names folders by fingerprint and skips a model already saved).

Loading validates everything it reads and raises :class:`ExportError` (a ``ValueError``) with a
message that names the folder and what is wrong.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .errors import TrustformerError
from .models.adapters import has_adapters, merged
from .models.transformer import Seq2SeqTransformer, TransformerConfig

__all__ = [
    "ExportError",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_FILE",
    "MODELS_DIR",
    "WEIGHTS_FILE",
    "export_model",
    "find_models",
    "image_input_spec",
    "load_image_model",
    "load_translation_model",
    "model_fingerprint",
    "read_model_meta",
    "save_image_model",
    "save_translation_model",
    "select_model",
]

FORMAT_NAME = "trustformer-model"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
SPM_FILE = "tokenizer.model"
HF_FILE = "tokenizer.json"
MODELS_DIR = "models"  # model folders of a run: <run>/models/<fingerprint>
SUMMARY_FILE = "summary.json"


TASK_TRANSLATION = "translation"
TASK_CLASSIFICATION = "image-classification"
TASK_SEGMENTATION = "segmentation"
_ARCHITECTURES = {TASK_TRANSLATION: "Seq2SeqTransformer", TASK_CLASSIFICATION: "FixupResNet", TASK_SEGMENTATION: "UNet"}


class ExportError(TrustformerError, ValueError):
    """A model folder or a run folder cannot be written or used as asked; the message says why."""


# ================================================================================== fingerprint


def _tensor_bytes(t: Tensor) -> memoryview:
    """The raw little-endian bytes of a tensor (any dtype, bfloat16 included), without numpy dtypes."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def model_fingerprint(model: nn.Module | Mapping[str, Tensor]) -> str:
    """First 16 hex digits of a SHA-256 over the ``state_dict`` (or a name → tensor mapping): every
    tensor's name, dtype, shape and bytes, in name order.

    The same weights give the same fingerprint in any process, on any device (tensors are read as CPU
    bytes); any changed value, shape or dtype gives another. Non-persistent buffers (the
    Transformer's sinusoidal positions) are not part of a ``state_dict`` and do not count.
    """
    state = model.state_dict() if isinstance(model, nn.Module) else model
    digest = hashlib.sha256(b"trustformer-fingerprint-v1\n")
    for name in sorted(state):
        t = state[name]
        if not isinstance(t, Tensor):
            raise TypeError(f"model_fingerprint: {name} is a {type(t).__name__}, not a tensor")
        digest.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\n".encode())
        digest.update(_tensor_bytes(t))
    return digest.hexdigest()[:16]


# ====================================================================================== writing


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return value.item()
    if isinstance(value, (Path, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_bytes(obj: Any) -> bytes:
    try:
        return (json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default, allow_nan=False) + "\n").encode(
            "utf-8"
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"model.json: a value is not JSON serializable ({exc}); `extra` must hold JSON "
            "values (numbers, strings, lists, dicts)"
        ) from exc


def _state_for_saving(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Contiguous CPU copies of the ``state_dict``, one per distinct tensor, and the aliases: names whose
    tensor is the very same memory as an earlier name's (safetensors refuses shared storage)."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        t = t.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.to("cpu").clone(memory_format=torch.contiguous_format)
    return tensors, aliases


def _commit_folder(
    folder: Path, writers: Sequence[tuple[str, Callable[[Path], None]]], stale: Iterable[str] = ()
) -> None:
    """Write the files of ``writers`` (name, write(path)) into ``folder`` so that no reader sees a half
    file: a new folder is built under a temporary name beside it and renamed into place; an existing
    one gets its files replaced one by one, in order (put model.json last), then ``stale`` names removed.
    """
    folder = Path(folder)
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"cannot write the model to {folder}: it exists and is not a folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=parent))
    try:
        for name, write in writers:
            write(tmp / name)
        try:
            os.rename(tmp, folder)  # a new (or empty) folder: every file appears at once
            return
        except OSError:
            if not folder.is_dir():
                raise
        for name, _ in writers:  # an existing folder: each file is replaced whole, model.json last
            os.replace(tmp / name, folder / name)
        written = {name for name, _ in writers}
        for name in stale:
            if name not in written:
                (folder / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def _save_model_folder(
    folder: Path,
    model: nn.Module,
    *,
    task: str,
    config: dict[str, Any],
    more_meta: dict[str, Any],
    more_files: Sequence[tuple[str, bytes]],
    extra: Mapping[str, Any] | None,
) -> Path:
    from safetensors.torch import save_file

    from . import __version__

    folder = Path(folder)
    tensors, aliases = _state_for_saving(model)
    fingerprint = model_fingerprint(model)
    float_dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()})
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "task": task,
        "architecture": _ARCHITECTURES[task],
        "config": config,
        "fingerprint": fingerprint,
        "weights": {
            "file": WEIGHTS_FILE,
            "tensors": len(tensors),
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtypes": float_dtypes,
        },
        "aliases": aliases,
        **more_meta,
        "trustformer_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "extra": dict(extra or {}),
    }
    meta_bytes = _json_bytes(meta)  # before writing anything: a bad `extra` leaves no folder behind
    header = {
        "format": "pt",
        "trustformer_format": FORMAT_NAME,
        "trustformer_format_version": str(FORMAT_VERSION),
        "fingerprint": fingerprint,
        "task": task,
    }
    writers: list[tuple[str, Callable[[Path], None]]] = [(name, _write_bytes(data)) for name, data in more_files]
    writers.append((WEIGHTS_FILE, lambda path: save_file(tensors, str(path), metadata=header)))
    writers.append((META_FILE, _write_bytes(meta_bytes)))
    _commit_folder(folder, writers, stale=(SPM_FILE, HF_FILE))
    return folder


# ------------------------------------------------------------------------------- translation


def _tokenizer_payload(tokenizer: Any) -> tuple[dict[str, Any], str, bytes]:
    """(model.json's tokenizer entry, file name, file bytes) of a SentencePiece or Hugging Face tokenizer."""
    from .data.tokenizer import HFTokenizer, SentencePieceTokenizer

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
    return _save_model_folder(
        folder,
        model,
        task=TASK_TRANSLATION,
        config=asdict(config),
        more_meta={"tokenizer": entry},
        more_files=[(name, data)],
        extra=extra,
    )


# =================================================================================== reading


def _folder(path: Path | str, what: str, hint: str) -> Path:
    """``path`` as a Path, or an ExportError when it is missing or not a folder."""
    path = Path(path)
    if not path.exists():
        raise ExportError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise ExportError(f"{path} is not a folder: {hint}")
    return path


def _read_json(path: Path, hint: str = "") -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path} cannot be read ({exc}){hint}") from exc


def read_model_meta(folder: Path) -> dict[str, Any]:
    """``model.json`` of a model folder, checked for the format name and version."""
    folder = _folder(folder, "model folder", f"pass the model folder (the one holding {META_FILE})")
    path = folder / META_FILE
    if not path.is_file():
        raise ExportError(
            f"{folder} is not a trained-model folder (no {META_FILE}): run `trustformer run` "
            "first; its models are written under <run>/models/"
        )
    meta = _read_json(path, ": the model folder is damaged")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ExportError(
            f"{path} is not a trustformer model description (format is "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT_NAME!r})"
        )
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        hint = (
            "it was written by a newer trustformer: upgrade trustformer"
            if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
            else "the file is damaged"
        )
        raise ExportError(
            f"{path} has model format version {version!r}; this trustformer reads version {FORMAT_VERSION} ({hint})"
        )
    for key, kind in (("task", str), ("config", dict)):
        if not isinstance(meta.get(key), kind):
            raise ExportError(f"{path} lacks a valid {key!r} entry: the model folder is damaged")
    if meta["task"] not in _ARCHITECTURES:
        raise ExportError(f"{path}: unknown task {meta['task']!r} (known: {', '.join(_ARCHITECTURES)})")
    return meta


def _expect_task(folder: Path, meta: dict[str, Any], tasks: tuple[str, ...]) -> None:
    if meta["task"] not in tasks:
        command = "trustformer translate" if meta["task"] == TASK_TRANSLATION else "trustformer predict"
        raise ExportError(f"{folder} holds a {meta['task']} model, not {' or '.join(tasks)}: use `{command}`")


def _build_config(cls: type, folder: Path, meta: dict[str, Any]) -> Any:
    raw = dict(meta["config"])
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ExportError(
            f"{folder / META_FILE}: unknown {cls.__name__} field(s) {', '.join(unknown)} "
            "(written by another trustformer version?)"
        )
    for key, value in raw.items():
        if isinstance(value, list):
            raw[key] = tuple(value)
    try:
        return cls(**raw)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"{folder / META_FILE}: invalid model config: {exc}") from exc


def _names(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def _load_weights(folder: Path, meta: dict[str, Any], model: nn.Module, device: str | torch.device) -> nn.Module:
    """Read ``model.safetensors``, check names, shapes and the fingerprint against ``model`` (built from
    the config), load it, move it to ``device`` and switch it to eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise ExportError(f"{folder} has {META_FILE} but no {WEIGHTS_FILE}: the model folder is incomplete")
    try:
        loaded = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ExportError(f"{path} cannot be read ({exc}): the file is damaged") from exc
    aliases = meta.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise ExportError(f"{folder / META_FILE}: 'aliases' must be a mapping")
    for alias, target in aliases.items():
        if target not in loaded:
            raise ExportError(f"{folder / META_FILE}: alias {alias} refers to {target}, which {WEIGHTS_FILE} lacks")
        loaded[alias] = loaded[target]
    expected = model.state_dict()
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    wrong = [
        f"{name} is {list(loaded[name].shape)} in the file but {list(expected[name].shape)} for the config"
        for name in sorted(set(expected) & set(loaded))
        if loaded[name].shape != expected[name].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_names(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes: {_names(wrong, 3)}")
    if problems:
        raise ExportError(
            f"{path} does not match the {meta.get('architecture', 'model')} described by {META_FILE}: "
            + "; ".join(problems)
        )
    recorded = meta.get("fingerprint")
    if recorded is not None and model_fingerprint(loaded) != recorded:
        raise ExportError(
            f"{path} does not hold the weights {META_FILE} describes (fingerprint "
            f"{model_fingerprint(loaded)}, expected {recorded}): the folder is damaged or its "
            "files come from different models"
        )
    dtypes = {t.dtype for t in loaded.values() if t.is_floating_point()}
    if len(dtypes) == 1 and next(iter(dtypes)) != torch.float32:
        model = model.to(next(iter(dtypes)))
    model.load_state_dict(loaded, strict=True)
    return model.to(device).eval()


def _load_tokenizer(folder: Path, meta: dict[str, Any]) -> Any:
    from .data.tokenizer import SentencePieceTokenizer, TokenizerUnavailableError, load_hf_tokenizer

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
    _expect_task(folder, meta, (TASK_TRANSLATION,))
    config = _build_config(TransformerConfig, folder, meta)
    tokenizer = _load_tokenizer(folder, meta)
    for attr in ("vocab_size", "pad_id", "bos_id", "eos_id"):
        if getattr(tokenizer, attr) != getattr(config, attr):
            raise ExportError(
                f"{folder}: the tokenizer's {attr} ({getattr(tokenizer, attr)}) differs from the "
                f"model's ({getattr(config, attr)}): the folder's files come from different models"
            )
    with torch.random.fork_rng(devices=[]):  # building draws an initialisation; the caller's RNG is untouched
        model = Seq2SeqTransformer(config)
    model = _load_weights(folder, meta, model, device)
    return model, tokenizer, meta


# ====================================================================================== images


def image_input_spec(task: Any) -> dict[str, Any]:
    """What ``trustformer predict`` needs to prepare an image as the training data were: from an
    ``ImageClassificationTask``, a ``SegmentationTask`` or an ``ImageRunTask`` (its ``.task``).

    Classification: ``dataset``, ``channels``, ``height``, ``width`` (the training images' shape), pixel
    ``scale`` 255, per-channel ``mean``/``std`` (``image_data.CHANNEL_STATS``, the constants training
    normalises with) and ``classes``. Segmentation: ``dataset``, ``channels``, ``height``, ``width``,
    ``intensity`` (LGG: ``{"scale": 255}``, as its loader; MRI brain extraction:
    ``{"percentile": 99.5, "clip": 1.5}``, the loader's volume scaling applied per image) and the
    probability ``threshold``.
    """
    inner = getattr(task, "task", task)
    if not hasattr(inner, "input_spec"):
        raise TypeError(f"image_input_spec: not an image task: {type(inner).__name__}")
    return inner.input_spec()


def _check_input_spec(task: str, spec: Mapping[str, Any], in_channels: int, num_classes: int | None) -> dict:
    spec = dict(spec)
    for key in ("channels", "height", "width"):
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"input spec: {key} must be a positive int, got {value!r}")
    if spec["channels"] != in_channels:
        raise ValueError(f"input spec: channels={spec['channels']} but the model takes {in_channels}")
    if spec["channels"] not in (1, 3):
        raise ValueError(f"input spec: channels must be 1 (grayscale) or 3 (RGB), got {spec['channels']}")
    if task == TASK_CLASSIFICATION:
        for key in ("mean", "std"):
            values = spec.get(key)
            if not isinstance(values, (list, tuple)) or len(values) != in_channels:
                raise ValueError(f"input spec: {key} must list one value per channel ({in_channels})")
            spec[key] = [float(v) for v in values]
        if any(v <= 0 for v in spec["std"]):
            raise ValueError("input spec: std values must be > 0")
        classes = spec.get("classes")
        if not isinstance(classes, (list, tuple)) or len(classes) != num_classes:
            raise ValueError(f"input spec: classes must name the model's {num_classes} classes")
        spec["classes"] = [str(c) for c in classes]
        spec.setdefault("scale", 255.0)
    else:
        intensity = spec.setdefault("intensity", {"scale": 255.0})
        if not isinstance(intensity, dict) or not ({"scale"} <= set(intensity) or {"percentile"} <= set(intensity)):
            raise ValueError("input spec: intensity must be {'scale': s} or {'percentile': q, 'clip': c}")
        threshold = float(spec.setdefault("threshold", 0.5))
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"input spec: threshold must be in (0, 1), got {threshold}")
    return spec


def save_image_model(
    folder: Path, model: nn.Module, input_spec: Mapping[str, Any], *, extra: dict | None = None
) -> Path:
    """Write an image model folder: a ``FixupResNet`` (task ``image-classification``) or a ``UNet``
    (``segmentation``), its config and ``input_spec`` (see :func:`image_input_spec`) in ``model.json``."""
    from .models.fixup_resnet import FixupResNet
    from .models.unet import UNet

    if isinstance(model, FixupResNet):
        task, num_classes = TASK_CLASSIFICATION, model.config.num_classes
    elif isinstance(model, UNet):
        task, num_classes = TASK_SEGMENTATION, None
    else:
        raise TypeError(f"save_image_model needs a FixupResNet or a UNet, got {type(model).__name__}")
    spec = _check_input_spec(task, input_spec, model.config.in_channels, num_classes)
    return _save_model_folder(
        folder, model, task=task, config=asdict(model.config), more_meta={"input": spec}, more_files=(), extra=extra
    )


def load_image_model(folder: Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """(model in eval mode on ``device``, ``model.json`` as a dict) of an image model folder."""
    from .models.fixup_resnet import FixupConfig, FixupResNet
    from .models.unet import UNet, UNetConfig

    folder = Path(folder)
    meta = read_model_meta(folder)
    _expect_task(folder, meta, (TASK_CLASSIFICATION, TASK_SEGMENTATION))
    if meta["task"] == TASK_CLASSIFICATION:
        config = _build_config(FixupConfig, folder, meta)
        factory: Callable[[], nn.Module] = lambda: FixupResNet(config)  # noqa: E731
        num_classes = config.num_classes
    else:
        config = _build_config(UNetConfig, folder, meta)
        factory, num_classes = (lambda: UNet(config)), None
    try:
        meta["input"] = _check_input_spec(meta["task"], meta.get("input") or {}, config.in_channels, num_classes)
    except ValueError as exc:
        raise ExportError(f"{folder / META_FILE}: {exc}") from exc
    with torch.random.fork_rng(devices=[]):
        model = factory()
    return _load_weights(folder, meta, model, device), meta


# ================================================================================ run folders


def export_model(
    models_dir: Path,
    model: nn.Module,
    *,
    tokenizer: Any = None,
    input_spec: Mapping[str, Any] | None = None,
    extra: dict | None = None,
) -> Path:
    """Save ``model`` as ``models_dir/<fingerprint>`` (translation: pass ``tokenizer``; images: pass
    ``input_spec``) unless that folder already holds it (same fingerprint and format version: another
    client with the same model wrote it), and return the folder. ``extra`` should describe the model
    (strategy, round); which clients hold it is the run summary's ``"models"`` mapping. A model with LoRA adapters
    is saved with them merged into its weights (``models/adapters.py``): a plain model ``translate`` loads."""
    if has_adapters(model):
        model = merged(model)
    folder = Path(models_dir) / model_fingerprint(model)
    try:
        meta = read_model_meta(folder)
        if meta.get("fingerprint") == folder.name and (folder / WEIGHTS_FILE).is_file():
            return folder
    except ExportError:
        pass
    if isinstance(model, Seq2SeqTransformer):
        if tokenizer is None:
            raise TypeError("export_model: a translation model needs its tokenizer")
        return save_translation_model(folder, model, tokenizer, extra=extra)
    if input_spec is None:
        raise TypeError("export_model: an image model needs its input_spec (see image_input_spec)")
    return save_image_model(folder, model, input_spec, extra=extra)


def find_models(run_dir: Path) -> dict[int, Path]:
    """Client id → model folder of a finished run, from ``run_dir/summary.json``'s ``"models"`` entry
    (paths relative to the run folder; clients holding the same model share a folder). Sorted by id."""
    run_dir = _folder(run_dir, "run folder", "pass a run folder (the --out of `trustformer run`)")
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file():
        raise ExportError(
            f"{run_dir} has no {SUMMARY_FILE}: it is not a finished run folder (pass the --out "
            "folder of a completed `trustformer run`)"
        )
    summary = _read_json(summary_path)
    models = summary.get("models") if isinstance(summary, dict) else None
    if not models:
        raise ExportError(
            f'{summary_path} lists no trained models (no "models" entry): the run predates '
            "model export or did not finish; rerun it"
        )
    if not isinstance(models, dict):
        raise ExportError(f'{summary_path}: "models" must map client ids to model folders')
    out: dict[int, Path] = {}
    for key, rel in models.items():
        try:
            client = int(key)
        except (TypeError, ValueError):
            raise ExportError(f'{summary_path}: "models" has a key {key!r} that is not a client id') from None
        if not isinstance(rel, str) or not rel:
            raise ExportError(f'{summary_path}: "models"[{key!r}] must be a folder path, got {rel!r}')
        out[client] = run_dir / rel
    return dict(sorted(out.items()))


def select_model(run_dir: Path, client: int | None = None) -> tuple[int, Path]:
    """(client id, model folder) of ``client`` in a run, by default the lowest client id."""
    models = find_models(run_dir)
    if client is None:
        client = next(iter(models))
    if client not in models:
        raise ExportError(f"run {run_dir} has no client {client}: its clients are {', '.join(str(c) for c in models)}")
    return client, models[client]
