"""Image classification as a federated task: a FIXUP ResNet (no BatchNorm) on Fashion-MNIST, digits or CIFAR-10.

FedPC (Section 5) trains ResNet-50 FIXUP on CIFAR-10 with momentum SGD, clients holding
class-stratified shards of random sizes (or Dirichlet label-skewed ones), centralized training as the
upper bound. Offline, the default is Fashion-MNIST (Debian's ``dataset-fashion-mnist``) with a
shallow FIXUP ResNet that trains on a CPU in minutes; the ``paper`` preset is FedPC's network on a
CIFAR-10 folder the user provides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..models.fixup_resnet import BLOCKS, STEMS, FixupConfig, FixupResNet, count_parameters, resnet50_config
from . import image_data
from .base import (
    PARTITIONS, LocalStep, TaskConfigError, build_optimizer, check_choice, check_positive, derive_seed,
    plain_step, run_epochs, seeded_model,
)
from .image_metrics import accuracy, per_class_accuracy
from .partition import partition as make_partition

DATASETS = ("fashion-mnist", "digits", "cifar10")
AUGMENTS = ("none", "flip", "crop-flip")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class ImageTaskConfig:
    """Options of the image-classification task (validated; errors name the field)."""

    dataset: str = "fashion-mnist"
    data_dir: str = ""              # fashion-mnist: idx folder (default Debian's); cifar10: required
    train_size: int = 0             # 0: the whole training set, else a seeded random subset
    test_size: int = 0              # 0: the whole test set, else its first test_size images
    # model: FIXUP ResNet
    block: str = "basic"
    layers: tuple[int, ...] = (1, 1, 1)
    widths: tuple[int, ...] = (16, 32, 64)
    stem: str = "cifar"
    stem_stride: int = 2
    stem_width: int = 0
    # local training
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_decay: float = 0.0           # lr / (1 + lr_decay · local epochs done): FedPC's step-based decay
    batch_size: int = 128
    label_smoothing: float = 0.0
    augment: str = "none"
    eval_batch_size: int = 1000

    def __post_init__(self) -> None:
        check_choice("dataset", self.dataset, DATASETS)
        if self.dataset == "cifar10" and not self.data_dir:
            raise TaskConfigError("data_dir must name the CIFAR-10 python folder (data_batch_1..5, test_batch)")
        check_positive("train_size", self.train_size, allow_zero=True, integer=True)
        check_positive("test_size", self.test_size, allow_zero=True, integer=True)
        check_choice("block", self.block, BLOCKS)
        check_choice("stem", self.stem, STEMS)
        check_choice("stem_stride", self.stem_stride, (1, 2))
        check_positive("stem_width", self.stem_width, allow_zero=True, integer=True)
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "widths", tuple(self.widths))
        if not self.layers or any(not isinstance(v, int) or v < 1 for v in self.layers):
            raise TaskConfigError(f"layers must be a non-empty list of block counts ≥ 1; got {list(self.layers)}")
        if len(self.widths) != len(self.layers) or any(not isinstance(v, int) or v < 1 for v in self.widths):
            raise TaskConfigError(f"widths must give one width ≥ 1 per stage of layers ({len(self.layers)}); "
                                  f"got {list(self.widths)}")
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

    def model_config(self, in_channels: int, num_classes: int) -> FixupConfig:
        return FixupConfig(block=self.block, layers=self.layers, widths=self.widths, in_channels=in_channels,
                           num_classes=num_classes, stem=self.stem, stem_stride=self.stem_stride,
                           stem_width=self.stem_width)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"], d["widths"] = list(self.layers), list(self.widths)
        return d


_R50 = resnet50_config()

#: ``tiny``: digits, seconds (tests). ``small``: Fashion-MNIST on 2 CPU cores in minutes (measured with
#: ``scripts/bench_image_tasks.py``). ``paper``: FedPC's ResNet-50 FIXUP on CIFAR-10 with momentum SGD,
#: lr 0.01 decayed with the local steps (the rate is ours: halved after 100 epochs), batch 128 (Section
#: 5.1), 250 epochs, for a GPU; ``data_dir`` must name the CIFAR-10 folder. Its stem is the CIFAR one (3×3, stride 1) that 32×32 inputs need;
#: 23.5M parameters, 94 MB in float32 (FedPC quotes 35 MB for its ResNet-50 FIXUP, which no ResNet-50
#: in float32 matches; Section 5.4).
#: Measured for ``small`` (``python -m trustformer.tasks.bench``, one torch thread on a shared 2-core
#: CPU, full test set): centralized 8 epochs → accuracy 0.903 in 231 s; FedAvg over 3 IID clients,
#: 8 rounds of one local epoch → 0.897 in 235 s (0.884 after 5 rounds, 145 s); FedAvg over FedPC's
#: stratified split (17,460 / 27,510 / 15,030 images) → 0.895 in 248 s.
IMAGE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dataset="digits", layers=(1, 1), widths=(8, 16), stem_stride=1, optimizer="adam", lr=0.01,
                 batch_size=32, weight_decay=0.0),
    "small": dict(dataset="fashion-mnist", layers=(1, 1, 1), widths=(16, 32, 64), stem_stride=2, lr=0.03,
                  lr_decay=0.3, momentum=0.9, weight_decay=5e-4, batch_size=32),
    "paper": dict(dataset="cifar10", block="bottleneck", layers=_R50.layers, widths=_R50.widths, stem="cifar",
                  stem_stride=1, stem_width=64, optimizer="sgd", lr=0.01, lr_decay=0.01, momentum=0.9,
                  weight_decay=5e-4, batch_size=128, augment="crop-flip"),
}
#: Epochs (rounds × local epochs) each preset is meant for.
IMAGE_PRESET_EPOCHS = {"tiny": 2, "small": 8, "paper": 250}


def image_preset(name: str, **overrides: Any) -> ImageTaskConfig:
    """An :class:`ImageTaskConfig` from a preset (``tiny``, ``small``, ``paper``) with overrides."""
    if name not in IMAGE_PRESETS:
        raise TaskConfigError(f"preset must be one of {', '.join(IMAGE_PRESETS)}; got {name!r}")
    return ImageTaskConfig(**{**IMAGE_PRESETS[name], **overrides})


@lru_cache(maxsize=4)
def _load(dataset: str, data_dir: str, seed: int, train_size: int, test_size: int):
    train, test = image_data.load_image_dataset(dataset, data_dir=data_dir or None, seed=seed)
    if train_size and train_size < len(train):
        keep = np.sort(np.random.default_rng([seed, 3]).permutation(len(train))[:train_size])
        train = train.subset(keep)
    return train, test.head(test_size)


def augment_batch(x: torch.Tensor, mode: str, gen: torch.Generator) -> torch.Tensor:
    """``flip``: random horizontal flips; ``crop-flip``: also a random crop of the image padded by 4
    (the standard CIFAR augmentation of He et al. 2016, Section 4.2). Draws from ``gen``."""
    if mode == "none":
        return x
    n, _, h, w = x.shape
    flip = torch.rand(n, generator=gen) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    if mode == "crop-flip":
        pad = 4
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
        dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
        rows = (dy.view(-1, 1) + torch.arange(h).view(1, -1))            # n×h
        cols = (dx.view(-1, 1) + torch.arange(w).view(1, -1))            # n×w
        idx_n = torch.arange(n).view(-1, 1, 1)
        x = padded.permute(0, 2, 3, 1)[idx_n, rows.view(n, h, 1), cols.view(n, 1, w)].permute(0, 3, 1, 2)
    return x.contiguous()


class ImageClassificationTask:
    """The :class:`~trustformer.tasks.base.Task` of image classification with a FIXUP ResNet."""

    name = "image-classification"

    def __init__(self, config: ImageTaskConfig | None = None, *, seed: int = 0, device: str | torch.device = "cpu") -> None:
        self.config = config or ImageTaskConfig()
        self.seed = seed
        self.device = torch.device(device)
        self.train, self.test = _load(self.config.dataset, self.config.data_dir, seed,
                                      self.config.train_size, self.config.test_size)
        self.model_config = self.config.model_config(self.train.shape[0], self.train.num_classes)

    # ------------------------------------------------------------------------------ data

    def client_shards(self, n_clients: int, partition: str = "iid", seed: int | None = None, *,
                      alpha: float = 0.5, min_fraction: float = 0.5, max_fraction: float = 2.0
                      ) -> list[image_data.ImageSet]:
        """Disjoint client training sets (``iid``, ``stratified`` or ``dirichlet``; see ``partition``)."""
        check_choice("partition", partition, PARTITIONS)
        seed = self.seed if seed is None else seed
        shards = self.partition_indices(n_clients, partition, seed, alpha=alpha,
                                        min_fraction=min_fraction, max_fraction=max_fraction)
        return [self.train.subset(idx) for idx in shards]

    def partition_indices(self, n_clients: int, partition: str, seed: int, **kwargs) -> list[np.ndarray]:
        """The shards as sorted index arrays into the training set."""
        return make_partition(partition, n_clients, seed=derive_seed(seed, "partition"),
                         labels=self.train.labels.numpy(), **kwargs)

    def shard_class_counts(self, shards: list[image_data.ImageSet]) -> list[list[int]]:
        """Examples per client and class (what the report's partition figure shows)."""
        return [np.bincount(s.labels.numpy(), minlength=self.train.num_classes).tolist() for s in shards]

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        return image_data.to_float(images, self.config.dataset).to(self.device)

    # ----------------------------------------------------------------------------- model

    def build_model(self, seed: int | None = None) -> FixupResNet:
        seed = self.seed if seed is None else seed
        return seeded_model(lambda: FixupResNet(self.model_config), seed).to(self.device)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return build_optimizer(model, name=c.optimizer, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    # -------------------------------------------------------------------------- training

    def train_local(self, model: nn.Module, optimizer: torch.optim.Optimizer, shard: image_data.ImageSet, *,
                    seed: int, epochs: int = 1, batch_size: int | None = None,
                    step: LocalStep | None = None) -> dict[str, float]:
        """``epochs`` passes of mini-batch training over ``shard`` (seeded order and augmentation)."""
        mode = self.config.augment

        def batch(idx: torch.Tensor, gen: torch.Generator):
            x = augment_batch(image_data.to_float(shard.images[idx], self.config.dataset), mode, gen)
            return x.to(self.device), shard.labels[idx].to(self.device)

        return run_epochs(model, optimizer, len(shard), batch, seed=seed, epochs=epochs,
                          batch_size=batch_size or self.config.batch_size,
                          step=step or plain_step(self.config.label_smoothing), lr_decay=self.config.lr_decay)

    # ------------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def predict(self, model: nn.Module, images: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """(predicted classes, summed cross-entropy) over the test set (or ``images`` with test labels)."""
        was_training = model.training
        model.eval()
        images = self.test.images if images is None else images
        labels = self.test.labels
        preds, loss_sum = [], 0.0
        step = self.config.eval_batch_size
        for start in range(0, len(images), step):
            logits = model(self.inputs(images[start:start + step]))
            y = labels[start:start + step].to(self.device)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            preds.append(logits.argmax(1).cpu())
        model.train(was_training)
        return torch.cat(preds), loss_sum

    def test_loss(self, model: nn.Module) -> float:
        """Mean cross-entropy (nats) on the shared held-out test set."""
        _, loss_sum = self.predict(model)
        return loss_sum / len(self.test)

    def final_metrics(self, model: nn.Module) -> dict[str, Any]:
        """``accuracy``, ``per_class_accuracy`` (class name → recall) and ``test_loss`` on the test set."""
        preds, loss_sum = self.predict(model)
        per_class = per_class_accuracy(preds, self.test.labels, self.test.num_classes)
        return {
            "accuracy": accuracy(preds, self.test.labels),
            "per_class_accuracy": dict(zip(self.test.classes, per_class)),
            "test_loss": loss_sum / len(self.test),
        }

    @cached_property
    def parameter_count(self) -> int:
        """Number of parameters of the model (built once, on the CPU)."""
        return count_parameters(FixupResNet(self.model_config))

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "dataset": self.config.dataset,
            "train_images": len(self.train),
            "test_images": len(self.test),
            "image_shape": list(self.train.shape),
            "classes": list(self.train.classes),
            "model": f"FIXUP ResNet ({self.config.block}, layers {list(self.config.layers)}, "
                     f"widths {list(self.config.widths)})",
            "parameters": self.parameter_count,
            "model_bytes_float32": 4 * self.parameter_count,
            "config": self.config.to_dict(),
        }


__all__ = ["AUGMENTS", "DATASETS", "IMAGE_PRESETS", "IMAGE_PRESET_EPOCHS", "ImageClassificationTask",
           "ImageTaskConfig", "augment_batch", "image_preset"]
