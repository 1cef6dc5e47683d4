"""Trained models as self-contained folders: the format, its fingerprint, saving and loading.

The ``trustformer translate`` / ``predict`` commands that use these folders are in ``commands.py``, and
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

The package's modules, one job each: ``format.py`` (file names, version, :class:`ExportError`, the fingerprint),
``writing.py`` and ``reading.py`` (any model folder), ``translation.py`` and ``images.py`` (each kind of model),
``run_folders.py`` (a run's models).
"""

from __future__ import annotations

from .format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    MODELS_DIR,
    TASK_CLASSIFICATION,
    TASK_SEGMENTATION,
    TASK_TRANSLATION,
    WEIGHTS_FILE,
    ExportError,
    model_fingerprint,
)
from .images import image_input_spec, load_image_model, save_image_model
from .reading import read_model_meta
from .run_folders import export_model, find_models, select_model
from .translation import load_translation_model, save_translation_model

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
    "TASK_CLASSIFICATION",
    "TASK_SEGMENTATION",
    "TASK_TRANSLATION",
]
