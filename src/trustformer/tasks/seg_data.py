"""Segmentation data sets read offline: brain extraction on Debian's MRI template, and the LGG layout.

Every loader returns a :class:`SegSet`: float32 images ``N×C×H×W`` scaled to about 0-1, uint8 binary
masks ``N×1×H×W``, and for every image the id of its *unit* (a patient, or a slice when there is a
single subject) so that splits and client partitions never cut a unit in two.

- **Brain extraction on ``ch2``** (default): Debian's ``mricron-data`` ships the Colin27 "ch2" T1
  template (``/usr/share/mricron/templates/ch2.nii.gz``, 181×217×181, 1 mm, RAS) and its
  skull-stripped version (``ch2bet.nii.gz``); ``ch2bet > 0`` is the brain mask. The task is to find
  the brain in an axial T1 slice (skull, scalp and background are the negatives). Axial slices with
  at least ``min_foreground`` of brain pixels are kept (about 140). One subject: adjacent slices are
  alike, so held-out slices measure fitting the anatomy, not generalising to new people — a real
  smoke experiment, not a clinical claim. Intensities are divided by the volume's 99.5th percentile.
- **LGG (``kaggle_3m``)**: the brain-MRI set of Buda et al. (2019) that FedPC uses (Section 5.1):
  one folder per patient holding ``<patient>_<slice>.tif`` (256×256, 3 channels: pre-contrast,
  FLAIR, post-contrast) and ``<patient>_<slice>_mask.tif`` (tumour mask, 0/255). Split by patient,
  as FedPC's 80:20 train/test split should be (slices of one patient on both sides would leak).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import TrustformerError

if TYPE_CHECKING:
    from nibabel.spatialimages import SpatialImage

MRICRON_DIR = Path("/usr/share/mricron/templates")


class SegDataError(TrustformerError, ValueError):
    """A segmentation data set is missing or malformed."""


@dataclass(frozen=True)
class SegSet:
    """Images (float32 N×C×H×W), masks (uint8 N×1×H×W, values 0/1) and each image's unit id."""

    images: torch.Tensor
    masks: torch.Tensor
    units: torch.Tensor  # int64 N: patient (or slice) index into ``unit_names``
    unit_names: tuple[str, ...]

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.images.dim() != 4 or self.images.dtype != torch.float32:
            raise SegDataError(f"images must be float32 N×C×H×W; got {self.images.dtype} {tuple(self.images.shape)}")
        if self.masks.shape != (n, 1, *self.images.shape[2:]) or self.masks.dtype != torch.uint8:
            raise SegDataError(
                f"masks must be uint8 N×1×H×W matching the images; got {self.masks.dtype} "
                f"{tuple(self.masks.shape)} for images {tuple(self.images.shape)}"
            )
        if self.units.shape != (n,):
            raise SegDataError(f"{n} images but {tuple(self.units.shape)} unit ids")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def channels(self) -> int:
        return int(self.images.shape[1])

    def subset(self, indices) -> SegSet:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return SegSet(self.images[idx], self.masks[idx], self.units[idx], self.unit_names)

    def unit_ids(self) -> np.ndarray:
        """The distinct units present, sorted."""
        return np.unique(self.units.numpy())

    def select_units(self, units) -> SegSet:
        """The images of the given units."""
        keep = np.isin(self.units.numpy(), np.asarray(units))
        return self.subset(np.flatnonzero(keep))


def resize(images: torch.Tensor, masks: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Square ``size``×``size`` images (area averaging) and masks (area average ≥ 0.5)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images, masks
    img = F.interpolate(images, size=(size, size), mode="area")
    msk = F.interpolate(masks.float(), size=(size, size), mode="area") >= 0.5
    return img.contiguous(), msk.to(torch.uint8)


def downsample(images: torch.Tensor, masks: torch.Tensor, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce the resolution by an integer ``factor`` (area averaging; masks: average ≥ 0.5)."""
    if factor == 1:
        return images, masks
    h, w = images.shape[-2:]
    size = (h // factor, w // factor)
    img = F.interpolate(images, size=size, mode="area")
    msk = F.interpolate(masks.float(), size=size, mode="area") >= 0.5
    return img.contiguous(), msk.to(torch.uint8)


# ------------------------------------------------------------------------- MRI brain extraction


def load_brain_extraction(
    root: str | os.PathLike | None = None,
    *,
    downsample_factor: int = 2,
    min_foreground: float = 0.01,
) -> SegSet:
    """Axial slices of the ch2 T1 template with ``ch2bet > 0`` as the brain mask (one unit per slice).

    ``downsample_factor`` 2 gives 90×108 slices (from 181×217); ``min_foreground`` drops slices with
    less brain than that fraction of their pixels.
    """
    if downsample_factor < 1:
        raise SegDataError(f"downsample_factor must be ≥ 1; got {downsample_factor}")
    if not 0.0 <= min_foreground < 1.0:
        raise SegDataError(f"min_foreground must be in [0, 1); got {min_foreground}")
    root = Path(root) if root else MRICRON_DIR
    t1_path, bet_path = root / "ch2.nii.gz", root / "ch2bet.nii.gz"
    for p in (t1_path, bet_path):
        if not p.exists():
            raise SegDataError(f"{p} not found: install Debian's mricron-data (apt-get install mricron-data)")
    import nibabel as nib

    # NIfTI files load as spatial images (nib.load is typed as returning the FileBasedImage base)
    t1_img = cast("SpatialImage", nib.load(str(t1_path)))
    bet_img = cast("SpatialImage", nib.load(str(bet_path)))
    if t1_img.shape != bet_img.shape or not np.allclose(t1_img.affine, bet_img.affine):
        raise SegDataError(f"{t1_path.name} and {bet_path.name} are not on the same grid")
    # canonical RAS+ orientation: the third axis runs inferior → superior, so [:, :, k] is axial
    t1 = np.asarray(nib.as_closest_canonical(t1_img).dataobj, dtype=np.float32)
    brain = np.asarray(nib.as_closest_canonical(bet_img).dataobj) > 0
    scale = float(np.percentile(t1, 99.5)) or 1.0
    t1 = np.clip(t1 / scale, 0.0, 1.5)
    keep = [k for k in range(t1.shape[2]) if brain[:, :, k].mean() >= min_foreground]
    if not keep:
        raise SegDataError("no axial slice holds enough brain (min_foreground too high)")
    # slice k as an image, rotated so that anterior is at the top and the subject's left on the left
    images = np.stack([np.rot90(t1[:, :, k]) for k in keep])[:, None].copy()
    masks = np.stack([np.rot90(brain[:, :, k]) for k in keep])[:, None].astype(np.uint8).copy()
    img, msk = downsample(torch.from_numpy(images), torch.from_numpy(masks), downsample_factor)
    names = tuple(f"axial-{k:03d}" for k in keep)
    return SegSet(img.float(), msk, torch.arange(len(keep), dtype=torch.int64), names)


# ------------------------------------------------------------------------------ LGG kaggle_3m

_SLICE = re.compile(r"^(?P<stem>.+)_(?P<n>\d+)\.tiff?$", re.IGNORECASE)
_MASK = re.compile(r"^(?P<stem>.+)_(?P<n>\d+)_mask\.tiff?$", re.IGNORECASE)


def _read_tiff(path: Path) -> np.ndarray:
    import tifffile

    try:
        return np.asarray(tifffile.imread(path))
    except Exception as exc:  # tifffile raises several types for malformed files
        raise SegDataError(f"cannot read TIFF {path}: {exc}") from exc


def _lgg_root(root: Path) -> Path:
    if (root / "kaggle_3m").is_dir():
        return root / "kaggle_3m"
    return root


def _patient_files(patient: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    """A patient folder's slices and masks, each by its slice number."""
    slices: dict[int, Path] = {}
    masks: dict[int, Path] = {}
    for f in patient.iterdir():
        mm = _MASK.match(f.name)
        if mm:
            masks[int(mm["n"])] = f
            continue
        ms = _SLICE.match(f.name)
        if ms:
            slices[int(ms["n"])] = f
    return slices, masks


def _slice_pair(image_file: Path, mask_file: Path, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One slice as (3 × size × size image in 0-1, 1 × size × size mask)."""
    img = _read_tiff(image_file)
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3 or img.shape[2] not in (1, 3, 4):
        raise SegDataError(f"{image_file}: expected H×W×3 image, got shape {img.shape}")
    img = img[:, :, :3] if img.shape[2] >= 3 else np.repeat(img, 3, axis=2)
    msk = _read_tiff(mask_file)
    if msk.ndim == 3:
        msk = msk[..., 0]
    if msk.shape != img.shape[:2]:
        raise SegDataError(f"{mask_file}: mask {msk.shape} does not match image {img.shape[:2]}")
    x = torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)[None]
    y = torch.from_numpy((msk > 0).astype(np.uint8))[None, None]
    x, y = resize(x, y, size)
    return x[0], y[0]


def load_lgg(root: str | os.PathLike, *, size: int = 256) -> SegSet:
    """The LGG ``kaggle_3m`` folder (or its parent): every patient folder's slices and masks.

    Images are uint8 RGB scaled to 0-1; masks are ``> 0``. ``size`` resizes to ``size``×``size``
    (the files are 256×256). Units are patients, in sorted folder order.
    """
    if root is None or str(root) == "":
        raise SegDataError("the LGG loader needs data_dir: the kaggle_3m folder")
    if size < 8:
        raise SegDataError(f"size must be ≥ 8; got {size}")
    base = _lgg_root(Path(root))
    if not base.is_dir():
        raise SegDataError(f"LGG folder {base} does not exist")
    patients = sorted(p for p in base.iterdir() if p.is_dir())
    images: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    units: list[int] = []
    names: list[str] = []
    for patient in patients:
        slices, mask_files = _patient_files(patient)
        if not slices:
            continue
        missing = sorted(set(slices) - set(mask_files))
        if missing:
            raise SegDataError(f"{patient.name}: slice(s) {missing[:5]} have no _mask.tif")
        unit = len(names)
        names.append(patient.name)
        for n in sorted(slices):
            x, y = _slice_pair(slices[n], mask_files[n], size)
            images.append(x)
            masks.append(y)
            units.append(unit)
    if not images:
        raise SegDataError(f"no patient folder with <patient>_<n>.tif slices under {base}")
    return SegSet(torch.stack(images), torch.stack(masks), torch.tensor(units, dtype=torch.int64), tuple(names))


def split_units(data: SegSet, *, test_fraction: float, seed: int) -> tuple[SegSet, SegSet]:
    """(train, test) with a seeded ``test_fraction`` of the units (patients or slices) held out."""
    if not 0.0 < test_fraction < 1.0:
        raise SegDataError(f"test_fraction must be in (0, 1); got {test_fraction}")
    ids = data.unit_ids()
    if len(ids) < 2:
        raise SegDataError(f"cannot hold out units from {len(ids)} unit(s)")
    n_test = min(max(1, int(round(test_fraction * len(ids)))), len(ids) - 1)
    order = np.random.default_rng([seed, 17]).permutation(ids)
    test_units = np.sort(order[:n_test])
    train_units = np.sort(order[n_test:])
    return data.select_units(train_units), data.select_units(test_units)


def write_lgg_sample(root: str | os.PathLike, patients: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> Path:
    """Write slices in the ``kaggle_3m`` layout: ``root/kaggle_3m/<patient>/<patient>_<n>.tif`` and
    ``_mask.tif`` (images H×W×3 uint8, masks H×W uint8 0/255). For tests and demos."""
    import tifffile

    base = Path(root) / "kaggle_3m"
    for patient, slices in patients.items():
        folder = base / patient
        folder.mkdir(parents=True, exist_ok=True)
        for n, (img, msk) in enumerate(slices, start=1):
            tifffile.imwrite(folder / f"{patient}_{n}.tif", np.asarray(img, dtype=np.uint8))
            tifffile.imwrite(folder / f"{patient}_{n}_mask.tif", np.asarray(msk, dtype=np.uint8))
    return base


__all__ = [
    "MRICRON_DIR",
    "SegDataError",
    "SegSet",
    "downsample",
    "load_brain_extraction",
    "load_lgg",
    "resize",
    "split_units",
    "write_lgg_sample",
]
