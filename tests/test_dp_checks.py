"""The checks in every record-level DP run (``privacy.checks``, core/dp_checks.py): an honest run passes them and
records them in summary.json; a bug planted in each step of DP-SGD stops the run naming the check that sees it.

The plants are monkeypatched into the real code path, as in tests/test_audit_plants.py (whose plants are reused):
the sampler, Opacus' optimizer (clipping, noise), the noise generator, the accountant. Each is a real bug of the
mechanism that ran, which the reported ε does not show. The table over factors 2 and 4 and two settings:
``python scripts/dp_checks_plants.py``; false alarms over honest seeds and the checks' share of the time:
``python scripts/dp_checks_false_alarms.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from test_audit_plants import plant_accounting, plant_clipping, plant_noise, plant_sampling

from trustformer.config import load_config
from trustformer.core import dp_checks, dpsgd
from trustformer.core.dp import noise_generator
from trustformer.core.shared import derive_seed
from trustformer.engine.inprocess import run_in_process
from trustformer.tasks import record_dp

torch.set_num_threads(1)

BASE = {  # the noise and the draws seeded, so that a test's run is the same run each time (no flaky false alarm)
    "privacy.unit": "record",
    "privacy.delta": 1e-5,
    "privacy.noise_source": "seeded-not-private",
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
}
PRESET = dict(BASE)  # the preset's run: q = 1 (60 records, batch 1024), one step per round, two rounds
SAMPLED = {**BASE, "privacy.batch_size": 6}  # q = 0.1: ten Poisson steps per round, 20 over the run


@pytest.fixture(autouse=True)
def fresh_plans():
    """σ is solved once per configuration: a plant in the accountant must not find the honest σ cached."""
    record_dp._calibrated.cache_clear()
    yield
    record_dp._calibrated.cache_clear()


# ------------------------------------------------------------------------------ the plants the audit's tests lack


def plant_noise_everywhere(monkeypatch, k: float) -> None:
    """Noise: Opacus adds σ/k on every tensor (its noise multiplier divided by k); ε still reported for σ."""
    import opacus.optimizers

    original = opacus.optimizers.DPOptimizer

    class LessNoise(original):
        def __init__(self, *args, noise_multiplier, **kwargs):
            super().__init__(*args, noise_multiplier=noise_multiplier / k, **kwargs)

    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", LessNoise)


def plant_noise_on_one_tensor(monkeypatch, k: float, pattern: str = "decoder.layers.0.ffn.fc1.weight") -> None:
    """Noise: σ/k on one tensor only (the first decoder feed-forward weight, 2,048 coordinates of `tiny`)."""
    import opacus.optimizers

    original, trainable = opacus.optimizers.DPOptimizer, dpsgd._trainable

    def tagged(model):
        params = trainable(model)
        for name, p in params.items():
            p._planted = name == pattern
        return params

    class LessNoiseThere(original):
        def add_noise(self):
            super().add_noise()
            for p in self.params:
                if getattr(p, "_planted", False):
                    clipped = p.summed_grad.view_as(p).to(p.grad.dtype)
                    p.grad = clipped + (p.grad - clipped) / k

    monkeypatch.setattr(dpsgd, "_trainable", tagged)
    monkeypatch.setattr(opacus.optimizers, "DPOptimizer", LessNoiseThere)


def plant_repeated_noise(monkeypatch, k: float) -> None:
    """Noise: each owner's noise generator seeded from its client and round // k, so that k consecutive rounds
    release the same noise (a generator re-seeded from something that does not change every round)."""
    original = record_dp.generators

    def generators(cfg, seed):
        sampler, _noise = original(cfg, seed)
        rounds = range(1, cfg.federation.rounds + 1)
        who = {derive_seed(cfg.seed, "train", c, r): (c, r) for c in range(cfg.federation.clients) for r in rounds}
        client, rnd = who.get(seed, (-1, 1))
        return sampler, noise_generator(derive_seed(cfg.seed, "planted-noise", client, (rnd - 1) // int(k)))

    monkeypatch.setattr(record_dp, "generators", generators)


def plant_accountant_steps(monkeypatch, k: float) -> None:
    """Accounting: σ solved, and ε reported, for k × fewer steps than the run takes."""
    calibrate, epsilon = record_dp.calibrate, dpsgd.RecordDP.epsilon
    monkeypatch.setattr(
        record_dp, "calibrate", lambda eps, delta, rate, steps: calibrate(eps, delta, rate, max(1, int(steps // k)))
    )

    def reported(self, steps: int, noise_scale: float = 1.0) -> float:
        return epsilon(self, max(1, int(steps // k)), noise_scale)

    monkeypatch.setattr(dpsgd.RecordDP, "epsilon", reported)


def plant_step_count(monkeypatch, k: float) -> None:
    """Accounting: the steps charged before a round are the optimizer's count ÷ k (as if its state were lost)."""
    steps = record_dp.optimizer_steps
    monkeypatch.setattr(record_dp, "optimizer_steps", lambda optimizer: int(steps(optimizer) // k))


# name: (install(monkeypatch, k), the check that must see it, factors of the default tier)
PLANTS = {
    "clipping bound": (plant_clipping, "clipping"),
    "sampling rate": (plant_sampling, "sampling_rate"),
    "noise, whole model": (plant_noise_everywhere, "noise"),
    "noise, every other tensor": (plant_noise, "noise"),
    "noise, one tensor": (plant_noise_on_one_tensor, "noise"),
    "noise repeated across rounds": (plant_repeated_noise, "noise_fresh"),
    "accountant fed the wrong rate": (plant_accounting, "accountant"),
    "accountant fed the wrong step count": (plant_accountant_steps, "accountant"),
    "steps charged before a round": (plant_step_count, "steps"),
}


def run(tmp_path, values: dict, plant: str | None = None, k: float = 4.0, **more) -> dict:
    """A tiny record-DP run with ``plant`` planted at factor ``k``: its summary, or the DPCheckError's message."""
    with pytest.MonkeyPatch.context() as patch:
        if plant is not None:
            PLANTS[plant][0](patch, k)
        cfg = load_config("tiny", None, {"out": str(tmp_path), **values, **more})
        try:
            return run_in_process(cfg)
        except dp_checks.DPCheckError as exc:
            return {"error": str(exc)}


# ------------------------------------------------------------------------------ through the run


def test_an_honest_run_passes_every_check_and_records_them_in_the_summary(tmp_path):
    summary = run(tmp_path, PRESET)
    privacy = summary["privacy"]
    assert privacy["checks"]["passed"] is True and privacy["checks"]["false_alarm_rate"] == 1e-4
    on_disk = json.loads((tmp_path / "summary.json").read_text())["privacy"]
    assert on_disk["clients"] == privacy["clients"]
    for client in privacy["clients"].values():
        checks = {c["name"]: c for c in client["checks"]}
        assert list(checks) == list(dp_checks.CHECKS)
        assert checks["steps"]["statistic"] == client["steps"] == 2
        assert checks["sampling_rate"]["statistic"] == 1.0  # q = 1: every record, every step
        assert checks["sampling_dispersion"]["verdict"] == "skipped"  # q = 1 has no dispersion to test
        assert checks["clipping"]["statistic"] < 1e-5
        assert 0.75 <= checks["accountant"]["statistic"] <= 1.0
        lo, hi = checks["noise"]["interval"]
        assert lo < 1 < hi and lo <= checks["noise"]["statistic"] <= hi
        assert checks["noise_fresh"]["statistic"] >= 0.01
        assert {c["verdict"] for c in checks.values()} <= {"pass", "skipped"}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["dpcheck_failed"] == 0 and r["dpcheck_s"] < 1.0 for r in rows if "dpcheck_failed" in r)


def test_checks_off_add_nothing(tmp_path):
    summary = run(tmp_path, PRESET, **{"privacy.checks": False, "federation.clients": 2, "federation.rounds": 1})
    assert summary["privacy"]["checks"].startswith("off")
    assert all("checks" not in c for c in summary["privacy"]["clients"].values())


@pytest.mark.parametrize(
    "plant",
    [
        "clipping bound",
        "noise, whole model",
        "noise repeated across rounds",
        "accountant fed the wrong rate",
        "steps charged before a round",
    ],
)
def test_a_planted_bug_stops_the_run_naming_the_check(tmp_path, plant):
    """Each plant at factor 4 (the repeated noise: the preset's two rounds share it) stops the run in the client
    that sees it, the error naming the check (among others that see it too), the client and the step."""
    out = run(tmp_path, PRESET, plant, 4.0)
    assert "error" in out, out.get("privacy", {}).get("checks")
    message = out["error"]
    assert "failed for client " in message and "after DP step" in message, message
    assert f"DP check '{PLANTS[plant][1]}'" in message, message


@pytest.mark.slow  # the default tier within 12 minutes; CI runs the slow tier too (about 60 s)
@pytest.mark.parametrize("setting", ["preset", "sampled"])
def test_every_plant_the_checks_can_see_stops_the_run_at_factors_2_and_4(tmp_path, setting):
    """The plant table (scripts/dp_checks_plants.py) on one seed: the honest run passes, and every plant at 2 and 4
    stops it naming its check; but a sampling rate planted above q = 1, which draws every record as q = 1 does."""
    values = PRESET if setting == "preset" else SAMPLED
    assert run(tmp_path / "honest", values)["privacy"]["checks"]["passed"] is True
    for plant, (_install, check) in PLANTS.items():
        for k in (2.0, 4.0):
            out = run(tmp_path / f"{plant}-{k:g}".replace(" ", "-").replace(",", ""), values, plant, k)
            if plant == "sampling rate" and setting == "preset":
                assert "error" not in out  # q = 1: nothing to see, nothing changed
                continue
            assert f"DP check '{check}'" in out.get("error", ""), (plant, k, out.get("error"))


@pytest.mark.slow
def test_under_distributed_noise_an_owner_adding_no_share_stops_the_run(tmp_path):
    """Distributed noise: each owner checks its own share, σC/√3 of three; one owner adding none (the plant of
    tests/test_distributed_dp.py) fails its noise check. The honest run passes, under banded noise too."""
    values = {**PRESET, "privacy.noise": "distributed", "secure.mode": "secagg"}
    assert run(tmp_path / "honest", values)["privacy"]["checks"]["passed"] is True
    banded = {**values, "privacy.noise_bands": 2, "federation.rounds": 4}
    assert run(tmp_path / "banded", banded)["privacy"]["checks"]["passed"] is True
    real_share, calls = record_dp.share, []

    def one_share_missing(cfg, dp):
        calls.append(1)
        mechanism = real_share(cfg, dp)
        return mechanism if len(calls) % 3 else dataclasses.replace(mechanism, noise_multiplier=0.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(record_dp, "share", one_share_missing)
        out = run(tmp_path / "missing", values)
    assert "DP check 'noise' failed for client 2" in out.get("error", ""), out


def test_banded_noise_drawing_outside_its_group_stops_the_run(tmp_path):
    """Banded noise: a step draws from one b-min-sep group, ⌈n/b⌉ of the owner's n records. The honest run's
    ``min_sep`` passes at 15 of 60; b-min-sep sampling ignored (every round draws from all 60: tests/dp_plants.py)
    stops the run naming ``min_sep``, which nothing else in the checks sees."""
    from dp_plants import plant_min_sep

    values = {**PRESET, "privacy.noise": "distributed", "secure.mode": "secagg", "privacy.noise_bands": 4}
    honest = run(tmp_path / "honest", values, **{"federation.rounds": 4})
    checks = {c["name"]: c for c in honest["privacy"]["clients"]["0"]["checks"]}
    assert checks["min_sep"]["verdict"] == "pass" and checks["min_sep"]["statistic"] == 15
    with pytest.MonkeyPatch.context() as patch:
        plant_min_sep(patch, 1.0)
        out = run(tmp_path / "broken", values, **{"federation.rounds": 4})
    assert "DP check 'min_sep' failed" in out.get("error", ""), out


def test_a_failed_check_keeps_the_last_checkpoint(tmp_path):
    """A plant that starts in round 2 of 3 stops the run in round 2; round 1's checkpoint stays, and the run
    resumed from it without the bug passes every check, its record (steps, draws, noise) carried by the resume."""
    from trustformer.runtime.checkpoint import read_checkpoint, resume_config

    calls = {"n": 0}
    values = {**PRESET, "runtime.checkpoint": True, "federation.rounds": 3, "federation.clients": 2}
    with pytest.MonkeyPatch.context() as patch:
        original = dpsgd.dp_sgd

        def later(*args, **kwargs):  # the sampler doubles its rate from the second call on
            calls["n"] += 1
            if calls["n"] > 2:
                draw = dpsgd.poisson_indices
                patch.setattr(dpsgd, "poisson_indices", lambda n, rate, g: draw(n, rate, g)[: n // 2])
            return original(*args, **kwargs)

        patch.setattr(record_dp, "dp_sgd", later)
        with pytest.raises(dp_checks.DPCheckError, match="DP check 'sampling_rate' failed for client 0"):
            run_in_process(load_config("tiny", None, {"out": str(tmp_path), **values}))
    assert read_checkpoint(tmp_path).round == 1
    resumed = run_in_process(resume_config(tmp_path))
    assert resumed["resumed_after_rounds"] == [1] and resumed["privacy"]["checks"]["passed"] is True
    steps = {c["name"]: c for c in resumed["privacy"]["clients"]["0"]["checks"]}["steps"]
    assert steps["statistic"] == steps["interval"][0] == 3


# ------------------------------------------------------------------------------ the statistics themselves


def _record(**changes):
    return {**dp_checks.new_record(0), **changes}


def test_each_check_fails_what_it_must_and_passes_what_it_must():
    """The tests on records built by hand: a check that passes everything fails here."""
    honest = dp_checks.Reported(steps=20, epsilon=1.0, noise_multiplier=1.0, sample_rate=0.1, delta=1e-5)
    q, n = 0.1, 600
    base = _record(steps=20, releases=20, population=n * 20, drawn=round(n * 20 * q), draws=20, rates=[q])
    base["dispersion"], base["variance_min"] = 20.0, n * q * (1 - q)
    base["noise"] = {"w": [10_000, 10_000.0, 0.0], "b": [40, 40.0, 0.0]}
    base["prints"] = [[float(i)] * 8 for i in range(20)]
    sigma = dpsgd.calibrate(1.0, 1e-5, q, 20)
    honest = dataclasses.replace(honest, noise_multiplier=sigma, epsilon=dpsgd.epsilon_spent(sigma, q, 20, 1e-5))

    def verdicts(record, reported=honest):
        return {
            c.name: c.verdict for c in dp_checks.evaluate(json.loads(json.dumps(record)), reported, clients=1, looks=2)
        }

    assert set(verdicts(base).values()) == {"pass", "skipped"} and verdicts(base)["min_sep"] == "skipped"
    banded = {**base, "pool": 150, "records_max": 150}  # b-min-sep groups of 150 of the 600
    assert set(verdicts(banded).values()) == {"pass"}
    assert verdicts({**banded, "records_max": 151})["min_sep"] == "fail"
    assert verdicts({**base, "steps": 19})["steps"] == "fail"
    assert verdicts(base, dataclasses.replace(honest, steps=10))["steps"] == "fail"
    assert verdicts({**base, "drawn": round(n * 20 * q * 1.2)})["sampling_rate"] == "fail"
    assert verdicts({**base, "dispersion": 0.0})["sampling_dispersion"] == "fail"  # a fixed-size batch
    assert verdicts({**base, "dispersion": 80.0})["sampling_dispersion"] == "fail"
    assert verdicts({**base, "clip_residual": 0.01})["clipping"] == "fail"
    assert verdicts({**base, "noise": {**base["noise"], "w": [10_000, 10_000 / 4, 0.0]}})["noise"] == "fail"
    assert verdicts({**base, "noise": {**base["noise"], "w": [10_000, 10_000 * 1.1, 0.0]}})["noise"] == "fail"
    repeated = [*base["prints"][:-1], [p + 1e-4 for p in base["prints"][3]]]
    assert verdicts({**base, "prints": repeated})["noise_fresh"] == "fail"
    assert verdicts(base, dataclasses.replace(honest, epsilon=honest.epsilon / 2))["accountant"] == "fail"
    assert verdicts(base, dataclasses.replace(honest, epsilon=honest.epsilon * 2))["accountant"] == "fail"


def test_the_statistical_checks_keep_their_false_alarm_rate():
    """Simulated honest draws and noise, the tests at a per-test α of 0.05 (1 client, 1 look): the rejections stay
    within the rate (the dispersion test's χ² approximation, the noise test's χ² with few draws)."""
    g = torch.Generator().manual_seed(0)
    q, n, steps, trials = 0.1, 60, 20, 400
    rejected = {"sampling_rate": 0, "sampling_dispersion": 0, "noise": 0}
    alpha = dp_checks.RUN_ALPHA / len(dp_checks.STATISTICAL)  # evaluate's split with clients = looks = 1
    for _ in range(trials):
        sizes = torch.binomial(torch.full((steps,), float(n)), torch.full((steps,), q), generator=g)
        noise = torch.randn(40, generator=g)
        record = _record(population=n * steps, drawn=int(sizes.sum()), draws=steps, rates=[q])
        record["dispersion"] = float(((sizes - n * q) ** 2).sum() / (n * q * (1 - q)))
        record["variance_min"] = n * q * (1 - q)
        record["noise"] = {"b": [40, float((noise**2).sum()), 0.0]}
        with pytest.MonkeyPatch.context() as patch:  # α 0.05 per test instead of 0.01 / 3
            patch.setattr(dp_checks, "RUN_ALPHA", 0.05 * len(dp_checks.STATISTICAL))
            checks = dp_checks.evaluate(record, dp_checks.Reported(0, 0.0, 0.0, q, 1e-5), clients=1, looks=1)
        for c in checks:
            if c.name in rejected and c.verdict == "fail":
                rejected[c.name] += 1
    assert alpha < 0.05
    bound = trials * 0.05 + 3 * math.sqrt(trials * 0.05 * 0.95)
    assert all(r <= bound for r in rejected.values()), rejected


def test_the_banded_noise_std_is_the_recurrences():
    """Under privacy.noise_bands the noise of step t is y_t = C⁻¹z: its std the norm of row t of C⁻¹."""
    from trustformer.core.banded_noise import BandedNoise, sqrt_coefficients

    coefficients = sqrt_coefficients(3)
    banded = BandedNoise(coefficients)
    g = torch.Generator().manual_seed(1)
    ys = [banded.correlate("w", torch.randn(200_000, generator=g)) for _ in range(5)]
    for t, y in enumerate(ys):
        expected = dp_checks.Mechanism(1.0, 1.0, 1.0, coefficients, first_step=0).step_std(t)
        assert float(y.std()) == pytest.approx(expected, rel=0.01)
