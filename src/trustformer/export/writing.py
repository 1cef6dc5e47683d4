"""Writing a model folder (module docstring of the package): the weights (shared tensors stored once),
``model.json``, and the files committed so that no reader ever sees a half-written folder."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .format import (
    ARCHITECTURES,
    FORMAT_NAME,
    FORMAT_VERSION,
    HF_FILE,
    META_FILE,
    SPM_FILE,
    WEIGHTS_FILE,
    ExportError,
    model_fingerprint,
)


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
    folder: Path, writers: Sequence[tuple[str, Callable[[Path], object]]], stale: Iterable[str] = ()
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


def _write_bytes(data: bytes) -> Callable[[Path], object]:
    return lambda path: path.write_bytes(data)


def save_model_folder(
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

    from .. import __version__

    folder = Path(folder)
    tensors, aliases = _state_for_saving(model)
    fingerprint = model_fingerprint(model)
    float_dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()})
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "task": task,
        "architecture": ARCHITECTURES[task],
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
    writers: list[tuple[str, Callable[[Path], object]]] = [(name, _write_bytes(data)) for name, data in more_files]
    writers.append((WEIGHTS_FILE, lambda path: save_file(tensors, str(path), metadata=header)))
    writers.append((META_FILE, _write_bytes(meta_bytes)))
    _commit_folder(folder, writers, stale=(SPM_FILE, HF_FILE))
    return folder
