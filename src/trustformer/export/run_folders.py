"""A run's model folders (module docstring of the package): each distinct final model saved once, named by its
fingerprint, and found again from the run's ``summary.json``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..models.adapters import has_adapters, merged
from ..models.transformer import Seq2SeqTransformer
from .format import SUMMARY_FILE, WEIGHTS_FILE, ExportError, model_fingerprint
from .images import save_image_model
from .reading import model_folder, read_json, read_model_meta
from .translation import save_translation_model


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
    run_dir = model_folder(run_dir, "run folder", "pass a run folder (the --out of `trustformer run`)")
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file():
        raise ExportError(
            f"{run_dir} has no {SUMMARY_FILE}: it is not a finished run folder (pass the --out "
            "folder of a completed `trustformer run`)"
        )
    summary = read_json(summary_path)
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


__all__ = ["export_model", "find_models", "select_model"]
