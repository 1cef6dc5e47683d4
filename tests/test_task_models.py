"""FIXUP ResNet (initialisation rules, identity at init, sizes) and U-Net (shapes, sizes, no statistics)."""

from __future__ import annotations

import math

import pytest
import torch

from trustformer.models.fixup_resnet import (
    FixupBasicBlock,
    FixupBottleneck,
    FixupConfig,
    FixupResNet,
    count_parameters,
    fixup_branch_scale,
    resnet50_config,
)
from trustformer.models.unet import UNet, UNetConfig, segmentation_loss, soft_dice_loss

torch.set_num_threads(1)


def small_resnet(**kw) -> FixupResNet:
    torch.manual_seed(0)
    return FixupResNet(FixupConfig(**{"layers": (2, 2, 2), "widths": (8, 16, 32), **kw}))


def test_branch_scale_formula():
    assert fixup_branch_scale(16, 2) == pytest.approx(16**-0.5)
    assert fixup_branch_scale(16, 3) == pytest.approx(16**-0.25)
    with pytest.raises(ValueError, match="m ≥ 2"):
        fixup_branch_scale(4, 1)


@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_fixup_rules_at_init(block):
    model = small_resnet(block=block)
    cfg = model.config
    blocks = list(model.blocks)
    assert len(blocks) == cfg.branches == 6
    # rule 1: classifier and the last layer of every branch are zero
    assert torch.count_nonzero(model.fc.weight) == 0 and torch.count_nonzero(model.fc.bias) == 0
    for blk in blocks:
        assert torch.count_nonzero(blk.branch_convs()[-1].weight) == 0
    # rule 2: the other branch layers are He-normal scaled by L^(-1/(2m-2))
    scale = fixup_branch_scale(cfg.branches, cfg.branch_layers)
    ratios = []
    for blk in blocks:
        for conv in blk.branch_convs()[:-1]:
            w = conv.weight
            he = math.sqrt(2.0 / (w.shape[0] * math.prod(w.shape[2:])))
            ratios.append(float(w.detach().std()) / (he * scale))
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.1)
    # rule 3: scalar multipliers 1, scalar biases 0
    scalars = {n: p for n, p in model.named_parameters() if p.numel() == 1}
    assert scalars and all(float(p.detach()) == (1.0 if n.endswith("scale") else 0.0) for n, p in scalars.items())
    assert sum(n.endswith("scale") for n in scalars) == cfg.branches
    # no BatchNorm, no buffers: only weights are ever exchanged
    assert list(model.buffers()) == []
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


@pytest.mark.parametrize("block_cls", [FixupBasicBlock, FixupBottleneck])
def test_residual_block_is_identity_path_at_init(block_cls):
    torch.manual_seed(1)
    model = FixupResNet(
        FixupConfig(
            block="basic" if block_cls is FixupBasicBlock else "bottleneck", layers=(2, 1), widths=(4, 8), in_channels=3
        )
    )
    x = torch.randn(2, 3, 10, 10)
    h = torch.relu(model.stem(x))
    for blk in model.blocks:
        with torch.no_grad():
            assert torch.count_nonzero(blk.branch(h)) == 0
            out = blk(h)
            assert torch.equal(out, torch.relu(blk.identity(h)))
        h = out
    logits = model(x)
    assert logits.shape == (2, 10) and torch.count_nonzero(logits) == 0  # zero classifier


def test_fixup_learns_and_gradients_reach_all_layers():
    model = small_resnet(layers=(1, 1), widths=(8, 16))
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    loss_sum, n = model.loss(x, y)
    assert n == 16 and float(loss_sum.detach()) == pytest.approx(16 * math.log(10), rel=1e-5)
    (loss_sum / n).backward()
    assert model.fc.weight.grad.abs().sum() > 0
    assert model.blocks[0].conv2.weight.grad.abs().sum() == 0  # zero classifier: no signal yet…
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    opt.zero_grad()
    loss_sum, n = model.loss(x, y)
    (loss_sum / n).backward()
    assert model.blocks[0].conv2.weight.grad.abs().sum() > 0  # …after one step, the zero layers learn


def test_resnet50_size_and_small_variants():
    r50 = FixupResNet(resnet50_config(in_channels=3, num_classes=10))
    assert r50.config.branches == 16 and r50.config.branch_layers == 3
    # torchvision's ResNet-50 has 23,528,522 weights with 10 classes (BatchNorm's 53,120 affine
    # parameters included); FIXUP drops BatchNorm and adds 7 scalars per block + 2
    assert count_parameters(r50) == 23_528_522 - 53_120 + 16 * 7 + 2
    cifar = FixupResNet(resnet50_config(stem="cifar"))
    assert cifar(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    small = FixupResNet(FixupConfig(layers=(1, 1, 1), widths=(16, 32, 64), stem_stride=2))
    assert count_parameters(small) == 77_099
    assert small(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_fixup_config_errors_name_the_field():
    with pytest.raises(ValueError, match="block must be one of"):
        FixupConfig(block="dense")
    with pytest.raises(ValueError, match="widths must give one positive width per stage"):
        FixupConfig(layers=(1, 1), widths=(8,))
    with pytest.raises(ValueError, match="stem_stride"):
        FixupConfig(stem_stride=3)


def test_unet_paper_size_matches_fedpc():
    n = count_parameters(UNet(UNetConfig(in_channels=3, depth=4, base_width=64, norm="none")))
    assert n == 31_031_745
    assert 4 * n / 2**20 == pytest.approx(118.4, abs=0.1)  # FedPC: "119 MB" in float32


@pytest.mark.parametrize("norm", ["group", "none"])
def test_unet_shapes_and_no_running_statistics(norm):
    torch.manual_seed(0)
    model = UNet(UNetConfig(in_channels=2, depth=3, base_width=4, norm=norm, groups=2))
    for h, w in [(16, 16), (27, 45)]:  # sizes not divisible by 2^depth are padded and cropped
        assert model(torch.randn(2, 2, h, w)).shape == (2, 1, h, w)
    assert list(model.buffers()) == []
    has_gn = any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
    assert has_gn == (norm == "group")
    # the same in training and evaluation mode (no batch statistics)
    x = torch.randn(3, 2, 16, 16)
    model.train()
    a = model(x)
    model.eval()
    b = model(x)
    assert torch.allclose(a, b)
    # one example gives the same output alone as within a batch
    assert torch.allclose(model(x[:1]), b[:1], atol=1e-6)


def test_unet_loss_convention_and_soft_dice():
    torch.manual_seed(0)
    model = UNet(UNetConfig(depth=2, base_width=4, groups=2))
    x, y = torch.randn(3, 1, 8, 8), (torch.rand(3, 1, 8, 8) > 0.5).to(torch.uint8)
    loss_sum, n = model.loss(x, y)
    assert n == 3
    assert float(loss_sum.detach()) == pytest.approx(
        3 * float(segmentation_loss(model(x), y.float()).detach()), rel=1e-5
    )
    perfect = torch.where(y.bool(), 20.0, -20.0)
    assert float(soft_dice_loss(perfect, y.float())) == pytest.approx(0.0, abs=1e-3)
    with pytest.raises(ValueError, match="norm must be one of"):
        UNetConfig(norm="batch")
    with pytest.raises(ValueError, match="depth must be in"):
        UNetConfig(depth=0)
