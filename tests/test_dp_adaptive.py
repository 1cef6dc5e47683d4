"""Adaptive clipping of client-level DP (Andrew et al. 2021, server side): the geometric update of the bound, its
convergence to the target quantile, the noise split of Thm. 1, the options, and a run that records C_t."""

import math
from functools import partial

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from helpers import Crash, begin_server, crash_at, jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core.dp import geometric_clip_update, noise_generator, update_noise_multiplier
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import get_protocol
from trustformer.runtime.checkpoint import read_checkpoint, read_server_state, resume_config
from trustformer.tasks.translation_workload import derive_seed

ADAPTIVE = {"federation.strategy": "dp-fedavg", "privacy.clipping": "adaptive", "privacy.on_exceed": "continue"}


def _wrapper(clients: int, q: float, **privacy):
    """A dp-fedavg server (the DP wrapper, driven directly) for ``clients`` clients sampled with rate q (a count
    noise too small for σ is refused when the configuration loads)."""
    values = {
        **ADAPTIVE,
        "federation.clients": clients,
        "federation.rounds": 200,
        "privacy.sampling_rate": q,
        **{f"privacy.{k}": v for k, v in privacy.items()},
    }
    return begin_server(get_protocol(load_config("tiny", None, values)), {"w": torch.zeros(50)}, clients)


def _updates(norms, dim: int = 50, seed: int = 0):
    """Synthetic updates of exactly the given L2 norms, random directions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for norm in norms:
        v = torch.randn(dim, generator=g, dtype=torch.float64)
        out.append({"w": (v * (norm / v.norm())).float()})
    return out


def _round(protocol, rnd: int, updates):
    """One exchange round on the server: the aggregate, and the fields of the round's lines (the aggregation's and
    the release's)."""
    protocol.participants(rnd, list(range(protocol.population)), True)
    result = protocol.aggregate(rnd, updates, [1] * len(updates))
    return result.tensors, {**result.fields, **protocol.exchange_done(rnd, result.tensors)}


# ------------------------------------------------------------------------------- (a) the update rule


def test_geometric_update_against_a_hand_computed_reference():
    """σ = 0 and σ_b = 0: C_1 = 0.5 · e^(−0.2 (4/5 − 0.5)) (4 of the 5 expected updates at most 0.5), then
    C_2 = C_1 · e^(−0.2 (3/5 − 0.5)) (the 0.495 update is now above C_1 ≈ 0.4709). The aggregate is the sum of the
    updates clipped to C_t over qN = 5."""
    protocol = _wrapper(10, 0.5, noise_multiplier=0.0, clip_count_stddev=0.0, clip_norm=0.5)
    assert protocol.update_sigma == 0.0 and protocol.count_stddev == 0.0
    updates = _updates([0.1, 0.3, 0.495, 2.0, 0.2])
    out, fields = _round(protocol, 1, updates)
    assert protocol.clip == pytest.approx(0.47088227, rel=1e-7)  # 0.5 · exp(−0.06)
    assert fields["dp_clip_norm"] == 0.5 and fields["dp_unclipped_fraction"] == pytest.approx(0.8)
    expected = sum(u["w"].double() * min(1.0, 0.5 / float(u["w"].double().norm())) for u in updates) / 5
    assert torch.allclose(out["w"].double(), expected, atol=1e-7)
    out, fields = _round(protocol, 2, updates)
    assert protocol.clip == pytest.approx(0.47088227 * math.exp(-0.02), rel=1e-7)
    assert fields["dp_clip_norm"] == pytest.approx(0.47088227) and fields["dp_unclipped_fraction"] == pytest.approx(0.6)
    expected = sum(u["w"].double() * min(1.0, 0.47088227 / float(u["w"].double().norm())) for u in updates) / 5
    assert torch.allclose(out["w"].double(), expected, atol=1e-6)
    assert protocol.server_summary()["privacy"]["clip_norm_per_round"] == pytest.approx([0.5, 0.47088227])


def test_the_count_noise_is_drawn_with_sigma_b_and_enters_the_update():
    """Seeded (not private) noise, so the count's noise can be regenerated: b̃ = (b + σ_b·z) / (qN)."""
    protocol = _wrapper(
        20, 0.5, noise_multiplier=1.0, clip_count_stddev=3.0, clip_norm=1.0, noise_source="seeded-not-private"
    )
    _, fields = _round(protocol, 1, _updates([0.5] * 6 + [4.0] * 4))
    z = float(torch.randn((), generator=noise_generator(derive_seed(0, "dp-clip-count", 1)), dtype=torch.float64))
    fraction = (6 + 3.0 * z) / 10
    assert fields["dp_unclipped_fraction"] == pytest.approx(fraction)
    assert protocol.clip == pytest.approx(geometric_clip_update(1.0, fraction, 0.5, 0.2))
    assert protocol.clip == pytest.approx(math.exp(-0.2 * (fraction - 0.5)))


# ------------------------------------------------------------------------------- (b) convergence


@pytest.mark.parametrize("gamma, sigma", [(0.5, 0.0), (0.8, 0.0), (0.5, 1.0)])
def test_the_bound_moves_to_the_target_quantile_of_the_update_norms(gamma, sigma):
    """Norms uniform on [0, 2] (γ-quantile 2γ), 200 updates a round, C_1 = 0.05: after 80 rounds C stays within
    10% of 2γ (with σ = 1 the count carries the default noise σ_b = 200/20 = 10, 5% of the count)."""
    protocol = _wrapper(
        200,
        1.0,
        noise_multiplier=sigma,
        clip_norm=0.05,
        target_quantile=gamma,
        **({} if sigma else {"clip_count_stddev": 0.0}),
    )
    assert protocol.count_stddev == (10.0 if sigma else 0.0)
    g = torch.Generator().manual_seed(1)
    bounds = []
    for rnd in range(1, 121):
        norms = (torch.rand(200, generator=g, dtype=torch.float64) * 2).tolist()
        _round(protocol, rnd, _updates(norms, dim=8, seed=rnd))
        bounds.append(protocol.clip)
    assert bounds[0] > 0.05 and bounds[30] > 10 * 0.05  # it moved, upward, from far below
    late = bounds[80:]
    assert sum(late) / len(late) == pytest.approx(2 * gamma, rel=0.1)
    assert all(abs(b / (2 * gamma) - 1) < 0.25 for b in late)


# ------------------------------------------------------------------------------- (c) the noise split


@pytest.mark.parametrize("sigma, sigma_b", [(0.8, 5.0), (1.5, 1.0), (3.0, 15.0)])
def test_update_noise_and_count_noise_spend_what_one_release_at_sigma_spends(sigma, sigma_b):
    """Andrew et al. Thm. 1: σ_Δ⁻² + (2σ_b)⁻² = σ⁻²; through the RDP accountant, the Gaussian sum at σ_Δ composed
    with the count (sensitivity ½, noise σ_b: multiplier 2σ_b) gives the ε of one Gaussian release at σ."""
    sigma_delta = update_noise_multiplier(sigma, sigma_b)
    assert sigma_delta > sigma
    assert sigma_delta**-2 + (2 * sigma_b) ** -2 == pytest.approx(sigma**-2)

    def eps(*events):
        accountant = RdpAccountant()
        for event in events:
            accountant.compose(event)
        return accountant.get_epsilon(1e-5)

    pair = eps(dp_accounting.GaussianDpEvent(sigma_delta), dp_accounting.GaussianDpEvent(2 * sigma_b))
    assert pair == pytest.approx(eps(dp_accounting.GaussianDpEvent(sigma)), rel=1e-6)
    assert update_noise_multiplier(0.0, 0.0) == 0.0  # no noise, nothing to split


def test_a_count_noise_too_small_for_sigma_is_refused():
    with pytest.raises(ValueError, match=r"2 sigma_b > sigma"):
        update_noise_multiplier(2.0, 1.0)  # σ⁻² = (2σ_b)⁻²: nothing left for the update
    with pytest.raises(ConfigError, match=r"privacy.clip_count_stddev.*too small.*sigma_b > 1\.5"):
        _wrapper(100, 0.5, noise_multiplier=3.0, clip_count_stddev=1.0)
    # the default σ_b = qN / 20 with 3 clients (0.15) cannot carry the noise of epsilon = 1
    with pytest.raises(ConfigError, match=r"3 expected participants / 20.*is too small"):
        _wrapper(3, 1.0)
    assert _wrapper(1000, 0.1, noise_multiplier=1.0).count_stddev == pytest.approx(5.0)  # qN / 20


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"privacy.clipping": "median"}, r"privacy\.clipping = 'median' is not one of: fixed, adaptive"),
        ({"privacy.target_quantile": 1.5}, r"privacy\.target_quantile = 1\.5 must be in \[0\.0, 1\.0\]"),
        ({"privacy.clip_lr": 0.0}, r"privacy\.clip_lr = 0\.0 must be > 0"),
        ({"privacy.clip_count_stddev": -0.5}, r"privacy\.clip_count_stddev = -0\.5 must be >= 0, or -1"),
        ({"privacy.clipping": "adaptive", "privacy.unit": "record"}, r"applies to privacy\.unit = 'client'"),
        (
            {"privacy.clipping": "adaptive", "secure.mode": "secagg"},
            r"privacy\.clipping = 'adaptive' cannot run under secure\.mode = 'secagg'.*only their sum",
        ),
        (
            {"privacy.clipping": "adaptive", "secure.mode": "tee+secagg"},
            r"cannot run under secure\.mode = 'tee\+secagg'",
        ),
    ],
)
def test_adaptive_clipping_options_are_validated(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", None, {"federation.strategy": "dp-fedavg", **overrides})
    defaults = load_config("tiny", None, {}).privacy
    assert (defaults.clipping, defaults.target_quantile, defaults.clip_lr, defaults.clip_count_stddev) == (
        "fixed",
        0.5,
        0.2,
        -1.0,
    )


# ------------------------------------------------------------------------------- (d) end to end


TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "federation.rounds": 3,
    "eval.bleu_size": 2,
    "eval.meteor": False,
    "eval.bertscore": False,
    **ADAPTIVE,
    "privacy.noise_multiplier": 0.5,
    "privacy.clip_count_stddev": 1.0,
    "privacy.clip_norm": 0.05,
}
_tiny = partial(tiny_config, defaults=TINY)


def _round_bounds(out):
    """(round, C_t, b̃_t) of every round, from metrics.jsonl (the same on every client's line of a round)."""
    rows = jsonl(f"{out}/metrics.jsonl")
    rows = [r for r in rows if "event" not in r]
    per_round = {}
    for r in rows:
        per_round.setdefault(r["round"], set()).add((r["dp_clip_norm"], r["dp_unclipped_fraction"]))
    assert all(len(v) == 1 for v in per_round.values())
    return [(rnd, *next(iter(v))) for rnd, v in sorted(per_round.items())]


def test_a_run_with_adaptive_clipping_records_the_bound_of_every_round(tmp_path):
    cfg = _tiny(tmp_path, "run")
    summary = run_in_process(cfg)
    bounds = _round_bounds(cfg.out)
    assert [b[0] for b in bounds] == [1, 2, 3] and bounds[0][1] == 0.05
    for (_, c, fraction), (_, c_next, _) in zip(
        bounds, bounds[1:], strict=False
    ):  # C_{t+1} = C_t · exp(−η_C (b̃_t − γ))
        assert c_next == pytest.approx(c * math.exp(-0.2 * (fraction - 0.5)), rel=1e-9)
        assert c_next != c
    privacy = summary["privacy"]
    assert privacy["clipping"] == "adaptive" and privacy["clip_norm_per_round"] == [b[1] for b in bounds]
    assert privacy["noise_multiplier"] == 0.5  # the accountant keeps σ ...
    assert privacy["update_noise_multiplier"] == pytest.approx((0.5**-2 - 2.0**-2) ** -0.5)  # ... the sum σ_Δ
    assert privacy["epsilon_per_round"][-1] == privacy["epsilon"] > 0


def test_a_resumed_run_continues_with_the_same_bound(tmp_path):
    """Seeded (not private) noise and sampling, so both runs draw the same: the resumed run's bounds, ε and test
    loss are those of the uninterrupted run; the checkpoint after round 1 holds C_2."""
    options = {"runtime.store": "disk", "privacy.noise_source": "seeded-not-private", "privacy.sampling_rate": 0.7}
    full = run_in_process(_tiny(tmp_path, "full", **options))
    stopped = _tiny(tmp_path, "stopped", **options)

    with pytest.raises(Crash):
        run_in_process(stopped, client_app=crash_at("train.apply", 2, 1))
    checkpoint = read_checkpoint(stopped.out)
    assert checkpoint.round == 1
    state = read_server_state(stopped.out, checkpoint)
    assert state["protocol"]["state"]["clip"] == pytest.approx(_round_bounds(tmp_path / "full")[1][1])
    resumed = run_in_process(resume_config(stopped.out))
    assert _round_bounds(tmp_path / "stopped") == _round_bounds(tmp_path / "full")
    assert resumed["privacy"]["clip_norm_per_round"] == full["privacy"]["clip_norm_per_round"]
    assert resumed["privacy"]["epsilon_per_round"] == full["privacy"]["epsilon_per_round"]
    assert resumed["test_loss"] == full["test_loss"]
