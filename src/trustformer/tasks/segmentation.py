"""Binary segmentation as a federated task: a U-Net on MRI brain extraction (default) or LGG tumours.

FedPC (Section 5) trains a U-Net with Adam on the LGG brain-MRI set (256×256 slices, batch 4-16,
35 epochs, an 80:20 train/test split) and reports pixel accuracy; we report Dice and IoU beside it.
Offline, the default is brain extraction on Debian's ``mricron-data`` T1 template (see
:mod:`~trustformer.tasks.seg_data`): held-out axial slices, a small U-Net, minutes on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.fixup_resnet import count_parameters
from ..models.unet import NORMS, UNet, UNetConfig, segmentation_loss
from . import seg_data
from .base import (
    PARTITIONS, LocalStep, TaskConfigError, build_optimizer, check_choice, check_positive, derive_seed,
    plain_step, run_epochs, seeded_model,
)
from .image_metrics import SegmentationScores
from .partition import partition as make_partition

DATASETS = ("mri-brain", "lgg")
AUGMENTS = ("none", "flip")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class SegTaskConfig:
    """Options of the segmentation task (validated; errors name the field)."""

    dataset: str = "mri-brain"
    data_dir: str = ""               # mri-brain: folder of ch2.nii.gz + ch2bet.nii.gz (default Debian's); lgg: required
    downsample: int = 2              # mri-brain: integer resolution reduction (2: 108×90 slices)
    size: int = 128                  # lgg: slices resized to size×size (the files are 256×256)
    test_fraction: float = 0.2       # units (patients; slices for mri-brain) held out for the shared test set
    # model: U-Net
    depth: int = 3
    base_width: int = 8
    norm: str = "group"
    groups: int = 8
    # local training
    optimizer: str = "adam"
    lr: float = 3e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_decay: float = 0.0           # lr / (1 + lr_decay · local epochs done): FedPC's step-based decay
    batch_size: int = 8
    label_smoothing: float = 0.0
    augment: str = "flip"
    threshold: float = 0.5           # probability above which a pixel is foreground
    eval_batch_size: int = 16

    def __post_init__(self) -> None:
        check_choice("dataset", self.dataset, DATASETS)
        if self.dataset == "lgg" and not self.data_dir:
            raise TaskConfigError("data_dir must name the LGG kaggle_3m folder")
        check_positive("downsample", self.downsample, integer=True)
        check_positive("size", self.size, integer=True)
        if self.size < 8:
            raise TaskConfigError(f"size must be ≥ 8; got {self.size}")
        if not (isinstance(self.test_fraction, (int, float)) and 0.0 < self.test_fraction < 1.0):
            raise TaskConfigError(f"test_fraction must be in (0, 1); got {self.test_fraction!r}")
        check_positive("depth", self.depth, integer=True)
        if self.depth > 6:
            raise TaskConfigError(f"depth must be in 1..6; got {self.depth}")
        check_positive("base_width", self.base_width, integer=True)
        check_choice("norm", self.norm, NORMS)
        check_positive("groups", self.groups, integer=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_positive("lr", self.lr)
        if not (isinstance(self.momentum, (int, float)) and 0.0 <= self.momentum < 1.0):
            raise TaskConfigError(f"momentum must be in [0, 1); got {self.momentum!r}")
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        check_positive("lr_decay", self.lr_decay, allow_zero=True)
        check_positive("batch_size", self.batch_size, integer=True)
        check_positive("eval_batch_size", self.eval_batch_size, integer=True)
        if not (isinstance(self.label_smoothing, (int, float)) and 0.0 <= self.label_smoothing < 1.0):
            raise TaskConfigError(f"label_smoothing must be in [0, 1); got {self.label_smoothing!r}")
        check_choice("augment", self.augment, AUGMENTS)
        if not (isinstance(self.threshold, (int, float)) and 0.0 < self.threshold < 1.0):
            raise TaskConfigError(f"threshold must be in (0, 1); got {self.threshold!r}")

    def model_config(self, in_channels: int) -> UNetConfig:
        return UNetConfig(in_channels=in_channels, out_channels=1, depth=self.depth, base_width=self.base_width,
                          norm=self.norm, groups=self.groups)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: ``tiny``: 4× down-sampled slices and a 2-level U-Net of width 4 (seconds). ``small``: 108×90 slices,
#: 3-level U-Net of width 8 (minutes on a CPU; measured with ``scripts/bench_image_tasks.py``).
#: ``paper``: FedPC's U-Net (Ronneberger et al.: depth 4, width 64, ~31M parameters, 119 MB) on LGG
#: 256×256 slices with Adam at FedPC's initial lr 0.01 decayed with the local steps (the rate is ours),
#: batch 16, 35 epochs — for a GPU; ``data_dir`` must name ``kaggle_3m``.
#: Measured for ``small`` (one torch thread, shared 2-core CPU, 28 held-out slices): centralized
#: 30 epochs → Dice 0.986 (pixel accuracy 0.992) in 86 s; FedAvg over 3 IID clients of 38 slices,
#: 30 rounds → Dice 0.972 in 53 s (first ≥ 0.90 at round 13, from round 18 on for good); FedPC's
#: stratified split (33 / 52 / 29 slices) → Dice 0.970.
SEG_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dataset="mri-brain", downsample=4, depth=2, base_width=4, groups=4, lr=1e-2, batch_size=8),
    "small": dict(dataset="mri-brain", downsample=2, depth=3, base_width=8, groups=8, lr=3e-3, batch_size=8),
    "paper": dict(dataset="lgg", size=256, depth=4, base_width=64, groups=8, optimizer="adam", lr=0.01,
                  lr_decay=0.1, batch_size=16, augment="flip"),
}
SEG_PRESET_EPOCHS = {"tiny": 2, "small": 30, "paper": 35}


def seg_preset(name: str, **overrides: Any) -> SegTaskConfig:
    """A :class:`SegTaskConfig` from a preset (``tiny``, ``small``, ``paper``) with overrides."""
    if name not in SEG_PRESETS:
        raise TaskConfigError(f"preset must be one of {', '.join(SEG_PRESETS)}; got {name!r}")
    return SegTaskConfig(**{**SEG_PRESETS[name], **overrides})


@lru_cache(maxsize=4)
def _load(dataset: str, data_dir: str, downsample: int, size: int, test_fraction: float, seed: int):
    if dataset == "mri-brain":
        data = seg_data.load_brain_extraction(data_dir or None, downsample_factor=downsample)
    else:
        data = seg_data.load_lgg(data_dir, size=size)
    return seg_data.split_units(data, test_fraction=test_fraction, seed=seed)


def flip_batch(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random left-right flips of images and masks together (the brain is nearly symmetric)."""
    flip = (torch.rand(x.shape[0], generator=gen) < 0.5).view(-1, 1, 1, 1)
    return torch.where(flip, x.flip(-1), x), torch.where(flip, y.flip(-1), y)


class SegmentationTask:
    """The :class:`~trustformer.tasks.base.Task` of binary segmentation with a U-Net."""

    name = "segmentation"

    def __init__(self, config: SegTaskConfig | None = None, *, seed: int = 0, device: str | torch.device = "cpu") -> None:
        self.config = config or SegTaskConfig()
        self.seed = seed
        self.device = torch.device(device)
        c = self.config
        self.train, self.test = _load(c.dataset, c.data_dir, c.downsample, c.size, float(c.test_fraction), seed)
        self.model_config = c.model_config(self.train.channels)

    # ------------------------------------------------------------------------------ data

    def client_shards(self, n_clients: int, partition: str = "iid", seed: int | None = None, *,
                      alpha: float = 0.5, min_fraction: float = 0.5, max_fraction: float = 2.0
                      ) -> list[seg_data.SegSet]:
        """Disjoint client training sets made of whole units (patients; slices for one subject).

        ``iid``: equal numbers of units; ``stratified``: FedPC's random imbalanced shares of the units
        (no classes here, as its Figure 3). ``dirichlet`` skews labels and does not apply.
        """
        check_choice("partition", partition, PARTITIONS)
        if partition == "dirichlet":
            raise TaskConfigError("partition 'dirichlet' skews class labels; segmentation has none: "
                                  "use iid or stratified")
        seed = self.seed if seed is None else seed
        units = self.train.unit_ids()
        groups = make_partition(partition, n_clients, seed=derive_seed(seed, "partition"), n_items=len(units),
                                min_fraction=min_fraction, max_fraction=max_fraction)
        return [self.train.select_units(units[g]) for g in groups]

    # ----------------------------------------------------------------------------- model

    def build_model(self, seed: int | None = None) -> UNet:
        seed = self.seed if seed is None else seed
        return seeded_model(lambda: UNet(self.model_config), seed).to(self.device)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return build_optimizer(model, name=c.optimizer, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    # -------------------------------------------------------------------------- training

    def train_local(self, model: nn.Module, optimizer: torch.optim.Optimizer, shard: seg_data.SegSet, *,
                    seed: int, epochs: int = 1, batch_size: int | None = None,
                    step: LocalStep | None = None) -> dict[str, float]:
        """``epochs`` passes of mini-batch training (BCE + soft Dice) over ``shard``."""
        augment = self.config.augment == "flip"

        def batch(idx: torch.Tensor, gen: torch.Generator):
            x, y = shard.images[idx], shard.masks[idx]
            if augment:
                x, y = flip_batch(x, y, gen)
            return x.to(self.device), y.to(self.device)

        return run_epochs(model, optimizer, len(shard), batch, seed=seed, epochs=epochs,
                          batch_size=batch_size or self.config.batch_size,
                          step=step or plain_step(self.config.label_smoothing), lr_decay=self.config.lr_decay)

    # ------------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def predict(self, model: nn.Module, data: seg_data.SegSet | None = None
                ) -> tuple[torch.Tensor, float, SegmentationScores]:
        """(foreground probabilities N×1×H×W, summed loss, scores) of ``data`` (default: the test set)."""
        data = self.test if data is None else data
        was_training = model.training
        model.eval()
        scores = SegmentationScores()
        probs, loss_sum = [], 0.0
        step = self.config.eval_batch_size
        for start in range(0, len(data), step):
            x = data.images[start:start + step].to(self.device)
            y = data.masks[start:start + step].to(self.device).float()
            logits = model(x)
            loss_sum += float(segmentation_loss(logits, y)) * x.shape[0]
            p = torch.sigmoid(logits).cpu()
            scores.update(p > self.config.threshold, y.cpu() > 0.5)
            probs.append(p)
        model.train(was_training)
        return torch.cat(probs), loss_sum, scores

    def test_loss(self, model: nn.Module) -> float:
        """Mean loss (BCE + soft Dice) per test image."""
        _, loss_sum, _ = self.predict(model)
        return loss_sum / len(self.test)

    def final_metrics(self, model: nn.Module) -> dict[str, Any]:
        """Pooled ``dice``, ``iou``, ``pixel_accuracy`` (FedPC's "accuracy"), per-image means, ``test_loss``."""
        _, loss_sum, scores = self.predict(model)
        return {**scores.result(), "test_loss": loss_sum / len(self.test)}

    def sample_predictions(self, model: nn.Module, n: int = 4) -> list[dict[str, np.ndarray | str]]:
        """``n`` test slices spread over the set, each with its image, true mask and predicted mask
        (numpy arrays, for the report's figure)."""
        if n < 1:
            raise TaskConfigError(f"n must be ≥ 1; got {n}")
        picks = np.unique(np.linspace(0, len(self.test) - 1, num=min(n, len(self.test))).round().astype(int))
        data = self.test.subset(picks)
        probs, _, _ = self.predict(model, data)
        return [{"unit": self.test.unit_names[int(data.units[i])], "image": data.images[i, 0].numpy(),
                 "truth": data.masks[i, 0].numpy(), "prediction": (probs[i, 0] > self.config.threshold).numpy()}
                for i in range(len(data))]

    @cached_property
    def parameter_count(self) -> int:
        """Number of parameters of the model (built once, on the CPU)."""
        return count_parameters(UNet(self.model_config))

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "dataset": self.config.dataset,
            "train_images": len(self.train),
            "test_images": len(self.test),
            "train_units": len(self.train.unit_ids()),
            "test_units": len(self.test.unit_ids()),
            "image_shape": list(self.train.images.shape[1:]),
            "foreground_fraction_test": float(self.test.masks.float().mean()),
            "model": f"U-Net (depth {self.config.depth}, base width {self.config.base_width}, norm {self.config.norm})",
            "parameters": self.parameter_count,
            "model_bytes_float32": 4 * self.parameter_count,
            "config": self.config.to_dict(),
        }


__all__ = ["DATASETS", "SEG_PRESETS", "SEG_PRESET_EPOCHS", "SegTaskConfig", "SegmentationTask", "flip_batch",
           "seg_preset"]
