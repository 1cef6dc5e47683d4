"""U-Net (Ronneberger, Fischer & Brox, MICCAI 2015) for binary segmentation, with padded convolutions.

The architecture of the paper's Figure 1: an encoder of ``depth`` stages, each two 3×3 convolutions
+ ReLU then a 2×2 max-pool doubling the width; a bottleneck of two convolutions; a decoder whose
stages up-sample with a 2×2 transposed convolution halving the width, concatenate the encoder's
feature map of the same resolution, and apply two 3×3 convolutions; a final 1×1 convolution to one
logit per pixel. FedPC (Section 5.1) uses it with padding on 256×256 LGG slices; with ``depth = 4``
and ``base_width = 64`` (widths 64-1024) it has 31,031,745 parameters for 3 input channels without
normalisation (31,037,633 with GroupNorm), 124.1 MB = 118.4 MiB in float32: FedPC's "119 MB" U-Net
(Section 5.4).

Normalisation: ``norm="group"`` (default) puts a GroupNorm (Wu & He 2018; ``min(8, width)`` groups)
after every 3×3 convolution; ``norm="none"`` is the paper's original network. GroupNorm normalises
each example by statistics of its own channels, so it keeps **no running statistics**: the model
holds weights only, and nothing it exchanges summarises a client's data (FedPC, Section 5.2.1, on
why shared BatchNorm statistics reveal the data distribution). It also behaves the same in training
and evaluation and at FedPC's batch sizes of 4-16, where batch statistics are noisy. It speeds up and
stabilises training from scratch, which matters on a CPU budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

NORMS = ("group", "none")


@dataclass(frozen=True)
class UNetConfig:
    in_channels: int = 1
    out_channels: int = 1
    depth: int = 4  # number of 2× down-samplings
    base_width: int = 64  # channels of the first stage; stage i has base_width · 2^i
    norm: str = "group"
    groups: int = 8  # GroupNorm groups (at most the width)

    def __post_init__(self) -> None:
        for name in ("in_channels", "out_channels", "base_width", "groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1; got {getattr(self, name)}")
        if not 1 <= self.depth <= 6:
            raise ValueError(f"depth must be in 1..6 (number of down-samplings); got {self.depth}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {self.norm!r}")

    @property
    def multiple(self) -> int:
        """Inputs are padded to a multiple of this (2^depth) and the output cropped back."""
        return 2**self.depth


class DoubleConv(nn.Module):
    """(3×3 conv → [GroupNorm] → ReLU) × 2, padding 1 (the size is kept)."""

    def __init__(self, in_ch: int, out_ch: int, norm: str, groups: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in in (in_ch, out_ch):
            layers.append(nn.Conv2d(c_in, out_ch, 3, padding=1, bias=norm == "none"))
            if norm == "group":
                layers.append(nn.GroupNorm(min(groups, out_ch), out_ch))
            layers.append(nn.ReLU(inplace=True))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """U-Net returning one logit per pixel per output channel (N×out×H×W)."""

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        widths = [c.base_width * 2**i for i in range(c.depth + 1)]
        self.down = nn.ModuleList()
        in_ch = c.in_channels
        for w in widths[:-1]:
            self.down.append(DoubleConv(in_ch, w, c.norm, c.groups))
            in_ch = w
        self.bottom = DoubleConv(widths[-2], widths[-1], c.norm, c.groups)
        self.up = nn.ModuleList()
        self.up_conv = nn.ModuleList()
        for w_low, w in zip(widths[:0:-1], widths[-2::-1], strict=True):
            self.up.append(nn.ConvTranspose2d(w_low, w, 2, stride=2))
            self.up_conv.append(DoubleConv(2 * w, w, c.norm, c.groups))
        self.head = nn.Conv2d(widths[0], c.out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        m = self.config.multiple
        pad_h, pad_w = (-h) % m, (-w) % m
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, conv, skip in zip(self.up, self.up_conv, reversed(skips), strict=False):
            x = conv(torch.cat([skip, up(x)], dim=1))
        return self.head(x)[..., :h, :w]

    def loss(self, x: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> tuple[torch.Tensor, int]:
        """Binary cross-entropy + soft Dice loss (mean over the batch) times the batch size, and the
        batch size (the ``model.loss`` convention of the protocols' local steps).

        ``y`` is the N×1×H×W (or N×H×W) {0, 1} mask; ``label_smoothing`` moves the BCE targets
        towards 0.5 by that amount.
        """
        logits = self(x)
        target = y.to(logits.dtype).reshape(logits.shape)
        return segmentation_loss(logits, target, label_smoothing) * target.shape[0], int(target.shape[0])


def soft_dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 − soft Dice of sigmoid probabilities, per image, averaged (Milletari et al. 2016, Eq. 1,
    with the squared terms replaced by plain sums and a smoothing ``eps``)."""
    prob = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    inter = (prob * t).sum(1)
    return (1.0 - (2.0 * inter + eps) / (prob.sum(1) + t.sum(1) + eps)).mean()


def segmentation_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean BCE (per pixel) + soft Dice loss (per image): the loss reported and minimised."""
    bce_target = target * (1.0 - label_smoothing) + 0.5 * label_smoothing if label_smoothing else target
    return F.binary_cross_entropy_with_logits(logits, bce_target) + soft_dice_loss(logits, target)


__all__ = ["DoubleConv", "NORMS", "UNet", "UNetConfig", "segmentation_loss", "soft_dice_loss"]
