"""Binary segmentation as a federated task: a U-Net on MRI brain extraction (default) or LGG tumours.

FedPC (Section 5) trains a U-Net with Adam on the LGG brain-MRI set (256×256 slices, batch 4-16,
35 epochs, an 80:20 train/test split) and reports pixel accuracy; we report Dice and IoU beside it.
Offline, the default is brain extraction on Debian's ``mricron-data`` T1 template (see
:mod:`~trustformer.tasks.seg_data`): held-out axial slices, a small U-Net, minutes on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import SegmentationConfig
from ..models.fixup_resnet import count_parameters
from ..models.unet import UNet, UNetConfig, segmentation_loss
from . import seg_data
from .base import (
    PARTITIONS,
    LocalStep,
    TaskConfigError,
    build_optimizer,
    check_choice,
    derive_seed,
    plain_step,
    run_epochs,
    seeded_model,
)
from .image_metrics import SegmentationScores
from .partition import partition as make_partition


def unet_config(config: SegmentationConfig, in_channels: int) -> UNetConfig:
    """The U-Net of a ``segmentation`` section for images of ``in_channels``."""
    return UNetConfig(
        in_channels=in_channels,
        out_channels=1,
        depth=config.depth,
        base_width=config.base_width,
        norm=config.norm,
        groups=config.groups,
    )


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

    def __init__(
        self, config: SegmentationConfig | None = None, *, seed: int = 0, device: str | torch.device = "cpu"
    ) -> None:
        self.config = config or SegmentationConfig()
        self.seed = seed
        self.device = torch.device(device)
        c = self.config
        self.train, self.test = _load(c.dataset, c.data_dir, c.downsample, c.size, float(c.test_fraction), seed)
        self.model_config = unet_config(c, self.train.channels)

    # ------------------------------------------------------------------------------ data

    def client_shards(
        self,
        n_clients: int,
        partition: str = "iid",
        seed: int | None = None,
        *,
        alpha: float = 0.5,
        min_fraction: float = 0.5,
        max_fraction: float = 2.0,
    ) -> list[seg_data.SegSet]:
        """Disjoint client training sets made of whole units (patients; slices for one subject).

        ``iid``: equal numbers of units; ``stratified``: FedPC's random imbalanced shares of the units
        (no classes here, as its Figure 3). ``dirichlet`` skews labels and does not apply.
        """
        check_choice("partition", partition, PARTITIONS)
        if partition == "dirichlet":
            raise TaskConfigError(
                "partition 'dirichlet' skews class labels; segmentation has none: use iid or stratified"
            )
        seed = self.seed if seed is None else seed
        units = self.train.unit_ids()
        groups = make_partition(
            partition,
            n_clients,
            seed=derive_seed(seed, "partition"),
            n_items=len(units),
            min_fraction=min_fraction,
            max_fraction=max_fraction,
        )
        return [self.train.select_units(units[g]) for g in groups]

    def input_spec(self) -> dict[str, Any]:
        """What a saved model needs to read new slices as training did (``export.py``): their shape, the
        intensity scaling of the dataset's loader (LGG: 8-bit; MRI brain extraction: the volume's 99.5th
        percentile, applied per image) and the probability threshold."""
        _, c, h, w = self.train.images.shape
        intensity = {"scale": 255.0} if self.config.dataset == "lgg" else {"percentile": 99.5, "clip": 1.5}
        return {
            "dataset": self.config.dataset,
            "channels": int(c),
            "height": int(h),
            "width": int(w),
            "intensity": intensity,
            "threshold": float(self.config.threshold),
        }

    # ----------------------------------------------------------------------------- model

    def build_model(self, seed: int | None = None) -> UNet:
        seed = self.seed if seed is None else seed
        return seeded_model(lambda: UNet(self.model_config), seed).to(self.device)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return build_optimizer(model, name=c.optimizer, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    # -------------------------------------------------------------------------- training

    def train_local(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: seg_data.SegSet,
        *,
        seed: int,
        epochs: int = 1,
        batch_size: int | None = None,
        step: LocalStep | None = None,
    ) -> dict[str, float]:
        """``epochs`` passes of mini-batch training (BCE + soft Dice) over ``shard``."""
        augment = self.config.augment == "flip"

        def batch(idx: torch.Tensor, gen: torch.Generator):
            x, y = shard.images[idx], shard.masks[idx]
            if augment:
                x, y = flip_batch(x, y, gen)
            return x.to(self.device), y.to(self.device)

        return run_epochs(
            model,
            optimizer,
            len(shard),
            batch,
            seed=seed,
            epochs=epochs,
            batch_size=batch_size or self.config.batch_size,
            step=step or plain_step(self.config.label_smoothing),
            lr_decay=self.config.lr_decay,
        )

    # ------------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def predict(
        self, model: nn.Module, data: seg_data.SegSet | None = None
    ) -> tuple[torch.Tensor, float, SegmentationScores]:
        """(foreground probabilities N×1×H×W, summed loss, scores) of ``data`` (default: the test set)."""
        data = self.test if data is None else data
        was_training = model.training
        model.eval()
        scores = SegmentationScores()
        probs, loss_sum = [], 0.0
        step = self.config.eval_batch_size
        for start in range(0, len(data), step):
            x = data.images[start : start + step].to(self.device)
            y = data.masks[start : start + step].to(self.device).float()
            logits = model(x)
            loss_sum += float(segmentation_loss(logits, y)) * x.shape[0]
            p = torch.sigmoid(logits).cpu()
            scores.update(p > self.config.threshold, y.cpu() > 0.5)
            probs.append(p)
        model.train(was_training)
        return torch.cat(probs), loss_sum, scores

    def example_losses(self, model: nn.Module, data: seg_data.SegSet) -> list[float]:
        """Each slice's loss (BCE + soft Dice) under ``model``, in order (the membership attack's per-example loss)."""
        was_training = model.training
        model.eval()
        out: list[float] = []
        with torch.no_grad():
            for i in range(len(data)):
                x = data.images[i : i + 1].to(self.device)
                y = data.masks[i : i + 1].float().to(self.device)
                out.append(float(segmentation_loss(model(x), y)))
        model.train(was_training)
        return out

    def non_members_like(self, members: seg_data.SegSet, seed: int) -> seg_data.SegSet:
        """As many held-out test slices as there are members (fewer if the test set is smaller)."""
        rng = np.random.default_rng([seed, 17])
        n = min(len(members), len(self.test))
        return self.test.subset(np.sort(rng.choice(len(self.test), size=n, replace=False)))

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
        return [
            {
                "unit": self.test.unit_names[int(data.units[i])],
                "image": data.images[i, 0].numpy(),
                "truth": data.masks[i, 0].numpy(),
                "prediction": (probs[i, 0] > self.config.threshold).numpy(),
            }
            for i in range(len(data))
        ]

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
            "config": asdict(self.config),
        }


__all__ = ["SegmentationTask", "flip_batch", "unet_config"]
