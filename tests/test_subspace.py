"""DP-SGD in a public subspace (core/subspace.py, ``privacy.subspace_dim``): the basis, the per-example gradients it
comes from, the two projections of the mechanism against a slow reference, and a run with it."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import dp_steps, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import dpsgd
from trustformer.core.subspace import Subspace, example_gradients, public_basis
from trustformer.engine.inprocess import run_in_process
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.tasks import record_dp

torch.set_num_threads(1)


def _model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=40, pad_id=0, bos_id=1, eos_id=2, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
        d_ff=32, max_len=12, dropout=0.0, tie_embeddings=True,
    )  # fmt: skip
    return Seq2SeqTransformer(config)


def _batch(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (n, 7), generator=g)
    tgt = torch.randint(3, 40, (n, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2
    return src, tgt


def test_the_basis_is_orthonormal_and_spans_the_public_gradients():
    g = torch.Generator().manual_seed(0)
    gradients = torch.randn(3, 50, generator=g) @ torch.randn(50, 50, generator=g)  # rank 3 in 50 dimensions
    basis = public_basis(gradients, 8)
    assert basis.shape == (50, 3)  # the zero singular values give no direction
    torch.testing.assert_close(basis.T @ basis, torch.eye(3), atol=1e-5, rtol=0)
    subspace = Subspace(basis, {"w": torch.Size([5, 10])})
    torch.testing.assert_close(subspace.project(gradients), gradients, atol=1e-3, rtol=1e-4)
    outside = torch.randn(50, generator=g)
    outside -= subspace.project(outside)
    assert subspace.project(outside).norm() < 1e-4 * outside.norm()
    top = public_basis(gradients, 1)  # the largest direction first
    assert float((top[:, 0] @ gradients.T).norm()) >= float((basis[:, 2] @ gradients.T).norm())


def test_example_gradients_are_each_examples_own_backward_pass():
    model = _model()
    src, tgt = _batch(3, 1)
    params = {n: p for n, p in model.named_parameters()}
    rows = example_gradients(params, lambda i: model.pair_losses(src[i : i + 1], tgt[i : i + 1])[0], 3)
    model.zero_grad()
    model.pair_losses(src[1:2], tgt[1:2]).sum().backward()
    torch.testing.assert_close(rows[1], torch.cat([p.grad.reshape(-1) for p in params.values()]))
    assert not torch.allclose(rows[0], rows[1])


def _steps(
    subspace: Subspace | None, *, noise_multiplier: float, clip_norm: float = 0.05, steps: int = 1, adam: bool = False
):
    """``steps`` DP-SGD steps at SGD lr 1 (``adam``: Adam at lr 1e-3) on every record (q = 1) of a fixed batch: the
    model's move (``adam``: and Adam's first moment, the releases' running mean)."""
    model = _model()
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    src, tgt = _batch(4, 2)
    dp = dpsgd.RecordDP(
        noise_multiplier=noise_multiplier, clip_norm=clip_norm, expected_batch=4, sample_rate=1.0, delta=1e-5
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if adam else torch.optim.SGD(model.parameters(), lr=1.0)
    dp_steps(model, optimizer, src, tgt, dp, steps, subspace=(lambda: subspace) if subspace is not None else None)
    move = start - torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if adam:
        return move, torch.cat([optimizer.state[p]["exp_avg"].reshape(-1) for p in model.parameters()])
    return move


def _public_subspace(k: int) -> Subspace:
    model = _model()
    src, tgt = _batch(16, 3)
    params = {n: p for n, p in model.named_parameters()}
    rows = example_gradients(params, lambda i: model.pair_losses(src[i : i + 1], tgt[i : i + 1])[0], 16)
    return Subspace(public_basis(rows, k), {n: p.shape for n, p in params.items()})


@pytest.mark.parametrize("plant", ["none", "records not projected"])
def test_one_step_is_the_projected_clipped_sum_and_the_noise_stays_in_the_subspace(monkeypatch, plant):
    """The slow reference of one step without noise: Σ_i clip_C(V Vᵀ g_i) / B, each g_i by its own backward pass.
    With noise the move stays in the subspace. Planted: the records left unprojected."""
    if plant == "records not projected":
        monkeypatch.setattr(dpsgd, "_project_records", lambda params, subspace: None)
    subspace = _public_subspace(6)
    model = _model()
    src, tgt = _batch(4, 2)
    params = {n: p for n, p in model.named_parameters()}
    rows = example_gradients(params, lambda i: model.pair_losses(src[i : i + 1], tgt[i : i + 1])[0], 4)
    projected = subspace.project(rows)
    clipped = projected * torch.clamp(0.05 / projected.norm(dim=1, keepdim=True), max=1.0)
    reference = clipped.sum(0) / 4
    quiet = _steps(subspace, noise_multiplier=0.0)
    noisy = _steps(subspace, noise_multiplier=1.0)
    outside = (noisy - subspace.project(noisy)).norm() / noisy.norm()
    if plant == "none":
        torch.testing.assert_close(quiet, reference, atol=1e-6, rtol=1e-4)
        assert outside < 1e-4
        expected = 1.0 * 0.05 / 4 * subspace.dim**0.5  # ‖N(0, (σC/B)² I_k)‖ ≈ σC√k / B: the noise is there, in k
        assert 0.3 * expected < float((noisy - quiet).norm()) < 3 * expected
    else:
        assert not torch.allclose(quiet, reference, atol=1e-6, rtol=1e-4)  # clipped at the unprojected norms


def test_the_subspace_costs_nothing_in_epsilon_and_is_refused_where_it_does_not_apply(tmp_path):
    base = {"privacy.unit": "record", "privacy.epsilon": 8.0, "privacy.delta": 1e-5, "out": str(tmp_path)}
    with_subspace = load_config("tiny", None, {**base, "privacy.subspace_dim": 4})
    assert record_dp.plan(with_subspace, 60) == record_dp.plan(load_config("tiny", None, base), 60)
    refusals = {
        "privacy.unit": ({"privacy.subspace_dim": 4}, "privacy.unit = 'record'"),
        "privacy.subspace_pairs": ({**base, "privacy.subspace_dim": 8, "privacy.subspace_pairs": 4}, "subspace_pairs"),
        "privacy.audit_canaries": ({**base, "privacy.subspace_dim": 4, "privacy.audit_canaries": 8}, "audit"),
        "privacy.noise": (
            {**base, "privacy.subspace_dim": 4, "privacy.noise": "distributed", "secure.mode": "secagg"},
            "privacy.noise = 'local'",
        ),
    }
    for values, message in refusals.values():
        with pytest.raises(ConfigError, match=message):
            load_config("tiny", None, {"out": str(tmp_path), **values})


def test_a_run_in_the_subspace_keeps_every_check_and_the_plain_runs_epsilon(tmp_path):
    """A tiny federated run with ``privacy.subspace_dim = 4``: every DP check passes and the ε is the plain run's."""
    values = {
        "privacy.unit": "record",
        "privacy.epsilon": 8.0,
        "privacy.delta": 1e-5,
        "privacy.batch_size": 16,
        "federation.rounds": 1,
        "privacy.subspace_pairs": 16,
    }
    summaries = {}
    for k in (0, 4):
        cfg = tiny_config(tmp_path, f"k{k}", **values, **{"privacy.subspace_dim": k})
        run_in_process(cfg)
        summaries[k] = json.loads((tmp_path / f"k{k}" / "summary.json").read_text(encoding="utf-8"))
    for summary in summaries.values():
        assert summary["privacy"]["epsilon"] <= 8.0 and all(
            c["verdict"] in ("pass", "skipped")
            for client in summary["privacy"]["clients"].values()
            for c in client["checks"]
        )
    assert summaries[4]["privacy"]["epsilon"] == pytest.approx(summaries[0]["privacy"]["epsilon"])
    assert summaries[4]["test_loss"] != summaries[0]["test_loss"]


@pytest.mark.parametrize("plant", ["none", "step not projected", "release not projected"])
def test_an_adaptive_optimizer_sees_the_projected_release_and_its_move_stays_in_the_subspace(monkeypatch, plant):
    """Adam rescales every coordinate, which spreads a step in the subspace over every weight: the step is projected
    after the optimizer's, and the release it reads before. Planted: either projection left out."""
    if plant == "step not projected":
        monkeypatch.setattr(dpsgd, "_step", lambda optimizer, params, basis: optimizer.step())
    if plant == "release not projected":
        monkeypatch.setattr(dpsgd, "_project_release", lambda params, subspace: None)
    subspace = _public_subspace(6)
    move, moment = _steps(subspace, noise_multiplier=1.0, steps=3, adam=True)

    def outside(x: torch.Tensor) -> float:
        return float((x - subspace.project(x)).norm() / x.norm())

    assert outside(move) < 1e-3 if plant != "step not projected" else outside(move) > 0.1
    assert outside(moment) < 1e-4 if plant != "release not projected" else outside(moment) > 0.5
