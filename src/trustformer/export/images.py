"""Image model folders (module docstring of the package): a FixupResNet (image classification) or a UNet
(segmentation) with the input preprocessing ``trustformer predict`` repeats, saved and loaded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .format import META_FILE, TASK_CLASSIFICATION, TASK_SEGMENTATION, ExportError
from .reading import build_config, expect_task, load_weights, read_model_meta
from .writing import save_model_folder


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
    from ..models.fixup_resnet import FixupResNet
    from ..models.unet import UNet

    if isinstance(model, FixupResNet):
        task, num_classes = TASK_CLASSIFICATION, model.config.num_classes
    elif isinstance(model, UNet):
        task, num_classes = TASK_SEGMENTATION, None
    else:
        raise TypeError(f"save_image_model needs a FixupResNet or a UNet, got {type(model).__name__}")
    spec = _check_input_spec(task, input_spec, model.config.in_channels, num_classes)
    return save_model_folder(
        folder, model, task=task, config=asdict(model.config), more_meta={"input": spec}, more_files=(), extra=extra
    )


def load_image_model(folder: Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """(model in eval mode on ``device``, ``model.json`` as a dict) of an image model folder."""
    from ..models.fixup_resnet import FixupConfig, FixupResNet
    from ..models.unet import UNet, UNetConfig

    folder = Path(folder)
    meta = read_model_meta(folder)
    expect_task(folder, meta, (TASK_CLASSIFICATION, TASK_SEGMENTATION))
    if meta["task"] == TASK_CLASSIFICATION:
        config = build_config(FixupConfig, folder, meta)
        factory: Callable[[], nn.Module] = lambda: FixupResNet(config)  # noqa: E731
        num_classes = config.num_classes
    else:
        config = build_config(UNetConfig, folder, meta)
        factory, num_classes = (lambda: UNet(config)), None
    try:
        meta["input"] = _check_input_spec(meta["task"], meta.get("input") or {}, config.in_channels, num_classes)
    except ValueError as exc:
        raise ExportError(f"{folder / META_FILE}: {exc}") from exc
    with torch.random.fork_rng(devices=[]):
        model = factory()
    return load_weights(folder, meta, model, device), meta


__all__ = ["image_input_spec", "load_image_model", "save_image_model"]
