"""ResNet with FIXUP initialisation and no normalisation layer (Zhang, Dauphin & Ma, ICLR 2019).

FedPC (Section 5.1) trains "ResNet50 FIXUP" on CIFAR-10 because BatchNorm's running statistics,
computed on one worker's data and shared with the model, reveal that data's mean and variance. FIXUP
trains deep residual networks without any normalisation by its three rules (Zhang et al. 2019,
Section 3, "Fixup initialization"):

1. the classification layer and the last layer of every residual branch are initialised to 0;
2. every other layer gets a standard (He) initialisation, and the weight layers *inside* residual
   branches are scaled by ``L^(-1/(2m-2))``, with ``L`` the number of residual branches and ``m`` the
   number of layers in a branch (m = 2 for a basic block: ``L^(-1/2)``; m = 3 for a bottleneck:
   ``L^(-1/4)``);
3. a scalar multiplier (initialised to 1) in every branch and a scalar bias (initialised to 0)
   before each convolution, linear layer and element-wise activation.

Rule 1 makes every residual block an identity map at initialisation (the branch outputs
``0·scale + bias = 0``), so the network's output is the classifier's bias (0): the property the
tests check. The model has parameters only, no buffers: nothing but weights is ever exchanged.

Two stems: ``"cifar"`` (3×3 convolution, stride 1: for 28×28 and 32×32 inputs, as the FIXUP
authors' CIFAR models) and ``"imagenet"`` (7×7 stride 2 + 3×3 max-pool, the standard ResNet-50
stem). Shortcuts that change shape are a strided 1×1 convolution (He et al. 2016, option B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

BLOCKS = ("basic", "bottleneck")
STEMS = ("cifar", "imagenet")


@dataclass(frozen=True)
class FixupConfig:
    """Architecture of a FIXUP ResNet. ``layers[i]`` blocks at width ``widths[i]`` (stage i > 0 halves
    the resolution). ResNet-50: bottleneck, layers (3, 4, 6, 3), widths (64, 128, 256, 512)."""

    block: str = "basic"
    layers: tuple[int, ...] = (1, 1, 1)
    widths: tuple[int, ...] = (16, 32, 64)
    in_channels: int = 1
    num_classes: int = 10
    stem: str = "cifar"
    stem_width: int = 0  # 0: widths[0]
    stem_stride: int = 1  # "cifar" stem only: 2 halves the resolution first (4× cheaper on 28×28)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(v) for v in self.layers))
        object.__setattr__(self, "widths", tuple(int(v) for v in self.widths))
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {', '.join(BLOCKS)}; got {self.block!r}")
        if self.stem not in STEMS:
            raise ValueError(f"stem must be one of {', '.join(STEMS)}; got {self.stem!r}")
        if not self.layers or any(n < 1 for n in self.layers):
            raise ValueError(f"layers must be a non-empty list of block counts ≥ 1; got {list(self.layers)}")
        if len(self.widths) != len(self.layers) or any(w < 1 for w in self.widths):
            raise ValueError(
                f"widths must give one positive width per stage ({len(self.layers)}); got {list(self.widths)}"
            )
        if self.in_channels < 1:
            raise ValueError(f"in_channels must be ≥ 1; got {self.in_channels}")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be ≥ 2; got {self.num_classes}")
        if self.stem_stride not in (1, 2):
            raise ValueError(f"stem_stride must be 1 or 2; got {self.stem_stride}")
        if self.stem_width < 0:
            raise ValueError(f"stem_width must be ≥ 0 (0: the first stage's width); got {self.stem_width}")

    @property
    def branches(self) -> int:
        """L: the number of residual branches."""
        return sum(self.layers)

    @property
    def branch_layers(self) -> int:
        """m: the number of weight layers in one residual branch."""
        return 2 if self.block == "basic" else 3


def resnet50_config(in_channels: int = 3, num_classes: int = 10, stem: str = "imagenet") -> FixupConfig:
    """Bottleneck ResNet-50 (He et al. 2016): 16 blocks (3, 4, 6, 3), widths 64-512, expansion 4."""
    return FixupConfig(
        block="bottleneck",
        layers=(3, 4, 6, 3),
        widths=(64, 128, 256, 512),
        in_channels=in_channels,
        num_classes=num_classes,
        stem=stem,
        stem_width=64,
    )


def fixup_branch_scale(branches: int, branch_layers: int) -> float:
    """``L^(-1/(2m-2))``: the factor of rule 2 (Zhang et al. 2019, Section 3)."""
    if branches < 1 or branch_layers < 2:
        raise ValueError(f"need L ≥ 1 branches and m ≥ 2 layers per branch; got L={branches}, m={branch_layers}")
    return branches ** (-1.0 / (2 * branch_layers - 2))


def _he_normal_(weight: torch.Tensor, scale: float = 1.0) -> None:
    """He et al. (2015) normal initialisation, fan-out mode (as the FIXUP authors' code), times ``scale``."""
    fan_out = weight.shape[0] * math.prod(weight.shape[2:])
    with torch.no_grad():
        weight.normal_(0.0, math.sqrt(2.0 / fan_out) * scale)


def _scalar(value: float) -> nn.Parameter:
    return nn.Parameter(torch.full((1,), float(value)))


class FixupBasicBlock(nn.Module):
    """Two 3×3 convolutions (m = 2) with the FIXUP scalar biases and multiplier (rule 3)."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.bias1a, self.bias1b, self.bias2a, self.bias2b = (_scalar(0) for _ in range(4))
        self.scale = _scalar(1)
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(width, out_ch, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False) if stride != 1 or in_ch != out_ch else None
        )

    def branch_convs(self) -> list[nn.Conv2d]:
        return [self.conv1, self.conv2]

    def identity(self, x: torch.Tensor) -> torch.Tensor:
        """The shortcut path: x, or its projection when the block changes shape."""
        return x if self.shortcut is None else self.shortcut(x + self.bias1a)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x + self.bias1a) + self.bias1b)
        return self.conv2(out + self.bias2a) * self.scale + self.bias2b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.branch(x) + self.identity(x))


class FixupBottleneck(nn.Module):
    """1×1 → 3×3 (stride) → 1×1 ×4 (m = 3) with the FIXUP scalar biases and multiplier (rule 3)."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        (self.bias1a, self.bias1b, self.bias2a, self.bias2b, self.bias3a, self.bias3b) = (_scalar(0) for _ in range(6))
        self.scale = _scalar(1)
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False) if stride != 1 or in_ch != out_ch else None
        )

    def branch_convs(self) -> list[nn.Conv2d]:
        return [self.conv1, self.conv2, self.conv3]

    def identity(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.shortcut is None else self.shortcut(x + self.bias1a)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x + self.bias1a) + self.bias1b)
        out = F.relu(self.conv2(out + self.bias2a) + self.bias2b)
        return self.conv3(out + self.bias3a) * self.scale + self.bias3b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.branch(x) + self.identity(x))


class FixupResNet(nn.Module):
    """A FIXUP ResNet classifier (no normalisation layers, no buffers)."""

    def __init__(self, config: FixupConfig) -> None:
        super().__init__()
        self.config = config
        block = FixupBasicBlock if config.block == "basic" else FixupBottleneck
        stem_width = config.stem_width or config.widths[0]
        if config.stem == "cifar":
            self.stem = nn.Conv2d(config.in_channels, stem_width, 3, stride=config.stem_stride, padding=1, bias=False)
            self.pool = None
        else:
            self.stem = nn.Conv2d(config.in_channels, stem_width, 7, stride=2, padding=3, bias=False)
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bias_stem = _scalar(0)
        blocks: list[nn.Module] = []
        in_ch = stem_width
        for stage, (n, width) in enumerate(zip(config.layers, config.widths, strict=True)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block(in_ch, width, stride))
                in_ch = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.bias_fc = _scalar(0)
        self.fc = nn.Linear(in_ch, config.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """FIXUP initialisation (Zhang et al. 2019, Section 3, rules 1-3); uses torch's global RNG."""
        cfg = self.config
        scale = fixup_branch_scale(cfg.branches, cfg.branch_layers)
        _he_normal_(self.stem.weight)
        for module in self.blocks:
            blk = cast("FixupBasicBlock | FixupBottleneck", module)  # __init__ fills self.blocks with these
            *inner, last = blk.branch_convs()
            for conv in inner:
                _he_normal_(conv.weight, scale)  # rule 2: scaled by L^(-1/(2m-2))
            nn.init.zeros_(last.weight)  # rule 1: last layer of the branch is 0
            if blk.shortcut is not None:
                _he_normal_(blk.shortcut.weight)  # outside the branch: plain He
        nn.init.zeros_(self.fc.weight)  # rule 1: classifier is 0
        nn.init.zeros_(self.fc.bias)
        with torch.no_grad():  # rule 3: biases 0, multipliers 1
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf == "scale":
                    p.fill_(1.0)
                elif leaf.startswith("bias") and p.numel() == 1:
                    p.fill_(0.0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x) + self.bias_stem)
        if self.pool is not None:
            x = self.pool(x)
        x = self.blocks(x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x) + self.bias_fc)

    def loss(self, x: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> tuple[torch.Tensor, int]:
        """Cross-entropy summed over the batch and the number of examples (the ``model.loss``
        convention every protocol's local step uses)."""
        logits = self(x)
        return F.cross_entropy(logits, y, reduction="sum", label_smoothing=label_smoothing), int(y.shape[0])


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "FixupBasicBlock",
    "FixupBottleneck",
    "FixupConfig",
    "FixupResNet",
    "count_parameters",
    "fixup_branch_scale",
    "resnet50_config",
]
