"""The sections of the image tasks (``[image]``, ``[segmentation]``): their options, defaults (the ``small``
preset) and checks."""

from __future__ import annotations

from dataclasses import dataclass

from .checks import ConfigError, check_at_least, check_choice, check_in_range, check_positive

IMAGE_DATASETS = ("fashion-mnist", "digits", "cifar10")
SEG_DATASETS = ("mri-brain", "lgg")


@dataclass(frozen=True)
class ImageConfig:
    """``task = "image-classification"`` (``tasks/image.py``): data, FIXUP ResNet and local SGD/Adam.
    Defaults are the ``small`` preset (Fashion-MNIST, basic blocks 1-1-1 of widths 16/32/64); the other
    presets are in :data:`TASK_PRESETS`."""

    dataset: str = "fashion-mnist"  # fashion-mnist | digits (scikit-learn's, fast tests) | cifar10
    data_dir: str = ""  # fashion-mnist: idx folder ("" = Debian's dataset-fashion-mnist); cifar10: required
    train_size: int = 0  # 0 = the whole training set, else a seeded random subset
    test_size: int = 0  # 0 = the whole test set, else its first test_size images
    block: str = "basic"  # basic | bottleneck
    layers: tuple[int, ...] = (1, 1, 1)  # residual blocks per stage
    widths: tuple[int, ...] = (16, 32, 64)  # channels per stage
    stem: str = "cifar"  # cifar (3x3 conv) | imagenet (7x7 conv + max-pool)
    stem_stride: int = 2  # 1 | 2
    stem_width: int = 0  # 0 = widths[0]
    optimizer: str = "sgd"  # sgd (with momentum) | adam
    lr: float = 0.03  # learning rate
    momentum: float = 0.9  # sgd momentum
    weight_decay: float = 5e-4  # L2 weight decay
    lr_decay: float = 0.3  # lr / (1 + lr_decay * local epochs done): FedPC's step-based decay
    batch_size: int = 32  # images per batch
    label_smoothing: float = 0.0  # of the cross-entropy
    augment: str = "none"  # none | flip | crop-flip
    eval_batch_size: int = 1000  # images per batch when evaluating

    def validate(self) -> None:
        key = "image."
        check_choice(key + "dataset", self.dataset, IMAGE_DATASETS)
        if self.dataset == "cifar10" and not self.data_dir:
            raise ConfigError(
                "image.data_dir must name the CIFAR-10 python folder (data_batch_1..5, test_batch) "
                "when image.dataset = 'cifar10'"
            )
        check_at_least(key + "train_size", self.train_size, 0)
        check_at_least(key + "test_size", self.test_size, 0)
        check_choice(key + "block", self.block, ("basic", "bottleneck"))
        check_choice(key + "stem", self.stem, ("cifar", "imagenet"))
        check_choice(key + "stem_stride", self.stem_stride, (1, 2))
        check_at_least(key + "stem_width", self.stem_width, 0)
        if not self.layers or any(v < 1 for v in self.layers):
            raise ConfigError(f"image.layers = {list(self.layers)!r} must be a non-empty list of block counts >= 1")
        if len(self.widths) != len(self.layers) or any(v < 1 for v in self.widths):
            raise ConfigError(
                f"image.widths = {list(self.widths)!r} must give one width >= 1 per stage of "
                f"image.layers ({len(self.layers)})"
            )
        _optimizer_checks(key, self)
        check_choice(key + "augment", self.augment, ("none", "flip", "crop-flip"))
        check_at_least(key + "eval_batch_size", self.eval_batch_size, 1)


@dataclass(frozen=True)
class SegmentationConfig:
    """``task = "segmentation"`` (``tasks/segmentation.py``): data, U-Net and local Adam. Defaults are
    the ``small`` preset (MRI brain extraction at 108x90, U-Net depth 3, width 8, GroupNorm); the other
    presets are in :data:`TASK_PRESETS`."""

    dataset: str = "mri-brain"  # mri-brain (Debian's mricron-data) | lgg (kaggle_3m folder)
    data_dir: str = ""  # mri-brain: folder of ch2.nii.gz + ch2bet.nii.gz ("" = Debian's); lgg: required
    downsample: int = 2  # mri-brain: integer resolution reduction
    size: int = 128  # lgg: slices resized to size x size
    test_fraction: float = 0.2  # units (patients; slices for mri-brain) held out as the shared test set
    depth: int = 3  # U-Net levels, 1..6
    base_width: int = 8  # channels of the first level (doubled per level)
    norm: str = "group"  # group | none (no running statistics anywhere)
    groups: int = 8  # GroupNorm groups
    optimizer: str = "adam"  # adam | sgd
    lr: float = 3e-3  # learning rate
    momentum: float = 0.9  # sgd momentum
    weight_decay: float = 0.0  # L2 weight decay
    lr_decay: float = 0.0  # lr / (1 + lr_decay * local epochs done)
    batch_size: int = 8  # slices per batch
    label_smoothing: float = 0.0  # of the pixel loss
    augment: str = "flip"  # none | flip
    threshold: float = 0.5  # probability above which a pixel is foreground
    eval_batch_size: int = 16  # slices per batch when evaluating

    def validate(self) -> None:
        key = "segmentation."
        check_choice(key + "dataset", self.dataset, SEG_DATASETS)
        if self.dataset == "lgg" and not self.data_dir:
            raise ConfigError(
                "segmentation.data_dir must name the LGG kaggle_3m folder when segmentation.dataset = 'lgg'"
            )
        check_at_least(key + "downsample", self.downsample, 1)
        check_at_least(key + "size", self.size, 8)
        check_in_range(key + "test_fraction", self.test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        check_in_range(key + "depth", self.depth, 1, 6)
        check_at_least(key + "base_width", self.base_width, 1)
        check_choice(key + "norm", self.norm, ("group", "none"))
        check_at_least(key + "groups", self.groups, 1)
        _optimizer_checks(key, self)
        check_choice(key + "augment", self.augment, ("none", "flip"))
        check_in_range(key + "threshold", self.threshold, 0.0, 1.0, lo_open=True, hi_open=True)
        check_at_least(key + "eval_batch_size", self.eval_batch_size, 1)


def _optimizer_checks(key: str, section: ImageConfig | SegmentationConfig) -> None:
    check_choice(key + "optimizer", section.optimizer, ("sgd", "adam"))
    check_positive(key + "lr", section.lr)
    check_in_range(key + "momentum", section.momentum, 0.0, 1.0, hi_open=True)
    check_at_least(key + "weight_decay", section.weight_decay, 0.0)
    check_at_least(key + "lr_decay", section.lr_decay, 0.0)
    check_at_least(key + "batch_size", section.batch_size, 1)
    check_in_range(key + "label_smoothing", section.label_smoothing, 0.0, 1.0, hi_open=True)
