"""Reading a model folder (module docstring of the package): ``model.json`` checked for format and version, the
model's config rebuilt, and the weights checked against it (names, shapes, fingerprint) before they load."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .format import (
    ARCHITECTURES,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    TASK_TRANSLATION,
    WEIGHTS_FILE,
    ExportError,
    model_fingerprint,
)


def model_folder(path: Path | str, what: str, hint: str) -> Path:
    """``path`` as a Path, or an ExportError when it is missing or not a folder."""
    path = Path(path)
    if not path.exists():
        raise ExportError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise ExportError(f"{path} is not a folder: {hint}")
    return path


def read_json(path: Path, hint: str = "") -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path} cannot be read ({exc}){hint}") from exc


def read_model_meta(folder: Path) -> dict[str, Any]:
    """``model.json`` of a model folder, checked for the format name and version."""
    folder = model_folder(folder, "model folder", f"pass the model folder (the one holding {META_FILE})")
    path = folder / META_FILE
    if not path.is_file():
        raise ExportError(
            f"{folder} is not a trained-model folder (no {META_FILE}): run `trustformer run` "
            "first; its models are written under <run>/models/"
        )
    meta = read_json(path, ": the model folder is damaged")
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
    if meta["task"] not in ARCHITECTURES:
        raise ExportError(f"{path}: unknown task {meta['task']!r} (known: {', '.join(ARCHITECTURES)})")
    return meta


def expect_task(folder: Path, meta: dict[str, Any], tasks: tuple[str, ...]) -> None:
    if meta["task"] not in tasks:
        command = "trustformer translate" if meta["task"] == TASK_TRANSLATION else "trustformer predict"
        raise ExportError(f"{folder} holds a {meta['task']} model, not {' or '.join(tasks)}: use `{command}`")


def build_config(cls: type, folder: Path, meta: dict[str, Any]) -> Any:
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


def load_weights(folder: Path, meta: dict[str, Any], model: nn.Module, device: str | torch.device) -> nn.Module:
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


__all__ = ["read_model_meta"]
