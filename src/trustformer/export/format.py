"""The model folder's format (module docstring of the package): its file names and version, the tasks and their
architectures, the error every reader and writer raises, and the model fingerprint that names a folder."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ..errors import TrustformerError

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
ARCHITECTURES = {TASK_TRANSLATION: "Seq2SeqTransformer", TASK_CLASSIFICATION: "FixupResNet", TASK_SEGMENTATION: "UNet"}


class ExportError(TrustformerError, ValueError):
    """A model folder or a run folder cannot be written or used as asked; the message says why."""


# ================================================================================== fingerprint


def _tensor_bytes(t: Tensor) -> memoryview:
    """The raw little-endian bytes of a tensor (any dtype, bfloat16 included), without numpy dtypes."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    # numpy's stubs declare ndarray.__buffer__ for Python >= 3.12 only; an ndarray is a buffer on every version
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


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


__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "HF_FILE",
    "META_FILE",
    "MODELS_DIR",
    "SPM_FILE",
    "SUMMARY_FILE",
    "TASK_CLASSIFICATION",
    "TASK_SEGMENTATION",
    "TASK_TRANSLATION",
    "WEIGHTS_FILE",
    "ExportError",
    "model_fingerprint",
]
