"""The one-run audit against bugs planted in each step of DP-SGD (core/dpsgd.py, attack/dp_audit.py).

The audit's gradient canaries take every step a record takes: the records' Poisson draw, Opacus' per-record
clipping, the noise and the division by B. So a bug in any of those steps reaches the canaries, and the audit fails
the run (ε_lb > the ε it reports). Each plant here is monkeypatched into the real code path, with a factor that makes
the true ε (the accountant's ε of the mechanism that actually ran) at least 4× the reported one; the accountant keeps
reporting ε ≈ 1. The unit tests pin the canaries' path itself: if the canaries skipped the draw or the clipping
(added to the clipped sum as ±min(magnitude, C), as they once were), the sampling and clipping plants would pass.

Settings, the smallest that catch every plant on all of five seeds tried (`tiny`, ε = 1, δ = 1e-5, 5,000 canaries;
``python scripts/audit_step_plants.py``, docs/privacy.md): full batches (q = 1) and 5 local epochs, 10 DP-SGD steps,
for clipping, noise and accounting; an expected batch of 12 of the 60 records (q = 0.2), 10 steps, for sampling. Two
steps of Adam (the preset's q = 1 and one epoch) keep little more than the first step's sign, and a 4× clipping bug
then passes on 2 seeds of 5. Noise cut on part of the model shows from σ/8 there (true ε 10.6; the test plants σ/10,
true ε 13.9): σ/4 on the tensors of half the canaries (true ε 4.7) is below what 5,000 canaries resolve at ε = 1.
Each audit takes 3-6 s.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_record_dp import _model  # the tiny Transformer the record-DP tests clip through Opacus

from trustformer.config import load_config
from trustformer.core import dpsgd, grad_canaries
from trustformer.tasks import record_dp

torch.set_num_threads(1)

REPORTED = 1.0
DELTA = 1e-5
BASE = {
    "privacy.unit": "record",
    "privacy.epsilon": REPORTED,
    "privacy.delta": DELTA,
    "privacy.audit_canaries": 5000,
    "privacy.noise_source": "seeded-not-private",
    "privacy.checks": False,  # the audit must see each plant, which the every-run checks would stop first
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
}
FULL_BATCH = {**BASE, "privacy.batch_size": 60, "train.local_epochs": 5}  # q = 1, 10 steps
SAMPLED = {**BASE, "privacy.batch_size": 12}  # q = 0.2, 10 steps


@pytest.fixture(autouse=True)
def fresh_plans():
    """σ is solved once per configuration (``record_dp._sigma``, ``_plan``): a plant in the accountant must not find
    the honest σ cached, nor leave its own behind. Autouse, so it is torn down after ``monkeypatch`` is undone."""
    record_dp._calibrated.cache_clear()
    yield
    record_dp._calibrated.cache_clear()


# the plants, one per step of DP-SGD (tests/dp_plants.py), and the true ε of the mechanism each leaves
from dp_plants import plant_accounting, plant_clipping, plant_noise, plant_sampling, true_epsilon  # noqa: E402

PLANTS = {
    "sampling": (plant_sampling, 5.0, SAMPLED),  # q = 0.2 drawn at 1: true ε 4.85
    "clipping": (plant_clipping, 4.0, FULL_BATCH),  # clipped at 4C: true ε 4.66
    "noise": (plant_noise, 10.0, FULL_BATCH),  # σ/10 on every other tensor: true ε 13.9
    "accounting": (plant_accounting, 5.0, FULL_BATCH),  # σ and ε for q/5: true ε 4.85
}


def _audit(tmp_path, values: dict) -> dict:
    from trustformer_lab.attack.dp_audit import audit

    return audit(load_config("tiny", None, {"out": str(tmp_path), **values}))


@pytest.mark.parametrize("settings", [FULL_BATCH, SAMPLED], ids=["q=1", "q=0.2"])
def test_an_honest_run_keeps_its_epsilon(tmp_path, settings):
    result = _audit(tmp_path, settings)
    assert 0.95 <= result["epsilon"] <= REPORTED + 1e-6
    assert result["epsilon_lb"] <= result["epsilon"], result


@pytest.mark.parametrize("plant", list(PLANTS))
def test_the_audit_fails_a_bug_planted_in_each_step(tmp_path, monkeypatch, plant):
    """The plant makes the true ε ≥ 4× the reported one, which the accountant does not see; the audit must."""
    install, k, settings = PLANTS[plant]
    install(monkeypatch, k)
    result = _audit(tmp_path, settings)
    reported = result["epsilon"]
    assert 0.95 <= reported <= REPORTED + 1e-6  # the accountant does not see the bug
    client = result["mechanism"]
    truth = true_epsilon(plant, k, client["noise_multiplier"], client["sample_rate"], client["steps"])
    assert truth >= 4 * reported, (plant, truth)
    assert result["epsilon_lb"] > reported, (plant, truth, result)


def test_under_distributed_noise_the_audit_fails_a_clip_above_c(tmp_path, monkeypatch):
    """Distributed noise (one plain SGD step a round from the pooled noisy sum, read by the server from the unmasked
    mean): the canaries of client 0's share take the same draw and clipping, so every owner clipping at 4C under the
    pooled noise σ·C (true ε 4.65) fails the audit of the preset's two rounds."""
    values = {**BASE, "privacy.noise": "distributed", "secure.mode": "secagg"}
    plant_clipping(monkeypatch, 4.0)
    result = _audit(tmp_path, values)
    client = result["mechanism"]
    assert result["secure"] == "secagg" and 0.95 <= result["epsilon"] <= REPORTED + 1e-6
    truth = true_epsilon("clipping", 4.0, client["noise_multiplier"], client["sample_rate"], client["steps"])
    assert truth >= 4 * result["epsilon"] and result["epsilon_lb"] > result["epsilon"], (truth, result)


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_the_honest_benchmark_counts_failures_and_times_the_plain_run(tmp_path):
    from trustformer_lab.attack.dp_audit import format_benchmark, honest_benchmark

    cfg = load_config("tiny", None, {"out": str(tmp_path), **BASE})  # the preset's run: q = 1, two steps
    bench = honest_benchmark(cfg, 2, (1.0,))
    (row,) = bench["rows"]
    assert row["seeds"] == 2 and len(row["epsilon_lb"]) == 2 and row["failures"] == 0
    assert row["plain_s"] > 0 and row["audit_s_mean"] > 0 and 0.0 <= row["ratio_max"] <= 1.0
    assert (tmp_path / "eps-1" / "plain" / "summary.json").is_file()
    assert f"| {row['epsilon_spent_mean']:.3f} | 2 | 0 |" in format_benchmark(bench)


@pytest.mark.slow
def test_honest_runs_seldom_fail_the_audit(tmp_path):
    """The false alarms the bound's 95% confidence allows, over 20 honest runs of the plants' full-batch setting
    (their own seeds, noise and coins): at most 3, the count more than which has probability < 5% at a rate of 5%.
    About 110 s."""
    from trustformer_lab.attack.dp_audit import honest_benchmark

    cfg = load_config("tiny", None, {"out": str(tmp_path), **FULL_BATCH})
    (row,) = honest_benchmark(cfg, 20, plain=False)["rows"]
    assert row["failures"] <= 3, row
    assert row["epsilon_lb_mean"] < 0.5 * row["epsilon_spent_mean"], row


# ------------------------------------------------------------------------------ the canaries' path through DP-SGD


def _records(n: int = 5):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 40, (n, 7), generator=g)
    tgt = torch.randint(3, 40, (n, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2
    return src, tgt


def _canaries(model, included, magnitude=1e3) -> grad_canaries.Canaries:
    """One canary on each of the first tensors, coordinate 3, alternating signs."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.numel() > 3][: len(included)]
    return grad_canaries.Canaries(
        names=tuple(names),
        coordinates=(3,) * len(names),
        included=tuple(included),
        signs=tuple(1.0 if i % 2 == 0 else -1.0 for i in range(len(names))),
        magnitude=magnitude,
    )


def _step(
    canaries, *, n_records=0, sigma=0.0, clip=0.05, rate=1.0, steps=1, physical_batch=32, noise_seed=0, checks=None
):
    """``steps`` DP-SGD steps with SGD at lr 1 (the model moves by the noisy mean gradient): (movement, metrics)."""
    model = _model()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    src, tgt = _records(max(n_records, 1))
    dp = dpsgd.RecordDP(noise_multiplier=sigma, clip_norm=clip, expected_batch=4, sample_rate=rate, delta=DELTA)
    metrics = dpsgd.dp_sgd(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        n_records,
        lambda idx: (src[idx], tgt[idx]),
        lambda m, s, t: m.pair_losses(s, t),
        dp=dp,
        steps=steps,
        sampler=torch.Generator().manual_seed(0),
        noise=torch.Generator().manual_seed(noise_seed),
        canaries=canaries(model) if callable(canaries) else canaries,
        physical_batch=physical_batch,
        checks=checks,
    )
    return {n: start[n] - p.detach() for n, p in model.named_parameters()}, metrics


def test_a_canary_is_clipped_by_the_records_clipping():
    """A canary's row through Opacus' clipping moves its coordinate by ±C/B, whatever its magnitude above C, and by
    its magnitude/B below C; nothing else moves. Records clipped at k·C (the clipping plant) move it k·C/B: if canaries
    were added as ±min(magnitude, C) beside the clipping, the plant would not reach them and this would fail."""
    included = (True, True, False, True)
    made = {}

    def canaries(model):
        made["c"] = _canaries(model, included)
        return made["c"]

    moved, metrics = _step(canaries)
    c = made["c"]
    assert metrics["dp_canaries"] == 3 and metrics["dp_records"] == 0
    for i, (name, flat) in enumerate(zip(c.names, c.coordinates, strict=True)):
        expected = c.signs[i] * 0.05 / 4 if c.included[i] else 0.0
        assert moved[name].flatten()[flat].item() == pytest.approx(expected, rel=1e-5, abs=1e-12), name
    total = sum(float(v.abs().sum()) for v in moved.values())
    assert total == pytest.approx(3 * 0.05 / 4, rel=1e-5)  # nothing but the three canaries' coordinates
    small, _ = _step(lambda model: _canaries(model, included, magnitude=0.01))
    assert small[c.names[0]].flatten()[3].item() == pytest.approx(0.01 / 4, rel=1e-5)
    with pytest.MonkeyPatch.context() as patch:
        plant_clipping(patch, 3.0)
        planted, _ = _step(canaries)
    assert planted[c.names[0]].flatten()[3].item() == pytest.approx(3 * 0.05 / 4, rel=1e-5)


def test_canaries_are_drawn_by_the_records_draw_at_their_rate(monkeypatch):
    """One Poisson draw per step over the records and the included canaries, at the records' rate: the sampling
    plant then reaches the canaries too. A canary drawn apart (its own coin per step) would make this fail."""
    calls = []
    draw = dpsgd.poisson_indices

    def spy(n, rate, generator):
        calls.append((n, rate))
        return draw(n, rate, generator)

    monkeypatch.setattr(dpsgd, "poisson_indices", spy)
    included = (True, False, True, True, False, True)
    _moved, metrics = _step(lambda model: _canaries(model, included), n_records=5, rate=0.5, steps=40)
    assert calls == [(5 + 4, 0.5)] * 40
    drawn = metrics["dp_canaries"] / (4 * 40)
    assert abs(drawn - 0.5) <= 4 * math.sqrt(0.25 / 160), drawn  # each included canary at the rate q
    assert abs(metrics["dp_records"] / (5 * 40) - 0.5) <= 4 * math.sqrt(0.25 / 200)
    calls.clear()
    monkeypatch.setattr(dpsgd, "poisson_indices", lambda n, rate, g: spy(n, min(1.0, 2 * rate), g))  # the plant
    _moved, metrics = _step(lambda model: _canaries(model, included), n_records=5, rate=0.5, steps=10)
    assert metrics["dp_canaries"] == 4 * 10  # drawn at 1: every included canary, every step


def test_a_run_whose_canaries_are_all_out_draws_and_steps_as_a_run_without_them():
    """The canaries change nothing but what they add: with every coin "out" the draw, the noise and the model are
    bit for bit those of a run without canaries."""
    none, plain = _step(None, n_records=5, sigma=1.0, rate=0.6, steps=3)
    out, with_canaries = _step(lambda model: _canaries(model, (False,) * 4), n_records=5, sigma=1.0, rate=0.6, steps=3)
    assert all(torch.equal(none[n], out[n]) for n in none)
    assert plain["dp_records"] == with_canaries["dp_records"] and with_canaries["dp_canaries"] == 0
    assert "dp_canaries" not in plain


def _count_clipped_rows(monkeypatch) -> list[int]:
    """The rows each call of Opacus' ``clip_and_accumulate`` clips, recorded in the list returned."""
    import opacus.optimizers

    rows: list[int] = []
    original = opacus.optimizers.DPOptimizer

    class Counting(original):
        def clip_and_accumulate(self):
            rows.append(len(self.grad_samples[0]))
            super().clip_and_accumulate()

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", Counting)
    return rows


def test_canary_rows_are_clipped_in_physical_batches(monkeypatch):
    """Memory: the canary rows held at once are ``physical_batch``, or as many more as ``CANARY_FLOATS`` floats of the
    model's rows hold (Opacus' clipping reads every tensor's rows), and the pieces give the same step."""
    rows = _count_clipped_rows(monkeypatch)
    many = (True,) * 6
    monkeypatch.setattr(
        grad_canaries, "CANARY_FLOATS", 1
    )  # no budget: canaries in pieces of physical_batch, as records
    whole, _ = _step(lambda model: _canaries(model, many), n_records=3, physical_batch=32)
    assert rows == [3, 6]
    rows.clear()
    pieces, _ = _step(lambda model: _canaries(model, many), n_records=3, physical_batch=2)
    assert rows == [2, 1, 2, 2, 2]
    for n in whole:
        torch.testing.assert_close(whole[n], pieces[n], rtol=1e-5, atol=1e-7)
    size = sum(p.numel() for p in _model().parameters())
    monkeypatch.setattr(grad_canaries, "CANARY_FLOATS", 4 * size)  # four rows of the model at once
    rows.clear()
    budget, _ = _step(lambda model: _canaries(model, many), n_records=3, physical_batch=2)
    assert rows == [2, 1, 4, 2]
    for n in whole:
        torch.testing.assert_close(whole[n], budget[n], rtol=1e-5, atol=1e-7)


def _dense_clip_canaries(dp_optimizer, where, canaries, chosen, piece, checks=None):
    """The reference: every drawn canary as its own dense row through Opacus' clipping."""
    params = list(dp_optimizer.params)
    ordered = sorted(chosen, key=lambda i: where[i])
    for start in range(0, len(ordered), piece):
        grad_canaries.canary_rows(params, where, canaries, ordered[start : start + piece])
        dp_optimizer.clip_and_accumulate()


def _crowded(model, included, per_tensor=5):
    """``per_tensor`` canaries on each of the first tensors, on coordinates 0, 2, 4, …, alternating signs."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.numel() > 2 * per_tensor][:3]
    located = [(n, 2 * k) for n in names for k in range(per_tensor)]
    return grad_canaries.Canaries(
        names=tuple(n for n, _ in located),
        coordinates=tuple(c for _, c in located),
        included=tuple(included[i % len(included)] for i in range(len(located))),
        signs=tuple(1.0 if i % 3 else -1.0 for i in range(len(located))),
    )


@pytest.mark.parametrize("clip", [0.05, 2e3])  # the canaries clipped to C, and left whole (C above their norm)
def test_canaries_of_one_tensor_add_what_their_probe_row_adds_as_every_dense_row_would(monkeypatch, clip):
    """Only one drawn canary per tensor goes through Opacus as a row; the others add what it added: the step is the
    one a dense row per canary gives, with records, noise and Poisson draws around them, and one row per tensor
    reaches Opacus' clipping."""
    rows = _count_clipped_rows(monkeypatch)
    coins = (True, True, False, True)
    fast, metrics = _step(lambda m: _crowded(m, coins), n_records=4, sigma=0.5, clip=clip, rate=0.7, steps=3)
    assert metrics["dp_canaries"] > 6 and max(rows) <= 4  # several canaries a tensor drawn; ≤ 3 probes + records
    monkeypatch.setattr(grad_canaries, "clip_canaries", _dense_clip_canaries)
    rows.clear()
    dense, _ = _step(lambda m: _crowded(m, coins), n_records=4, sigma=0.5, clip=clip, rate=0.7, steps=3)
    assert max(rows) > 4
    for n in dense:
        torch.testing.assert_close(fast[n], dense[n], rtol=1e-5, atol=1e-6)


def test_the_every_run_clipping_check_sees_the_canaries_added_beside_opacus(monkeypatch):
    """With ``privacy.checks`` on in an audit run, the canaries added beside Opacus (all but one per tensor) are
    in the clipped sum the clipping check expects: its residual stays at rounding; a check not told of them fails."""
    from trustformer.core import dp_checks

    def residual():
        checks = dp_checks.StepChecks(dp_checks.Mechanism(clip_norm=0.05, noise_std=0.025, sample_rate=0.7))
        _step(lambda m: _crowded(m, (True,)), n_records=4, sigma=0.5, clip=0.05, rate=0.7, steps=3, checks=checks)
        return checks.clip_residual

    assert residual() < dp_checks.CLIP_TOLERANCE
    monkeypatch.setattr(dp_checks.StepChecks, "single_coordinate_rows", lambda *args: None)
    assert residual() > dp_checks.CLIP_TOLERANCE
