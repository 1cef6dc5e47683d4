"""Image-classification data sets, read offline: Fashion-MNIST, scikit-learn's digits, CIFAR-10.

Every loader returns an :class:`ImageSet` pair (train, test): images as uint8 ``N×C×H×W`` (kept as
bytes, 1/4 of the float size; :func:`to_float` normalises a batch when it is used) and int64 labels.

- **Fashion-MNIST** (Xiao, Rasul & Vollgraf 2017): Debian's ``dataset-fashion-mnist`` installs the
  four idx files under ``/usr/share/datasets/fashion-mnist``; 60,000 training and 10,000 test
  images of 28×28, 10 classes.
- **digits**: scikit-learn's bundled 8×8 handwritten digits (1,797 images, values 0-16, scaled to
  0-255 here); a fixed, seeded 80/20 split. Small enough for tests.
- **CIFAR-10** (Krizhevsky 2009): the standard "python version" folder (``data_batch_1`` …
  ``data_batch_5``, ``test_batch``), each a pickled dict with ``data`` (uint8 N×3072: the 1024 red
  values, then green, then blue, row-major 32×32) and ``labels``. FedPC (Section 5.1) trains its
  ResNet-50 FIXUP on it. Unpickling executes code a file may carry, so it is only done for a folder
  the user names on its own machine, never for anything received over the network.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import TrustformerError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
DIGITS_CLASSES = tuple(str(i) for i in range(10))

#: Per-channel mean and standard deviation of the training images (0-1 scale) used to normalise
#: inputs. Fixed constants of each data set, not statistics of any client's shard, so nothing about a
#: client's data enters the model's input pipeline.
CHANNEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "digits": ((0.3068,), (0.3757,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


class ImageDataError(TrustformerError, ValueError):
    """An image data set is missing or its files are malformed."""


@dataclass(frozen=True)
class ImageSet:
    """Images (uint8, N×C×H×W) with their labels (int64, N) and class names."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ImageDataError(f"images must be uint8 N×C×H×W, got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ImageDataError(f"{self.images.shape[0]} images but labels of shape {tuple(self.labels.shape)}")
        if len(self.labels) and not (int(self.labels.min()) >= 0 and int(self.labels.max()) < len(self.classes)):
            raise ImageDataError(f"labels outside 0..{len(self.classes) - 1}")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one image."""
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)

    def subset(self, indices: np.ndarray | torch.Tensor | list[int]) -> ImageSet:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return ImageSet(self.images[idx], self.labels[idx], self.classes)

    def head(self, n: int) -> ImageSet:
        """The first ``n`` examples (all of them when ``n`` is 0 or larger than the set)."""
        return self if n <= 0 or n >= len(self) else ImageSet(self.images[:n], self.labels[:n], self.classes)


def to_float(images: torch.Tensor, dataset: str) -> torch.Tensor:
    """uint8 images → float32, scaled to 0-1 and standardised with the data set's fixed channel stats."""
    mean, std = CHANNEL_STATS[dataset]
    x = images.to(torch.float32).div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x - m) / s


# ---------------------------------------------------------------------------------- idx files


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An idx file (gzip or plain) as a uint8 array: magic ``0 0 8 ndim``, ``ndim`` big-endian sizes, data.

    Labels files (idx1) have their data at offset 8, image files (idx3) at offset 16.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ImageDataError(f"cannot read idx file {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ImageDataError(f"{path} is not an idx file (bad magic number)")
    if raw[2] != 0x08:
        raise ImageDataError(f"{path}: only unsigned-byte idx data is supported (type code {raw[2]:#x})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ImageDataError(f"{path}: truncated idx header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = int(np.prod(dims)) if dims else 0
    if len(raw) - header != count:
        raise ImageDataError(f"{path}: header says {dims} ({count} bytes) but {len(raw) - header} bytes follow")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_fashion_mnist(root: str | os.PathLike | None = None) -> tuple[ImageSet, ImageSet]:
    """Fashion-MNIST (train 60,000, test 10,000) from the idx files in ``root``.

    ``root`` defaults to Debian's ``dataset-fashion-mnist`` location; install the package with
    ``apt-get install dataset-fashion-mnist`` (``scripts/install.sh`` does).
    """
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    sets = []
    for prefix in ("train", "t10k"):
        files = {}
        for kind, idx in (("images", 3), ("labels", 1)):
            candidates = [root / f"{prefix}-{kind}-idx{idx}-ubyte.gz", root / f"{prefix}-{kind}-idx{idx}-ubyte"]
            found = next((p for p in candidates if p.exists()), None)
            if found is None:
                raise ImageDataError(
                    f"Fashion-MNIST file {candidates[0].name} not found in {root}: install Debian's "
                    "dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass its folder"
                )
            files[kind] = read_idx(found)
        images, labels = files["images"], files["labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ImageDataError(f"Fashion-MNIST {prefix}: images {images.shape} and labels {labels.shape} disagree")
        sets.append(
            ImageSet(
                torch.from_numpy(images.copy()).unsqueeze(1),
                torch.from_numpy(labels.astype(np.int64)),
                FASHION_MNIST_CLASSES,
            )
        )
    return sets[0], sets[1]


def load_digits_split(seed: int = 0, test_fraction: float = 0.2) -> tuple[ImageSet, ImageSet]:
    """scikit-learn's bundled 8×8 digits, values 0-16 scaled to 0-255, split by a seeded permutation."""
    if not 0.0 < test_fraction < 1.0:
        raise ImageDataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)[:, None]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(test_fraction * len(labels)))
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    full = ImageSet(torch.from_numpy(images), torch.from_numpy(labels), DIGITS_CLASSES)
    return full.subset(train_idx), full.subset(test_idx)


# ----------------------------------------------------------------------------------- CIFAR-10


def _cifar_field(batch: dict, name: str, path: Path):
    for key in (name, name.encode()):
        if key in batch:
            return batch[key]
    raise ImageDataError(f"{path}: no '{name}' entry (keys: {sorted(map(str, batch))})")


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch file → (uint8 N×3×32×32 images, int64 labels).

    Accepts the bytes keys of the official files (``b'data'``, ``b'labels'``, as written by Python 2)
    and str keys. Unpickles: only for files on the user's own disk.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise ImageDataError(f"cannot read CIFAR-10 batch {path}: {exc}") from exc
    if not isinstance(batch, dict):
        raise ImageDataError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    data = np.asarray(_cifar_field(batch, "data", path))
    labels = np.asarray(_cifar_field(batch, "labels", path), dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ImageDataError(f"{path}: 'data' must be uint8 N×3072, got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise ImageDataError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise ImageDataError(f"{path}: labels outside 0..9")
    # each row is the red plane (1024 values, row-major), then green, then blue
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(root: str | os.PathLike | None) -> tuple[ImageSet, ImageSet]:
    """CIFAR-10 from a local "python version" folder (``cifar-10-batches-py``): 50,000 + 10,000 images."""
    if root is None or str(root) == "":
        raise ImageDataError("CIFAR-10 needs data_dir: the folder holding data_batch_1..5 and test_batch")
    root = Path(root)
    train_files = [root / f"data_batch_{i}" for i in range(1, 6)]
    missing = [p.name for p in train_files + [root / "test_batch"] if not p.exists()]
    if missing:
        raise ImageDataError(f"CIFAR-10 folder {root} lacks {', '.join(missing)}")
    parts = [read_cifar_batch(p) for p in train_files]
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    test_x, test_y = read_cifar_batch(root / "test_batch")
    return (
        ImageSet(torch.from_numpy(train_x.copy()), torch.from_numpy(train_y), CIFAR10_CLASSES),
        ImageSet(torch.from_numpy(test_x.copy()), torch.from_numpy(test_y), CIFAR10_CLASSES),
    )


def write_cifar_batch(
    path: str | os.PathLike, images: np.ndarray, labels: np.ndarray, *, bytes_keys: bool = True
) -> None:
    """Write images (uint8 N×3×32×32) and labels in the CIFAR-10 python batch format."""
    images = np.asarray(images, dtype=np.uint8)
    if images.ndim != 4 or images.shape[1:] != (3, 32, 32):
        raise ImageDataError(f"images must be N×3×32×32, got {images.shape}")
    key = (lambda s: s.encode()) if bytes_keys else (lambda s: s)
    batch = {
        key("batch_label"): key("synthetic"),
        key("data"): images.reshape(len(images), 3072),
        key("labels"): [int(v) for v in labels],
        key("filenames"): [key(f"img{i}.png") for i in range(len(images))],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def load_image_dataset(name: str, *, data_dir: str | None = None, seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """(train, test) of a named data set: ``fashion-mnist``, ``digits`` or ``cifar10``."""
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir or None)
    if name == "digits":
        return load_digits_split(seed=seed)
    if name == "cifar10":
        return load_cifar10(data_dir)
    raise ImageDataError(f"dataset must be one of fashion-mnist, digits, cifar10; got {name!r}")


__all__ = [
    "CHANNEL_STATS",
    "CIFAR10_CLASSES",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "ImageDataError",
    "ImageSet",
    "load_cifar10",
    "load_digits_split",
    "load_fashion_mnist",
    "load_image_dataset",
    "read_cifar_batch",
    "read_idx",
    "to_float",
    "write_cifar_batch",
]
