"""Noise correlated across rounds (``privacy.noise_bands``; core/banded_noise.py, DP-FTRL with the banded square
root): the factor against its definition, the recurrence against a dense solve, the accounting against DP-SGD's,
Opacus' noise path, and distributed runs through real secure aggregation, killed and resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import Crash, crash_at, forget_process

from trustformer.config import ConfigError, load_config
from trustformer.core import banded_noise as bn
from trustformer.core import dpsgd, grad_canaries
from trustformer.core.dp_checks import DPCheckError
from trustformer.engine.inprocess import run_in_process
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.runtime.checkpoint import resume_config
from trustformer.runtime.store import ClientState, DiskStore
from trustformer.tasks import record_dp

torch.set_num_threads(1)

BANDED = {
    "privacy.unit": "record",
    "privacy.noise": "distributed",
    "privacy.noise_bands": 2,
    "privacy.epsilon": 8.0,
    "privacy.delta": 1e-5,
    "privacy.batch_size": 16,
    "secure.mode": "secagg",
    "federation.rounds": 3,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
}


def config(out, **values):
    return load_config("tiny", None, {"out": str(out), **BANDED, **values})


# ------------------------------------------------------------------------------------- the factor and its recurrence


def test_the_unbanded_factor_squares_to_the_prefix_sum_workload():
    """C = A^{1/2}: with every band kept, C·C is the lower-triangular matrix of ones (Kalinin & Lampert 2024)."""
    steps = 12
    c = bn.toeplitz(bn.sqrt_coefficients(steps), steps)
    torch.testing.assert_close(c @ c, torch.tril(torch.ones(steps, steps, dtype=torch.float64)))
    assert bn.sqrt_coefficients(4) == (1.0, 0.5, 0.375, 0.3125)


@pytest.mark.parametrize("bands", [1, 2, 5])
def test_the_recurrence_is_c_inverse_and_the_owners_shares_add_up(bands):
    """Three owners, each correlating its own shares: every owner's outputs are C⁻¹ of its inputs (the dense solve),
    and their sum is C⁻¹ of the summed shares. b = 1 returns the fresh noise itself."""
    steps, owners, g = 9, 3, torch.Generator().manual_seed(0)
    shares = torch.randn(owners, steps, 4, 3, generator=g, dtype=torch.float64)
    coefficients = bn.sqrt_coefficients(bands)
    c = bn.toeplitz(coefficients, steps)
    outputs = torch.zeros_like(shares)
    for k in range(owners):
        state = bn.BandedNoise(coefficients)
        for t in range(steps):
            outputs[k, t] = state.correlate("w", shares[k, t])
        assert len(state.history["w"]) == bands - 1
        reference = torch.linalg.solve_triangular(c, shares[k].reshape(steps, -1), upper=False)
        torch.testing.assert_close(outputs[k].reshape(steps, -1), reference)
    summed = torch.linalg.solve_triangular(c, shares.sum(0).reshape(steps, -1), upper=False)
    torch.testing.assert_close(outputs.sum(0).reshape(steps, -1), summed)
    if bands == 1:
        torch.testing.assert_close(outputs, shares)


def test_min_sep_groups_partition_the_records_and_follow_the_seed():
    groups = bn.min_sep_groups(103, 4, torch.Generator().manual_seed(3))
    together = torch.cat(groups)
    assert sorted(together.tolist()) == list(range(103))
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    again = bn.min_sep_groups(103, 4, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(groups, again, strict=True))
    with pytest.raises(ValueError, match="noise_bands"):
        bn.min_sep_groups(3, 4, torch.Generator().manual_seed(3))


# ------------------------------------------------------------------------------------- accounting


def test_banded_accounting_is_dp_sgd_at_sigma_over_the_column_norm_for_t_over_b_steps(tmp_path):
    """Thm. 4 of Choquette-Choo et al. 2023: the planned mechanism spends what DP-SGD at σ/‖C‖_col and rate q
    spends in ⌈T/b⌉ steps; σ solved for the run reaches the target; b = 1 is DP-SGD's own accounting."""
    for bands, rounds in ((1, 7), (3, 7), (4, 8)):
        cfg = config(tmp_path, **{"privacy.noise_bands": bands, "federation.rounds": rounds})
        dp = record_dp.plan(cfg, 400, (400, 400, 400))
        coefficients = bn.sqrt_coefficients(bands)
        assert dp.bands == bands and dp.column_norm == pytest.approx(bn.column_norm(coefficients, rounds))
        assert dp.sample_rate == pytest.approx(16 / (400 // bands))
        expected = dpsgd.epsilon_spent(dp.noise_multiplier / dp.column_norm, dp.sample_rate, -(-rounds // bands), 1e-5)
        assert dp.epsilon(rounds) == pytest.approx(expected)
        assert dp.epsilon(rounds) <= 8.0 + 1e-6 and dp.epsilon(rounds) == pytest.approx(8.0, rel=0.01)
        if bands == 1:
            assert dp.epsilon(rounds) == dpsgd.epsilon_spent(dp.noise_multiplier, dp.sample_rate, rounds, 1e-5)


@pytest.mark.parametrize(
    "values, says",
    [
        ({"privacy.noise": "local", "secure.mode": "none"}, "privacy.noise = 'distributed'"),
        ({"federation.clients_per_round": 2}, "every owner in every round"),
        ({"privacy.dropout_tolerance": 1}, "every owner in every round"),
        ({"privacy.finetune": "dp", "federation.finetune_epochs": 1}, "privacy.finetune = 'free'"),
        ({"privacy.noise_bands": 0}, "privacy.noise_bands"),
    ],
)
def test_banded_noise_is_refused_where_it_does_not_hold(tmp_path, values, says):
    with pytest.raises(ConfigError, match=says):
        config(tmp_path, **values)


# ------------------------------------------------------------------------------------- Opacus' path


def _model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(
        TransformerConfig(
            vocab_size=40, pad_id=0, bos_id=1, eos_id=2, d_model=16, n_heads=2, n_encoder_layers=1,
            n_decoder_layers=1, d_ff=32, max_len=12, dropout=0.0,
        )
    )  # fmt: skip


def _noise_per_step(noise_multiplier: float, banded: bn.BandedNoise | None, steps: int) -> torch.Tensor:
    """The gradient DP-SGD steps with at each of ``steps`` steps, flattened, at learning rate 0 (the model never
    moves, so every run sees the same clipped sums), from seeded samplers and noise."""
    record_dp._ready()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 40, (20, 7), generator=g), torch.randint(3, 40, (20, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    seen: list[torch.Tensor] = []
    optimizer.register_step_post_hook(
        lambda opt, *_: seen.append(torch.cat([p.grad.flatten().double() for p in model.parameters()]))
    )
    dp = dpsgd.RecordDP(noise_multiplier=noise_multiplier, clip_norm=0.5, expected_batch=8, sample_rate=0.4, delta=1e-5)
    dpsgd.dp_sgd(
        model,
        optimizer,
        20,
        lambda i: (src[i], tgt[i]),
        lambda m, s, t: m.pair_losses(s, t),
        dp=dp,
        steps=steps,
        sampler=torch.Generator().manual_seed(2),
        noise=torch.Generator().manual_seed(3),
        banded=banded,
    )
    return torch.stack(seen)


def test_dp_sgd_adds_c_inverse_of_the_fresh_noise_it_would_have_added():
    """Through Opacus: the noise on each step's gradient (against a noise-free twin) is C⁻¹ of the noise the same
    generator gives plain DP-SGD. A correlation that returns its input (a planted no-op) fails this."""
    steps, coefficients = 5, bn.sqrt_coefficients(3)
    clean = _noise_per_step(0.0, None, steps)
    fresh = _noise_per_step(1.3, None, steps) - clean
    banded = _noise_per_step(1.3, bn.BandedNoise(coefficients), steps) - clean
    expected = torch.linalg.solve_triangular(bn.toeplitz(coefficients, steps), fresh, upper=False)
    torch.testing.assert_close(banded, expected, rtol=1e-4, atol=1e-6)
    assert (banded - fresh).abs().max() > 0.1 * fresh.abs().max()


# ------------------------------------------------------------------------------------- distributed runs


def test_a_banded_run_draws_each_round_from_its_group_and_reports_its_accounting(tmp_path, monkeypatch):
    """Three owners, b = 2, three rounds through secure aggregation: round t draws from group t mod 2 only (the
    groups are disjoint), each owner keeps its last share, and the summary's ε is the banded accounting's."""
    drawn: list[set[tuple]] = []
    real = record_dp.run_steps

    def spy(cfg, model, optimizer, pairs, *args, **kwargs):
        drawn.append({(tuple(s), tuple(t)) for s, t in pairs})
        return real(cfg, model, optimizer, pairs, *args, **kwargs)

    monkeypatch.setattr(record_dp, "run_steps", spy)
    cfg = config(tmp_path / "run")
    result = run_in_process(cfg)
    privacy = (
        result["privacy"] if "privacy" in result else json.loads((cfg.out / "summary.json").read_text())["privacy"]
    )
    assert privacy["noise"] == "distributed"
    assert all(v["bands"] == 2 and v["steps"] == 3 for v in privacy["clients"].values())
    assert privacy["noise_bands"] == 2 and "Thm. 4" in privacy["banded_accounting"]
    assert privacy["epsilon"] <= 8.0 + 1e-6
    assert privacy["epsilon_server_and_one_owner"] > privacy["epsilon"]
    # the spy sees the training rounds in order, three owners per round
    by_round = [drawn[i : i + 3] for i in range(0, 9, 3)]
    for owner in range(3):
        first, second, third = (by_round[r][owner] for r in range(3))
        assert first == third and not first & second


RESUMABLE = {**BANDED, "privacy.noise_source": "seeded-not-private", "runtime.store": "disk"}


_crash_in_round_three = crash_at("train", 3)


def _losses(out: Path) -> list[float]:
    rows = [json.loads(x) for x in Path(out, "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [x["test_loss"] for x in rows if "test_loss" in x]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[float]:
    full = load_config("tiny", None, {**RESUMABLE, "out": str(tmp_path_factory.mktemp("full"))})
    run_in_process(full)
    return _losses(full.out)


@pytest.mark.parametrize(
    "history_saved",
    [
        # the slow tier: the resume matrix's "banded dp" compositions cover it in the README's tier
        pytest.param(True, id="checkpointed", marks=pytest.mark.slow),
        pytest.param(False, id="history left out (planted)", marks=pytest.mark.slow),
    ],
)
def test_a_banded_run_killed_after_round_two_resumes_exactly(tmp_path, monkeypatch, uninterrupted, history_saved):
    """Seeded noise, killed at round 3's first ``train``, resumed from round 2's checkpoint: the run goes on as if
    never stopped, because each owner's last share comes back from its store. Planted bug: the share history
    dropped from what the owners save makes the resumed run differ."""
    if not history_saved:
        real_save = DiskStore.save

        def save_without_history(self, client, state, at=None):
            groups = [
                {k: v for k, v in g.items() if k != record_dp.NOISE_HISTORY}
                for g in state.optimizer.get("param_groups", [])
            ]
            kept = ClientState(
                state.model, {**state.optimizer, "param_groups": groups}, state.protocol, state.rounds_done
            )
            return real_save(self, client, kept, at)

        monkeypatch.setattr(DiskStore, "save", save_without_history)
    # planted: the resume's own comparison, with the every-run checks off (they only observe, with their own
    # generators, so the losses are those of a run with them on); with them on, the noise check stops the run in
    # round 2 already: each owner reloads its state from the store every round, so the history is lost every round
    for checks in (True, False) if not history_saved else (True,):
        stopped = load_config(
            "tiny", None, {**RESUMABLE, "privacy.checks": checks, "out": str(tmp_path / f"stopped-{checks}")}
        )
        if not history_saved and checks:
            with pytest.raises(DPCheckError, match="round 2: .*DP check 'noise' failed"):
                run_in_process(stopped, client_app=_crash_in_round_three)
            continue
        with pytest.raises(Crash):
            run_in_process(stopped, client_app=_crash_in_round_three)
        forget_process()  # what a restarted process no longer holds
        resumed = run_in_process(resume_config(stopped.out))
        assert resumed["resumed_after_rounds"] == [2]
        if history_saved:
            assert _losses(stopped.out) == uninterrupted
        else:
            assert _losses(stopped.out) != uninterrupted, "the share history was not saved, and the resume hid it"


# ------------------------------------------------------------------------------------- the bench


def test_the_bench_measures_the_noise_the_matrices_predict(capsys):
    """``trustformer bench dp-bands``: the owners' correlated shares, summed and prefix-summed by the runs' code, carry
    the noise A·C⁻¹ predicts (within 3% over 20k coordinates); b = 1 is its own reference."""
    from trustformer_lab.bench import dp_bands_bench

    assert dp_bands_bench.main(["--epsilons", "8", "--rounds", "6", "--bands", "3", "--coordinates", "20000"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines()[2:]]
    assert [int(r[2]) for r in rows] == [1, 3]
    for r in rows:
        assert float(r[9]) / float(r[8]) == pytest.approx(1.0, abs=0.03)  # measured / predicted RMS
        assert float(r[11]) / float(r[10]) == pytest.approx(1.0, abs=0.05)  # and at the last round
        assert float(r[7]) == pytest.approx(8.0, rel=0.01)  # ε planned
    assert float(rows[0][12]) == 1.0


def test_the_audits_canaries_take_the_steps_of_their_group_only():
    """Canary c belongs to group c mod b: a round of another group cannot draw it, as it cannot draw a record of
    another group (a canary drawn every round would audit a mechanism b times leakier than the runs')."""
    canaries = grad_canaries.Canaries(
        names=("w",) * 6, coordinates=tuple(range(6)), included=(True, True, False, True, True, True)
    )
    assert record_dp.canaries_of_group(canaries, 1, 2).included == (False, True, False, True, False, True)
    assert record_dp.canaries_of_group(canaries, 0, 2).included == (True, False, False, False, True, False)
    assert record_dp.canaries_of_group(None, 0, 2) is None
