"""The one-run audit of client-level DP (dp-fedavg, dp-fedsam; attack/client_dp_audit.py) against a bug planted in
each step of the DP wrapper (protocols/wrappers/dp.py): sampling, clipping, noise and accounting.

Canary clients (Andrew et al. 2024) take every step a client's update takes, in the wrapper's own code: the same
Poisson draw at the run's rate, the client-side clipping and the server's, the one noise of the sum. So a bug in any
of those steps reaches them, and the audit fails the run (ε_lb > the ε it reports). Each plant is monkeypatched into
the real code path; the accountant keeps reporting ε ≈ 1. The unit tests pin the canaries' path itself (if canaries
were drawn apart, or added to the sum beside the clipping, the sampling and clipping plants would not reach them).

What an audit of this size resolves (``python scripts/client_audit_plants.py``): at ε = 1, δ = 1e-5 and 2,000
canaries, every plant whose true ε is about 4× the reported one (σ/4 on the whole sum, clipping at 4C, sampling at
5q, 16× fewer rounds counted) fails, and σ/4 on half the model's tensors with 5,000 (found by the scores' spread per
tensor, :func:`~trustformer_lab.attack.client_dp_audit.quiet_pool`); clipping at 2C or σ/2 (true ε 2.1) passes, as it
would pass any one-run bound with a few thousand canaries (Andrew et al.'s estimate ε̂ sees it: about 2). The default
tier runs the plants whose true ε is infinite, with 500 canaries, and the path's unit tests; the 4× plants run in the
slow tier.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from helpers import begin_server

from trustformer.config import load_config
from trustformer.core import dp as core_dp
from trustformer.core.accounting import PrivacyLedger, epsilon_after
from trustformer.protocols import make_protocol
from trustformer.protocols.wrappers import dp as wrapper_dp

torch.set_num_threads(1)

REPORTED = 1.0
DELTA = 1e-5
BASE = {
    "federation.strategy": "dp-fedavg",
    "privacy.unit": "client",
    "privacy.epsilon": REPORTED,
    "privacy.delta": DELTA,
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
    "runtime.checkpoint": False,
}
PRESET = dict(BASE)  # the preset's run: every client each round (q = 1), two rounds
SAMPLED = {**BASE, "privacy.sampling_rate": 0.2, "federation.rounds": 10}  # q = 0.2, ten rounds
LONG = {**BASE, "federation.rounds": 16}  # q = 1, sixteen rounds


# ------------------------------------------------------------------------------ the plants, one per step


def plant_clipping(monkeypatch, k: float) -> None:
    """Clipping: every update (the client's clip and the server's) clipped to k·C while the noise stays σ·C;
    k = ∞: not clipped at all."""
    factor = core_dp.clip_factor
    monkeypatch.setattr(core_dp, "clip_factor", lambda norm, c: 1.0 if math.isinf(k) else factor(norm, k * c))


def plant_noise(monkeypatch, k: float) -> None:
    """Noise: σ/k on the whole sum."""
    noise = core_dp.gaussian_noise
    monkeypatch.setattr(core_dp, "gaussian_noise", lambda shape, std, g: noise(shape, std / k, g))


def _partial(monkeypatch, k: float, less: Callable[[int, str], bool]) -> None:
    """Noise σ/k (none for k = ∞) on the tensors ``less`` picks (by position and name), σ on the others."""
    mean, noise = wrapper_dp.noised_mean, core_dp.gaussian_noise

    def partial(updates, **kw):
        names = iter(list(updates[0]) if updates else [])  # noised_mean draws the noise tensor by tensor, in order
        position = itertools.count()

        def some(shape, std, g):
            i, name = next(position), next(names)
            return noise(shape, std / k if less(i, name) else std, g)

        core_dp.gaussian_noise = some
        try:
            return mean(updates, **kw)
        finally:
            core_dp.gaussian_noise = noise

    monkeypatch.setattr(wrapper_dp, "noised_mean", partial)


def plant_partial_noise(monkeypatch, k: float) -> None:
    """Noise on part of the model: σ/k on every other tensor (none for k = ∞)."""
    _partial(monkeypatch, k, lambda i, _name: i % 2 == 1)


def plant_decoder_noise(monkeypatch, k: float) -> None:
    """Noise on part of the model: σ/k on the decoder's tensors (none for k = ∞), σ on the rest."""
    _partial(monkeypatch, k, lambda _i, name: name.startswith("decoder."))


def plant_sampling(monkeypatch, k: float) -> None:
    """Sampling: the client draw at k × the rate q that σ was solved, and ε reported, for."""
    draw = wrapper_dp.poisson_sample
    monkeypatch.setattr(wrapper_dp, "poisson_sample", lambda c, rate, rng: draw(c, min(1.0, k * rate), rng))


def plant_accounting(monkeypatch, k: float) -> None:
    """Accounting: σ solved for the rounds / k, and the ledger counting one round in k."""
    planned, record = wrapper_dp.DifferentialPrivacy.planned_releases, PrivacyLedger.record_release
    calls: dict[int, int] = {}

    def fewer(self: PrivacyLedger) -> float:
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] % int(k) == 0:
            return record(self)
        return self.epsilons[-1] if self.epsilons else 0.0

    monkeypatch.setattr(
        wrapper_dp.DifferentialPrivacy, "planned_releases", lambda self: max(1, planned(self) // int(k))
    )
    monkeypatch.setattr(PrivacyLedger, "record_release", fewer)


def true_epsilon(plant: str, k: float, sigma: float, rate: float, rounds: int) -> float:
    """The ε of the mechanism that ran (the run's RDP accountant, δ), from the σ and q it reports and the rounds it
    ran: clipping at k·C under noise σ·C is σ/k; σ/k on part of the model is σ/k for an update there (∞ without
    noise); sampling at min(1, k·q); accounting: σ over every round."""
    if plant in ("clipping", "noise", "partial", "decoder"):
        return math.inf if math.isinf(k) else epsilon_after(sigma / k, rate, rounds, DELTA)
    if plant == "sampling":
        return epsilon_after(sigma, min(1.0, k * rate), rounds, DELTA)
    return epsilon_after(sigma, rate, rounds, DELTA)


PLANTS = {
    "clipping": plant_clipping,
    "noise": plant_noise,
    "partial": plant_partial_noise,
    "decoder": plant_decoder_noise,
    "sampling": plant_sampling,
    "accounting": plant_accounting,
}


def _audit(tmp_path, values: dict, canaries: int) -> dict:
    from trustformer_lab.attack.client_dp_audit import audit

    return audit(load_config("tiny", None, {"out": str(tmp_path), **values}), canaries)


def _fails(result: dict, plant: str, k: float, setting: dict) -> None:
    """The accountant does not see the bug, the true ε is ≥ 4× the reported one, and the audit fails the run."""
    reported, mech = result["epsilon"], result["mechanism"]
    assert 0.95 <= reported <= REPORTED + 1e-6, result
    rounds = setting.get("federation.rounds", 2)
    truth = true_epsilon(plant, k, mech["noise_multiplier"], mech["sampling_rate"], rounds)
    assert truth >= 4 * reported, (plant, truth)
    assert result["epsilon_lb"] > reported, (plant, truth, result)


# ------------------------------------------------------------------------------ through a run (default tier)


@pytest.mark.parametrize("strategy", ["dp-fedavg", "dp-fedsam"])
def test_an_honest_run_keeps_its_epsilon(tmp_path, strategy):
    result = _audit(tmp_path, {**PRESET, "federation.strategy": strategy}, 500)
    assert 0.95 <= result["epsilon"] <= REPORTED + 1e-6
    assert result["released_rounds"] == 2 and result["canary_draw_rate"] == 1.0  # q = 1: every canary in, each round
    assert result["epsilon_lb"] <= result["epsilon"], result


@pytest.mark.parametrize(("plant", "install"), [("clipping", plant_clipping), ("decoder", plant_decoder_noise)])
def test_the_audit_fails_an_unbounded_bug(tmp_path, monkeypatch, plant, install):
    """Updates not clipped (a canary's norm is 10·C), or no noise on the decoder: 500 canaries fail the run."""
    install(monkeypatch, math.inf)
    _fails(_audit(tmp_path, PRESET, 500), plant, math.inf, PRESET)


# ------------------------------------------------------------------------------ the 4x plants (slow tier)


SLOW_PLANTS = [  # (plant, k, setting, canaries): the true ε of each is ≥ 4× the reported 1
    ("clipping", 4.0, PRESET, 2000),  # clipped at 4C: true ε 4.67
    ("noise", 4.0, PRESET, 2000),  # σ/4: true ε 4.67
    ("partial", 4.0, PRESET, 5000),  # σ/4 on every other tensor: true ε 4.67 for an update there
    ("decoder", 4.0, PRESET, 5000),  # σ/4 on the decoder's tensors: true ε 4.67 for an update there
    ("sampling", 5.0, SAMPLED, 2000),  # q = 0.2 drawn at 1: true ε 4.85
    ("accounting", 16.0, LONG, 2000),  # one round of 16 counted: true ε 4.67
]


@pytest.mark.slow
@pytest.mark.parametrize(("plant", "k", "setting", "canaries"), SLOW_PLANTS, ids=[p[0] for p in SLOW_PLANTS])
def test_the_audit_fails_a_bug_planted_in_each_step(tmp_path, monkeypatch, plant, k, setting, canaries):
    """About 4-8 s (q = 1, two rounds) to 30 s (sixteen rounds) each."""
    PLANTS[plant](monkeypatch, k)
    _fails(_audit(tmp_path, setting, canaries), plant, k, setting)


@pytest.mark.slow
def test_honest_runs_seldom_fail_the_audit(tmp_path):
    """The false alarms the bound's 95% confidence allows, over 20 honest runs (their own seeds, OS noise and
    canary coins): at most 3, the count above which has probability < 5% at a rate of 5%. About 80 s."""
    import functools

    from trustformer_lab.attack.client_dp_audit import audit
    from trustformer_lab.attack.dp_audit import honest_benchmark

    cfg = load_config("tiny", None, {"out": str(tmp_path), **PRESET})
    bench = honest_benchmark(cfg, 20, plain=False, auditor=functools.partial(audit, canaries=2000))
    (row,) = bench["rows"]
    assert row["failures"] <= 3, row
    assert row["epsilon_lb_mean"] < 0.6 * row["epsilon_spent_mean"], row


# ------------------------------------------------------------------------------ the canaries' path through the wrapper


def _wrapper(tmp_path, values: dict, hook=None) -> wrapper_dp.DifferentialPrivacy:
    """The run's DP wrapper (made while ``hook`` is planted), its server begun for 3 clients."""
    cfg = load_config("tiny", None, {**BASE, "out": str(tmp_path), **values})
    if hook is None:
        protocol = make_protocol(cfg)
    else:
        with wrapper_dp.client_canaries(hook):
            protocol = make_protocol(cfg)
    while not isinstance(protocol, wrapper_dp.DifferentialPrivacy):
        protocol = protocol.inner
    return begin_server(protocol, {"w": torch.zeros(1)})


def _updates(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"a": 0.1 * torch.randn(40, generator=g), "b": 0.1 * torch.randn(3, 4, generator=g)} for _ in range(n)]


def _canaries(count: int, included: bool | None = True, norm: float = 5.0):
    from trustformer_lab.attack.client_dp_audit import ClientCanaries

    hook = ClientCanaries(count, 0, norm)
    if included is not None:
        hook.included = (included,) * count
    return hook


def _projections(hook, release: dict[str, torch.Tensor], scale: float) -> list[float]:
    """⟨release · scale, u_i⟩ of every canary (scale: the denominator qN, undoing the mean)."""
    layout = hook.layout
    return [
        float((release[n].double().reshape(-1)[layout.blocks[n][j]] * layout.directions[n][j]).sum()) * scale
        for n, j in zip(layout.tensor, layout.slot, strict=True)
    ]


def test_canaries_are_drawn_by_the_wrappers_draw_at_its_rate(tmp_path, monkeypatch):
    """One Poisson draw per round over the real clients and the canaries in, at the run's rate q: the sampling plant
    then reaches the canaries too. A canary drawn apart (its own coin per round) would make this fail."""
    calls = []
    draw = wrapper_dp.poisson_sample

    def spy(candidates, rate, rng):
        calls.append((list(candidates), rate))
        return draw(candidates, rate, rng)

    monkeypatch.setattr(wrapper_dp, "poisson_sample", spy)
    hook = _canaries(8, included=None)
    inside = [i for i, c in enumerate(hook.included) if c]
    dp = _wrapper(tmp_path, {"privacy.sampling_rate": 0.5}, hook)
    for rnd in range(1, 41):
        assert set(dp.participants(rnd, [0, 1, 2], True).clients) <= {0, 1, 2}
        assert set(hook.drawn[rnd]) <= set(inside)
    from trustformer_lab.attack.client_dp_audit import FIRST_CANARY

    assert all(c == ([0, 1, 2, *(FIRST_CANARY + i for i in inside)], 0.5) for c in calls), calls[0]
    assert abs(hook.draw_rate() - 0.5) <= 4 * math.sqrt(0.25 / (40 * len(inside))), hook.draw_rate()
    plant_sampling(monkeypatch, 2.0)
    dp.participants(41, [0, 1, 2], True)
    assert sorted(hook.drawn[41]) == inside  # drawn at 1: every canary in


def test_a_canary_is_clipped_by_the_wrappers_clipping(tmp_path, monkeypatch):
    """Without noise, a drawn canary of norm 10·C adds exactly C·u_i to the sum: clipped. The clipping plant at 3C
    lets 3C through; a client that skips its clip is clipped again by the server (the wrapper clips twice), so the
    canary, clipped by both, shows that too."""
    values = {"privacy.noise_multiplier": 0.0, "privacy.on_exceed": "continue"}
    hook = _canaries(6)
    dp = _wrapper(tmp_path, values, hook)
    zeros = [{n: torch.zeros_like(t) for n, t in u.items()} for u in _updates(3)]  # nothing but the canaries
    dp.participants(1, [0, 1, 2], True)
    release = dp.aggregate(1, zeros, [1, 1, 1]).tensors
    assert _projections(hook, release, 3.0) == pytest.approx([0.5] * 6, rel=1e-5)
    with pytest.MonkeyPatch.context() as patch:
        plant_clipping(patch, 3.0)
        dp.participants(2, [0, 1, 2], True)
        release = dp.aggregate(2, zeros, [1, 1, 1]).tensors
    assert _projections(hook, release, 3.0) == pytest.approx([1.5] * 6, rel=1e-5)
    monkeypatch.setattr(wrapper_dp.DifferentialPrivacy, "clip_update", lambda self, u: (u, 0.0, "update_norm"))
    dp.participants(3, [0, 1, 2], True)
    release = dp.aggregate(3, zeros, [1, 1, 1]).tensors
    assert _projections(hook, release, 3.0) == pytest.approx([0.5] * 6, rel=1e-5)


def test_canaries_are_summed_and_noised_as_clients(tmp_path):
    """With the noise seeded, a round with canaries releases bit for bit what the wrapper releases for the real
    payloads followed by the canaries' clipped updates as payloads: the canaries are clients to it, one noise for
    all. With every canary out, draws and releases are those of a run without canaries."""
    values = {"privacy.noise_source": "seeded-not-private", "privacy.sampling_rate": 0.7}
    hook = _canaries(5)
    planted, plain = _wrapper(tmp_path, values, hook), _wrapper(tmp_path, values)
    real = _updates(3, seed=1)
    for rnd in range(1, 6):
        chosen = planted.participants(rnd, [0, 1, 2], True).clients
        if not chosen or not hook.drawn[rnd]:
            continue
        release = planted.aggregate(rnd, real[: len(chosen)], [1] * len(chosen)).tensors
        updates = [hook.layout.update(i, hook.norm, hook._zeros) for i in hook.drawn[rnd]]
        canary_payloads = [plain.clip_update(u)[0] for u in updates]
        expected = plain.aggregate(rnd, real[: len(chosen)] + canary_payloads, [1] * 8).tensors
        assert all(torch.equal(release[n], expected[n]) for n in expected)
        break
    else:
        pytest.fail("no round drew both real clients and canaries")
    out = _canaries(5, included=False)
    with_out, without = _wrapper(tmp_path, values, out), _wrapper(tmp_path, values)
    for rnd in range(1, 6):
        chosen = with_out.participants(rnd, [0, 1, 2], True).clients
        assert chosen == without.participants(rnd, [0, 1, 2], True).clients
        if chosen:
            a = with_out.aggregate(rnd, real[: len(chosen)], [1] * len(chosen)).tensors
            b = without.aggregate(rnd, real[: len(chosen)], [1] * len(chosen)).tensors
            assert all(torch.equal(a[n], b[n]) for n in a)


def test_canary_directions_are_orthonormal_and_spread_over_every_tensor():
    from trustformer_lab.attack.client_dp_audit import CanaryLayout, spread

    assert spread(10, [2, 100, 100]) == [2, 4, 4] and sum(spread(203, [3, 100, 100])) == 203
    with pytest.raises(ValueError):
        spread(11, [5, 5])
    like = {"a": torch.zeros(40), "b": torch.zeros(3, 4), "c": torch.zeros(2)}
    layout = CanaryLayout.place(like, 20, seed=3)
    assert sorted(set(layout.tensor)) == ["a", "b", "c"]
    vectors = torch.stack(
        [
            torch.cat([layout.update(i, 1.0, {}).get(n, torch.zeros_like(t)).reshape(-1) for n, t in like.items()])
            for i in range(20)
        ]
    ).double()
    torch.testing.assert_close(vectors @ vectors.T, torch.eye(20, dtype=torch.float64), atol=1e-6, rtol=0)
    total = {n: torch.zeros_like(t) for n, t in like.items()}
    total["b"] = layout.update(layout.tensor.index("b"), 2.0, total)["b"]
    scores = layout.scores(total)
    assert scores[layout.tensor.index("b")] == pytest.approx(1.0) and abs(scores).sum() == pytest.approx(1.0)


def test_the_quiet_pool_finds_tensors_with_less_noise_from_the_scores_alone():
    """The pool of tensors whose scores spread least: the tensors where a plant cut the noise, none in an honest run;
    and the bound's split of the level among its guess sets does not depend on which canaries the pool holds."""
    import numpy as np

    from trustformer_lab.attack.audit import one_run_epsilon_lower_bound
    from trustformer_lab.attack.client_dp_audit import quiet_pool

    rng = np.random.default_rng(0)
    tensors = [f"t{i // 50}" for i in range(2000)]
    included = rng.random(2000) < 0.5
    noise = np.where(np.arange(2000) // 50 % 2 == 1, 0.25, 1.0)  # σ/4 on every other tensor
    scores = 0.25 * included + noise * rng.standard_normal(2000)
    pool = quiet_pool(scores, tensors)
    assert np.array_equal(pool, noise < 1)
    assert not quiet_pool(0.25 * included + rng.standard_normal(2000), tensors).any()
    groups = [["a" if i < 1000 else "b" for i in range(2000)]]
    pooled = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=groups, target=1.0, pools=[pool])
    other = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=groups, target=1.0, pools=[~pool])
    plain = one_run_epsilon_lower_bound(scores, included, DELTA, groupings=groups, target=1.0)
    assert pooled["tried"] == other["tried"] == plain["tried"] + 3
    assert pooled["group"] == "pool 0" and pooled["epsilon_lb"] > 1.0 > plain["epsilon_lb"], (pooled, plain)
