"""Record-level DP-SGD (core/dpsgd.py, tasks/record_dp.py): per-record gradients through Opacus, their clipping,
the noise, the accountant, and the runs that use them."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch
from helpers import dp_steps, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import dpsgd
from trustformer.core.accounting import epsilon_after
from trustformer.engine.inprocess import run_in_process
from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig
from trustformer.tasks import dp_canaries, record_dp

torch.set_num_threads(1)


tiny = partial(tiny_config, defaults={"privacy.unit": "record"})


def _model(tie: bool = True) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(
        TransformerConfig(
            vocab_size=40,
            pad_id=0,
            bos_id=1,
            eos_id=2,
            d_model=16,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_ff=32,
            max_len=12,
            dropout=0.0,
            tie_embeddings=tie,
        )
    )


def _batch(n: int = 5):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 40, (n, 7), generator=g)
    tgt = torch.randint(3, 40, (n, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2
    src[0, 5:] = 0  # padding in one record
    tgt[-1, 4:] = 0
    return src, tgt


@pytest.mark.parametrize("tie", [True, False])
def test_opacus_per_record_gradients_equal_one_backward_per_record(tie):
    """The reference: each record's gradient by its own backward pass. A use of a weight the hooks cannot see
    (the tied output projection as a bare F.linear) makes this fail."""
    from opacus import GradSampleModule

    record_dp._ready()
    model, (src, tgt) = _model(tie), _batch()
    params = {n: p for n, p in model.named_parameters()}
    reference = []
    for i in range(len(src)):
        model.zero_grad()
        model.pair_losses(src[i : i + 1], tgt[i : i + 1], label_smoothing=0.1).sum().backward()
        reference.append({n: p.grad.clone() for n, p in params.items()})
    wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=False)
    model.zero_grad()
    model.pair_losses(src, tgt, label_smoothing=0.1).mean().backward()
    for n, p in params.items():
        assert p.grad_sample is not None, n
        for i in range(len(src)):
            torch.testing.assert_close(p.grad_sample[i], reference[i][n], rtol=1e-4, atol=1e-6, msg=n)
    wrapped._close()


def _one_step(noise_multiplier: float, clip_norm: float, *, src, tgt, n_records=None):
    model = _model()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    dp = dpsgd.RecordDP(
        noise_multiplier=noise_multiplier, clip_norm=clip_norm, expected_batch=4, sample_rate=1.0, delta=1e-5
    )
    dpsgd.dp_sgd(
        model,
        optimizer,
        n_records or len(src),
        lambda idx: (src[idx], tgt[idx]),
        lambda m, s, t: m.pair_losses(s, t),
        dp=dp,
        steps=1,
        sampler=torch.Generator().manual_seed(0),
        noise=torch.Generator().manual_seed(0),
    )
    return torch.cat([(start[n] - p.detach()).flatten() for n, p in model.named_parameters()])


def test_each_record_moves_the_model_by_at_most_its_clip():
    src, tgt = _batch(1)
    step = _one_step(0.0, 0.05, src=src, tgt=tgt)  # one record, no noise, SGD lr 1: step = clip(g)/B
    assert step.norm().item() == pytest.approx(0.05 / 4, rel=1e-3)


def test_the_noise_is_gaussian_with_std_sigma_c_over_b():
    """Fails if Opacus' noise is replaced by zero (or mis-scaled)."""
    src, tgt = _batch(1)
    clean = _one_step(0.0, 0.05, src=src, tgt=tgt)
    noisy = _one_step(2.0, 0.05, src=src, tgt=tgt)
    spread = (noisy - clean).std().item()
    assert spread == pytest.approx(2.0 * 0.05 / 4, rel=0.05)


def test_calibrated_sigma_spends_the_target_and_opacus_agrees_with_dp_accounting():
    """The accountant: σ solved for the whole run spends ε ≤ target (and close to it), and an independent RDP
    accountant (Google's dp_accounting) gives the same ε for the same steps."""
    q, steps = 0.1, 300
    sigma = dpsgd.calibrate(1.0, 1e-5, q, steps)
    spent = dpsgd.epsilon_spent(sigma, q, steps, 1e-5)
    assert 0.95 <= spent <= 1.0
    assert epsilon_after(sigma, q, steps, 1e-5) == pytest.approx(spent, rel=0.02)
    assert dpsgd.epsilon_spent(sigma, q, steps // 3, 1e-5) < spent


def test_poisson_batches_include_each_record_independently():
    g = torch.Generator().manual_seed(3)
    sizes = [len(dpsgd.poisson_indices(1000, 0.05, g)) for _ in range(200)]
    assert sum(sizes) / len(sizes) == pytest.approx(50, rel=0.05)
    assert len(set(sizes)) > 5  # not a fixed batch


def test_record_level_run_reports_epsilon_per_client_and_round_and_in_the_summary(tmp_path):
    cfg = tiny(tmp_path, **{"privacy.epsilon": 3.0, "privacy.delta": 1e-5})
    summary = run_in_process(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eps = {(r["round"], r["client"]): r["record_epsilon"] for r in rows if "record_epsilon" in r}
    assert set(eps) == {(r, c) for r in (1, 2) for c in range(3)}
    for c in range(3):
        assert 0 < eps[(1, c)] < eps[(2, c)] <= 3.0 + 1e-6
    privacy = summary["privacy"]
    assert privacy["unit"] == "record" and privacy["private"]
    assert 2.9 <= privacy["epsilon"] <= 3.0
    row = privacy["clients"]["0"]
    assert privacy["epsilon"] >= epsilon_after(row["noise_multiplier"], row["sample_rate"], row["steps"], 1e-5) - 0.05
    assert math.isfinite(summary["test_loss"][0])


@pytest.mark.parametrize(
    "strategy,extra",
    [
        ("trustformer", {}),
        ("fedavg-topk", {}),
        ("fedavg", {"federation.payload_bits": 2}),
        ("dp-fedsam", {}),
        ("dp-blur-lus", {}),
        ("fedavg", {"secure.mode": "secagg"}),
    ],
)
def test_record_level_dp_composes_with_every_exchange(tmp_path, strategy, extra):
    summary = run_in_process(tiny(tmp_path, **{"federation.strategy": strategy, **extra}))
    assert summary["privacy"]["unit"] == "record"
    assert summary["privacy"]["epsilon"] <= 1.0 + 1e-6


def test_config_refuses_what_record_level_dp_cannot_cover(tmp_path):
    with pytest.raises(ConfigError, match="privacy.unit"):
        load_config("tiny", None, {"privacy.unit": "device"})
    with pytest.raises(ConfigError, match="task = 'translation'"):
        load_config("tiny", None, {"privacy.unit": "record", "task": "image-classification"})
    with pytest.raises(ConfigError, match="lora_targets"):
        load_config(
            "tiny",
            None,
            {
                "privacy.unit": "record",
                "train.init": "public",
                "model.adapters": "lora",
                "model.lora_targets": ["attention", "embedding"],
            },
        )
    with pytest.raises(ConfigError, match="audit_canaries"):
        load_config("tiny", None, {"privacy.audit_canaries": 10})


AUDIT = {
    "privacy.epsilon": 1.0,
    "privacy.delta": 1e-5,
    "privacy.audit_canaries": 5000,
    "privacy.batch_size": 60,
    "privacy.noise_source": "seeded-not-private",
    "privacy.checks": False,  # the audit must see each plant, which the every-run checks would stop first
}


def _planted_noise_bug(monkeypatch, factor: float = 1.0, groups: str = "", every_other: bool = False) -> None:
    """The planted bugs: Opacus adds σ/factor of noise, or takes it back out of the tensors of the parameter groups
    matching ``groups`` (a regular expression) or of every other trainable tensor, after adding it; the accountant
    still reports ε for σ everywhere."""
    import re

    import opacus.optimizers

    original, trainable = opacus.optimizers.DPOptimizer, dpsgd._trainable

    def tagged(model):
        params = trainable(model)
        for i, (name, p) in enumerate(params.items()):
            p._planted = (every_other and i % 2 == 1) or bool(
                groups and re.fullmatch(groups, dp_canaries.parameter_group(name))
            )
        return params

    class PlantedBug(original):
        def __init__(self, *args, noise_multiplier, **kwargs):
            super().__init__(*args, noise_multiplier=noise_multiplier / factor, **kwargs)

        def add_noise(self):
            super().add_noise()
            for p in self.params:
                if getattr(p, "_planted", False):
                    p.grad = p.summed_grad.view_as(p).to(p.grad.dtype)

    monkeypatch.setattr(dpsgd, "_trainable", tagged)
    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", PlantedBug)


PLANTS = {
    "noise / 10": {"factor": 10.0},
    "no noise on every other tensor": {"every_other": True},
    "no noise on the embedding": {"groups": r"embedding\.weight"},
    "no noise on one feed-forward weight": {"groups": r"encoder\.layers\.\*\.ffn\.fc1\.weight"},
}


@pytest.mark.slow  # each DP-SGD step's plant runs in the default tier: tests/test_audit_plants.py
def test_one_run_audit_keeps_epsilon_and_catches_each_planted_noise_bug(tmp_path, monkeypatch):
    """ε_lb ≤ ε on `tiny` at ε = 1 (5000 gradient canaries over every parameter group, the server's view of client
    0's updates); each planted bug, even noise missing from one parameter group only, must show ε_lb > ε."""
    from trustformer_lab.attack.dp_audit import audit

    honest = audit(tiny(tmp_path / "honest", **AUDIT))
    assert honest["epsilon"] <= 1.0 + 1e-6
    assert honest["epsilon_lb"] <= honest["epsilon"]
    caught = {}
    for label, plant in PLANTS.items():
        with monkeypatch.context() as patch:
            _planted_noise_bug(patch, **plant)
            broken = audit(tiny(tmp_path / label.replace(" ", "-").replace("/", ""), **AUDIT))
        assert broken["epsilon"] == pytest.approx(honest["epsilon"])  # the accountant does not see the bug
        caught[label] = (broken["epsilon_lb"], broken["group"])
    assert all(lb > honest["epsilon"] for lb, _group in caught.values()), caught


def test_the_audit_of_distributed_noise_reads_the_unmasked_sum_and_catches_a_planted_bug(tmp_path, monkeypatch):
    """Under distributed noise the server sees only the unmasked mean; the audit scores the canaries there."""
    from trustformer_lab.attack.dp_audit import audit

    values = {**AUDIT, "privacy.noise": "distributed", "secure.mode": "secagg"}
    honest = audit(tiny(tmp_path / "honest", **values))
    assert honest["secure"] == "secagg" and honest["epsilon_lb"] <= honest["epsilon"] <= 1.0 + 1e-6
    _planted_noise_bug(monkeypatch, groups=r"embedding\.weight")
    assert audit(tiny(tmp_path / "broken", **values))["epsilon_lb"] > honest["epsilon"]


def test_physical_pieces_of_a_poisson_batch_give_the_same_step():
    """A Poisson batch processed in pieces (memory) is the same mechanism: each record clipped once, one noise."""
    src, tgt = _batch(6)
    steps = []
    for piece in (2, 32):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        dp = dpsgd.RecordDP(noise_multiplier=0.0, clip_norm=0.05, expected_batch=6, sample_rate=1.0, delta=1e-5)
        dp_steps(model, optimizer, src, tgt, dp, physical_batch=piece)
        steps.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-5, atol=1e-7)


def test_the_membership_attack_audits_a_dp_run_with_lira_among_its_scores(tmp_path):
    """Every DP run's attack reports ε_lb from its ROC beside the ε the run spent."""
    from trustformer_lab.attack.membership import run_membership

    cfg = tiny(tmp_path, **{"privacy.epsilon": 1.0, "data.own_test_size": 20})
    result = run_membership(cfg, candidates=20, reference_models=2)
    assert "lira" in result["server"]
    audit = result["audit"]
    assert 0 < audit["epsilon"] <= 1.0 + 1e-6
    assert 0.0 <= audit["epsilon_lb"] <= audit["epsilon"]
    assert audit["members"] == audit["non_members"] == 60


def test_the_report_says_which_reading_of_the_papers_dp_rows_the_runs_fit(tmp_path):
    from trustformer_lab.report.builder import _dp_reading_verdict
    from trustformer_lab.report.runs import RunResult

    def run(unit, loss):
        return RunResult(
            tmp_path,
            {
                "strategy": "dp-fedavg",
                "config": {"privacy": {"unit": unit}},
                "client_ids": [0],
                "test_loss": [loss],
                "data": {"clients": {"0": {"vocab_size": 4000}}},
            },
        )

    fits_record = _dp_reading_verdict([run("client", 700.0), run("record", 4.9)])
    assert "fit the record-level reading" in fits_record
    assert run("record", 4.9).label.endswith("(record level)")
    assert "cannot tell" in _dp_reading_verdict([run("client", 700.0), run("record", 9.0)])
    assert "Only the client-level" in _dp_reading_verdict([run("client", 700.0)])


def test_bench_plans_the_record_level_rows_public_first_and_the_papers_reading():
    from trustformer_lab.bench.federation_bench import plan_record_dp_runs

    runs = plan_record_dp_runs([1.0, 8.0], [0, 1], public=True, lora_rank=16)
    labels = [r.label for r in runs]
    assert labels[0] == "public + fedavg lora r16 dp ε=8"
    assert {r.seed for r in runs if r.label == "fedavg dp ε=8"} == {0, 1}  # the deciding ε: every seed
    assert {r.seed for r in runs if r.label == "fedavg dp ε=1"} == {0}
    for r in runs:
        assert r.overrides["privacy.unit"] == "record"
    paper = [r for r in runs if r.label.endswith("record ε=1")]
    assert [r.overrides["federation.strategy"] for r in paper] == ["dp-fedavg", "dp-fedsam", "dp-blur-lus"]
    assert all(r.overrides["privacy.delta"] == 1e-3 for r in paper)
    assert all(r.overrides["privacy.delta"] == 1e-5 for r in runs if " dp ε=" in r.label)


def _sent(run) -> list[tuple[int, int, dict[str, torch.Tensor]]]:
    return [(ex.round, c, p) for ex in run.exchanges for c, p in sorted(ex.sent_payloads.items())]


def _final_reports(summary: dict) -> dict:
    """What the clients' final evaluation sent the server, but the fine-tuned model's own scores (ft_*, finetune_*)."""
    keys = ("test_loss", "bleu", "chrf", "own_test_loss", "own_bleu")
    return {k: summary[k] for k in keys if k in summary}


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_free_fine_tuning_spends_nothing_and_nothing_of_it_leaves_the_machine(tmp_path, monkeypatch):
    """privacy.finetune = 'free': the same σ and ε as a run without fine-tuning, and every message a client sends
    (each round's payload, the final evaluation's scores) equal to that run's, bit for bit (noise seeded for the
    comparison). Fine-tuning the held model in place and keeping it, so that the fine-tuned weights reach the
    final scores the server asks for next, fails it."""
    from trustformer.runtime import client as client_module
    from trustformer_lab.attack.harness import observed_run

    def run(out, finetune_epochs, **extra):
        values = {
            "privacy.noise_source": "seeded-not-private",
            "privacy.epsilon": 8.0,
            "privacy.delta": 1e-5,
            "federation.finetune_epochs": finetune_epochs,
            "federation.finetune_lr_scale": 1.0,
            **extra,
        }
        return observed_run(tiny(out, **values))

    plain, tuned = run(tmp_path / "plain", 0), run(tmp_path / "tuned", 2)
    assert tuned.summary["privacy"]["finetune"].startswith("free")
    assert tuned.summary["privacy"]["clients"] == plain.summary["privacy"]["clients"]  # σ, q, steps, ε
    assert "finetune_record_epsilon" not in json.dumps(tuned.summary)
    assert tuned.summary["ft_test_loss"] != tuned.summary["test_loss"]  # the fine-tuning did train
    assert _final_reports(tuned.summary) == _final_reports(plain.summary)
    for (r1, c1, p1), (r2, c2, p2) in zip(_sent(plain), _sent(tuned), strict=True):
        assert (r1, c1) == (r2, c2) and all(torch.equal(p1[n], p2[n]) for n in p1)
    charged = run(tmp_path / "charged", 2, **{"privacy.finetune": "dp"})  # the owner who publishes: DP, charged
    assert (
        charged.summary["privacy"]["clients"]["0"]["noise_multiplier"]
        > (plain.summary["privacy"]["clients"]["0"]["noise_multiplier"])
    )
    scores = client_module._finetuned_scores

    def kept(env, session, rnd):  # planted: fine-tunes the held model itself and saves it as the round's state
        monkeypatch.setattr(env.task, "personal_copy", lambda model: model)
        out = scores(env, session, rnd)
        optimizer = client_module.SavedOptimizerState(env.task.new_optimizer(session.model).state_dict())
        client_module.save_session(env, session, optimizer, client_module.ROUND_END)
        return out

    monkeypatch.setattr(client_module, "_finetuned_scores", kept)
    leaked = run(tmp_path / "leaked", 2)
    assert _final_reports(leaked.summary) != _final_reports(plain.summary)


def _sampling_check(metrics: list[dict]) -> None:
    """The rate the accountant charged (``dp_sample_rate``, ``dp_steps``, ``record_epsilon``) against what the
    sampler did (``dp_records`` drawn over ``steps`` Poisson batches of ``num_examples`` records): within four
    binomial standard deviations, the same step count, and the ε of that rate and count."""
    by_client: dict[int, list[dict]] = {}
    for r in metrics:
        if "dp_records" in r:
            by_client.setdefault(r["client"], []).append(r)
    assert by_client
    for rows in by_client.values():
        draws = sum(r["steps"] * r["num_examples"] for r in rows)
        realized = sum(r["dp_records"] for r in rows) / draws
        last = max(rows, key=lambda r: r["round"])
        q = last["dp_sample_rate"]
        assert abs(realized - q) <= 4 * math.sqrt(q * (1 - q) / draws), (realized, q)
        assert last["dp_steps"] == sum(r["steps"] for r in rows)
        spent = epsilon_after(last["dp_sigma"], q, last["dp_steps"], 1e-5)  # dp_accounting, not Opacus
        assert last["record_epsilon"] == pytest.approx(spent, rel=0.02)


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_the_accountants_sampling_rate_is_the_samplers(tmp_path, monkeypatch):
    values = {"privacy.epsilon": 4.0, "privacy.delta": 1e-5, "privacy.batch_size": 8, "federation.rounds": 3}
    run_in_process(tiny(tmp_path / "ok", **values))
    rows = [json.loads(x) for x in (tmp_path / "ok" / "metrics.jsonl").read_text().splitlines()]
    _sampling_check(rows)
    draw = dpsgd.poisson_indices  # planted: the sampler takes each record at twice the rate the accountant charges
    monkeypatch.setattr(dpsgd, "poisson_indices", lambda n, rate, g: draw(n, min(1.0, 2 * rate), g))
    run_in_process(tiny(tmp_path / "bug", **values, **{"privacy.checks": False}))  # privacy.checks would stop it
    rows = [json.loads(x) for x in (tmp_path / "bug" / "metrics.jsonl").read_text().splitlines()]
    with pytest.raises(AssertionError):
        _sampling_check(rows)


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too
def test_the_dp_steps_run_at_lr_scale_times_the_rate_and_a_batch_above_the_records_takes_them_all(tmp_path):
    """``privacy.lr_scale`` multiplies the DP steps' rate (the recipe sweep's lever), and an expected batch above an
    owner's records is that owner's records: rate 1, and the noisy sum divided by what it holds."""
    base = {"privacy.epsilon": 8.0, "privacy.delta": 1e-5, "privacy.batch_size": 16, "federation.rounds": 2}
    rates = {}
    for scale in (1.0, 4.0):
        out = tmp_path / f"scale-{scale:g}"
        run_in_process(tiny(out, **base, **{"privacy.lr_scale": scale}))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rates[scale] = [r["lr"] for r in rows if "lr" in r]
    assert any(rates[1.0]) and rates[4.0] == pytest.approx([4 * r for r in rates[1.0]])
    cfg = tiny(tmp_path, **{"privacy.batch_size": 10_000})
    plan = record_dp.plan(cfg, 300)
    assert record_dp.expected_batch(cfg, 300) == plan.expected_batch == 300 and plan.sample_rate == 1.0


def test_every_dp_step_charged_to_epsilon_has_a_learning_rate_above_zero(tmp_path):
    """With one full batch per round, the cosine reaches its floor after the run's last DP step, not at it: that
    step is charged to ε like the others, and at a rate of 0 it would move nothing."""
    out = tmp_path / "full-batch"
    run_in_process(tiny(out, **{"privacy.batch_size": 10_000, "federation.rounds": 2, "train.warmup_steps": 0}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last_round = [r["lr"] for r in rows if "lr" in r and r.get("round") == 2]
    assert last_round and all(lr > 0 for lr in last_round)
