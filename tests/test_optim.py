"""The training recipe: optimizers (decay on matrices only vs Table II's coupled decay) and the schedule."""

from __future__ import annotations

import math

import pytest
import torch

from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.tasks.optim import build_optimizer, lr_at, optimizer_steps, split_decay


def tiny_model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(
        TransformerConfig(
            vocab_size=20,
            pad_id=0,
            bos_id=1,
            eos_id=2,
            d_model=8,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_ff=16,
            max_len=8,
        )
    )


def test_paper_optimizer_is_l2_coupled_adam_on_every_parameter():
    model = tiny_model()
    optimizer = build_optimizer(model, name="adam", lr=1e-3, weight_decay=0.01, betas=(0.9, 0.98))
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["weight_decay"] == 0.01 and group["betas"] == (0.9, 0.98)
    assert sum(p.numel() for p in group["params"]) == model.num_parameters()
    # L2-coupled: with zero gradient the decay term passes through Adam's normalisation (step ~ lr)
    p = torch.nn.Parameter(torch.full((3,), 2.0))
    opt = build_optimizer(torch.nn.ParameterList([p]), name="adam", lr=0.1, weight_decay=0.01)
    p.grad = torch.zeros(3)
    opt.step()
    assert math.isclose(p.detach()[0].item(), 2.0 - 0.1, rel_tol=1e-4)


def test_adamw_decays_matrices_only_and_decoupled():
    model = tiny_model()
    decay, keep = split_decay(model)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay}
    kept = {names[id(p)] for p in keep}
    assert decayed and all(n.endswith(".weight") and "norm" not in n for n in decayed)
    assert "embedding.weight" in kept  # tied embedding = output projection: not decayed
    assert any(n.endswith(".bias") for n in kept) and any("norm" in n for n in kept)
    assert len(decay) + len(keep) == len(list(model.parameters()))
    optimizer = build_optimizer(model, name="adamw", lr=0.1, weight_decay=0.5)
    assert type(optimizer) is torch.optim.AdamW
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for n, p in model.named_parameters():
        if n in decayed:  # decoupled: w <- w (1 - lr * wd), not scaled by Adam
            assert torch.allclose(p, before[n] * (1 - 0.1 * 0.5), atol=1e-6), n
        else:
            assert torch.equal(p, before[n]), n
    assert optimizer_steps(optimizer) == 1


def test_schedule_warms_up_then_decays():
    kw = dict(lr=1.0, warmup_steps=10, decay_steps=110)
    assert lr_at(1, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(60, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(110, schedule="cosine", **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(500, schedule="cosine", min_lr=0.1, **kw) == pytest.approx(0.1)
    assert lr_at(40, schedule="inverse_sqrt", **kw) == pytest.approx(0.5)
    assert lr_at(40, schedule="constant", **kw) == 1.0
    with pytest.raises(ValueError, match="train.schedule"):
        lr_at(1, schedule="linear", **kw)


def test_step_count_survives_save_and_load():
    model = tiny_model()
    optimizer = build_optimizer(model)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    restored = build_optimizer(model)
    assert optimizer_steps(restored) == 0
    restored.load_state_dict(optimizer.state_dict())
    assert optimizer_steps(restored) == 3


def test_local_training_follows_the_schedule_across_rounds_and_a_state_reload():
    """The schedule position is the optimizer's own step count: round 2 continues where round 1 ended,
    also after the optimizer state went through a save and load (what the state store and resume do)."""
    from trustformer.config import load_config
    from trustformer.data.batching import encode_pairs
    from trustformer.tasks.translation_workload import (
        initial_model,
        load_workload,
        new_optimizer,
        planned_steps,
        train_local,
    )

    cfg = load_config(
        "tiny", None, {"train.warmup_steps": 3, "train.lr": 0.01, "federation.rounds": 3, "train.batch_tokens": 200}
    )
    workload = load_workload(cfg)
    pairs = encode_pairs(workload.shard(0), workload.tokenizer, max_len=cfg.model.max_len)
    model = initial_model(cfg, workload)
    optimizer = new_optimizer(cfg, model)
    total = planned_steps(cfg, pairs, workload.tokenizer.pad_id)
    first = train_local(cfg, model, optimizer, pairs, seed=1)
    assert first["train_tokens"] > 0 and first["tokens_per_s"] > 0
    reloaded = new_optimizer(cfg, model)
    reloaded.load_state_dict(optimizer.state_dict())
    second = train_local(cfg, model, reloaded, pairs, seed=2)
    steps = first["steps"] + second["steps"]
    assert optimizer_steps(reloaded) == steps
    expected = lr_at(steps, lr=0.01, schedule="cosine", warmup_steps=3, decay_steps=total)
    assert second["lr"] == pytest.approx(expected)
    assert second["lr"] < first["lr"]  # decaying, not restarted from the warm-up


def test_device_from_config():
    from trustformer.config import ConfigError, load_config
    from trustformer.tasks.translation_workload import device_of

    assert device_of(load_config("tiny", None, {"runtime.device": "cpu"})).type == "cpu"
    auto = device_of(load_config("tiny"))
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="runtime.device"):
        load_config("tiny", None, {"runtime.device": "tpu"})
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="runtime.device = 'cuda'"):
            device_of(load_config("tiny", None, {"runtime.device": "cuda"}))
