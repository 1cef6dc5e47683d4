"""Image classification as a federated task: a FIXUP ResNet (no BatchNorm) on Fashion-MNIST, digits or CIFAR-10.

FedPC (Section 5) trains ResNet-50 FIXUP on CIFAR-10 with momentum SGD, clients holding
class-stratified shards of random sizes (or Dirichlet label-skewed ones), centralized training as the
upper bound. Offline, the default is Fashion-MNIST (Debian's ``dataset-fashion-mnist``) with a
shallow FIXUP ResNet that trains on a CPU in minutes; the ``paper`` preset is FedPC's network on a
CIFAR-10 folder the user provides.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ImageConfig
from ..models.fixup_resnet import FixupConfig, FixupResNet, count_parameters
from . import image_data
from .base import (
    PARTITIONS,
    LocalStep,
    build_optimizer,
    check_choice,
    derive_seed,
    plain_step,
    run_epochs,
    seeded_model,
)
from .image_metrics import accuracy, per_class_accuracy
from .partition import partition as make_partition


def fixup_config(config: ImageConfig, in_channels: int, num_classes: int) -> FixupConfig:
    """The FIXUP ResNet of an ``image`` section for data of ``in_channels`` and ``num_classes``."""
    return FixupConfig(
        block=config.block,
        layers=config.layers,
        widths=config.widths,
        in_channels=in_channels,
        num_classes=num_classes,
        stem=config.stem,
        stem_stride=config.stem_stride,
        stem_width=config.stem_width,
    )


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
        rows = dy.view(-1, 1) + torch.arange(h).view(1, -1)  # n×h
        cols = dx.view(-1, 1) + torch.arange(w).view(1, -1)  # n×w
        idx_n = torch.arange(n).view(-1, 1, 1)
        x = padded.permute(0, 2, 3, 1)[idx_n, rows.view(n, h, 1), cols.view(n, 1, w)].permute(0, 3, 1, 2)
    return x.contiguous()


class ImageClassificationTask:
    """The :class:`~trustformer.tasks.base.Task` of image classification with a FIXUP ResNet."""

    name = "image-classification"

    def __init__(self, config: ImageConfig | None = None, *, seed: int = 0, device: str | torch.device = "cpu") -> None:
        self.config = config or ImageConfig()
        self.seed = seed
        self.device = torch.device(device)
        self.train, self.test = _load(
            self.config.dataset, self.config.data_dir, seed, self.config.train_size, self.config.test_size
        )
        self.model_config = fixup_config(self.config, self.train.shape[0], self.train.num_classes)

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
    ) -> list[image_data.ImageSet]:
        """Disjoint client training sets (``iid``, ``stratified`` or ``dirichlet``; see ``partition``)."""
        check_choice("partition", partition, PARTITIONS)
        seed = self.seed if seed is None else seed
        shards = self.partition_indices(
            n_clients, partition, seed, alpha=alpha, min_fraction=min_fraction, max_fraction=max_fraction
        )
        return [self.train.subset(idx) for idx in shards]

    def partition_indices(self, n_clients: int, partition: str, seed: int, **kwargs) -> list[np.ndarray]:
        """The shards as sorted index arrays into the training set."""
        return make_partition(
            partition, n_clients, seed=derive_seed(seed, "partition"), labels=self.train.labels.numpy(), **kwargs
        )

    def shard_class_counts(self, shards: list[image_data.ImageSet]) -> list[list[int]]:
        """Examples per client and class (what the report's partition figure shows)."""
        return [np.bincount(s.labels.numpy(), minlength=self.train.num_classes).tolist() for s in shards]

    def input_spec(self) -> dict[str, Any]:
        """What a saved model needs to read new images as training did (``export.py``): their shape, the pixel
        scale, the per-channel mean/std training normalises with, and the class names."""
        c, h, w = self.train.shape
        mean, std = image_data.CHANNEL_STATS[self.config.dataset]
        return {
            "dataset": self.config.dataset,
            "channels": c,
            "height": h,
            "width": w,
            "scale": 255.0,
            "mean": list(mean),
            "std": list(std),
            "classes": list(self.train.classes),
        }

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

    def train_local(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: image_data.ImageSet,
        *,
        seed: int,
        epochs: int = 1,
        batch_size: int | None = None,
        step: LocalStep | None = None,
    ) -> dict[str, float]:
        """``epochs`` passes of mini-batch training over ``shard`` (seeded order and augmentation)."""
        mode = self.config.augment

        def batch(idx: torch.Tensor, gen: torch.Generator):
            x = augment_batch(image_data.to_float(shard.images[idx], self.config.dataset), mode, gen)
            return x.to(self.device), shard.labels[idx].to(self.device)

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
    def predict(self, model: nn.Module, images: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """(predicted classes, summed cross-entropy) over the test set (or ``images`` with test labels)."""
        was_training = model.training
        model.eval()
        images = self.test.images if images is None else images
        labels = self.test.labels
        preds, loss_sum = [], 0.0
        step = self.config.eval_batch_size
        for start in range(0, len(images), step):
            logits = model(self.inputs(images[start : start + step]))
            y = labels[start : start + step].to(self.device)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            preds.append(logits.argmax(1).cpu())
        model.train(was_training)
        return torch.cat(preds), loss_sum

    def example_losses(self, model: nn.Module, data: image_data.ImageSet) -> list[float]:
        """Each image's cross-entropy under ``model``, in order (the membership attack's per-example loss)."""
        was_training = model.training
        model.eval()
        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(data), self.config.eval_batch_size):
                logits = model(self.inputs(data.images[start : start + self.config.eval_batch_size]))
                labels = data.labels[start : start + self.config.eval_batch_size].to(self.device)
                out.extend(F.cross_entropy(logits, labels, reduction="none").cpu().tolist())
        model.train(was_training)
        return out

    def non_members_like(self, members: image_data.ImageSet, seed: int) -> image_data.ImageSet:
        """Test images no client trained on, with the members' class counts (as far as the test set has them)."""
        rng = np.random.default_rng([seed, 17])
        test_labels = self.test.labels.numpy()
        picked = []
        for label, count in zip(*np.unique(members.labels.numpy(), return_counts=True), strict=True):
            pool = np.flatnonzero(test_labels == label)
            picked.extend(rng.choice(pool, size=min(count, len(pool)), replace=False).tolist())
        return self.test.subset(np.sort(np.array(picked, dtype=np.int64)))

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
            "per_class_accuracy": dict(zip(self.test.classes, per_class, strict=True)),
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
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.config).items()},
        }


__all__ = ["ImageClassificationTask", "augment_batch", "fixup_config"]
