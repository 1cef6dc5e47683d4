"""Image files as the inputs of a trained image model (``trustformer predict``): finding them, decoding them to
float C×H×W in 0-1, and the resizing and normalisation each task's training used."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import ExportError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
MASK_SUFFIX = ".mask.png"

__all__ = ["IMAGE_SUFFIXES", "MASK_SUFFIX", "classification_input", "image_files", "read_image", "segmentation_input"]


def image_files(paths: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.lower().endswith(MASK_SUFFIX)
            )
            if not found:
                raise ExportError(f"{path} holds no image file ({', '.join(IMAGE_SUFFIXES)})")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ExportError(f"{path} does not exist")
    return files


def read_image(path: Path, channels: int) -> Tensor:
    """An image file as float32 C×H×W in 0-1 (16-bit grayscale kept at full precision)."""
    import numpy as np
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            if im.mode.startswith("I;16") or im.mode == "I":
                arr = np.asarray(im, dtype=np.float32) / 65535.0
                arr = np.clip(arr, 0.0, 1.0)[None]
                if channels == 3:
                    arr = np.repeat(arr, 3, axis=0)
            else:
                if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                    im = im.convert("RGBA")
                    background = Image.new("RGBA", im.size, (0, 0, 0, 255))  # transparent → black background
                    im = Image.alpha_composite(background, im)
                im = im.convert("L" if channels == 1 else "RGB")
                arr = np.asarray(im, dtype=np.float32) / 255.0
                arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise ExportError(f"cannot read image {path}: {exc}") from exc
    return torch.from_numpy(np.ascontiguousarray(arr))


def _resize(x: Tensor, height: int, width: int) -> Tensor:
    """1×C×H×W → 1×C×height×width: area averaging when shrinking (as the LGG loader), bilinear otherwise."""
    import torch.nn.functional as F

    h, w = x.shape[-2:]
    if (h, w) == (height, width):
        return x
    if h >= height and w >= width:
        return F.interpolate(x, size=(height, width), mode="area")
    return F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)


def classification_input(x: Tensor, spec: dict[str, Any]) -> Tensor:
    x = _resize(x[None], spec["height"], spec["width"])
    scale = float(spec.get("scale", 255.0))
    x = x * (255.0 / scale)  # the file's 0-1 values are pixel/255; training divides pixels by `scale`
    mean = torch.tensor(spec["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(spec["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return (x - mean) / std


def segmentation_input(x: Tensor, spec: dict[str, Any]) -> Tensor:
    intensity = spec["intensity"]
    if "percentile" in intensity:
        top = float(torch.quantile(x.flatten().double(), float(intensity["percentile"]) / 100.0))
        x = x / top if top > 0 else x
        if intensity.get("clip") is not None:
            x = x.clamp(0.0, float(intensity["clip"]))
    else:
        x = x * (255.0 / float(intensity.get("scale", 255.0)))
    return _resize(x[None].float(), spec["height"], spec["width"])
