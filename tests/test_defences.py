"""The defences on updates (robust.aggregator = fltrust, flame, clip_noise) stop their planted attack in a real tiny
federation, and the same test fails when the defence is replaced by a pass-through that keeps every update with
equal weight. Also: their pure functions on tensors, the configurations they refuse, and their checkpointed state."""

from functools import partial

import numpy as np
import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import defences
from trustformer.core.defences import DefenceResult
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import make_protocol
from trustformer.protocols.interface.state import load_server_state, server_state
from trustformer.protocols.wrappers import robust as robust_wrapper

# ------------------------------------------------------------------------------- the rules on tensors


def updates(n=5, d=30, seed=0, flipped=()):
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(d, generator=g, dtype=torch.float64)
    rows = [common + 0.3 * torch.randn(d, generator=g, dtype=torch.float64) for _ in range(n)]
    for i in flipped:
        rows[i] = -5 * rows[i]
    return torch.stack(rows), common


def test_fltrust_trusts_by_cosine_and_rescales_to_the_servers_norm():
    u, common = updates(flipped=(2,))
    server = 0.5 * common
    out = defences.fltrust(u, server)
    assert out.kept == [True, True, False, True, True] and out.weights[2] == 0.0
    assert sum(out.weights) == pytest.approx(1.0)
    for i in (0, 1, 3, 4):  # each rescaled to ||g_0||
        assert float((u[i] * out.scales[i]).norm()) == pytest.approx(float(server.norm()))
    assert float(out.update.norm()) <= float(server.norm()) + 1e-9  # a convex combination of vectors of that norm
    none = defences.fltrust(-u.abs(), torch.ones(30, dtype=torch.float64))
    assert not any(none.kept) and float(none.update.abs().sum()) == 0.0  # no trust: the global model stays


def test_flame_keeps_the_majority_cluster_clips_to_the_median_and_adds_seeded_noise():
    u, _ = updates(n=7, flipped=(1, 4))
    out = defences.flame(u, 0.0, torch.Generator().manual_seed(0))
    kept = [i for i, k in enumerate(out.kept) if k]
    # at most one cluster (min_cluster_size > n/2): HDBSCAN's single-cluster labelling keeps the updates that stay
    # in it to its end, about the n/2 + 1 densest; the flipped ones are never among them
    assert 1 not in kept and 4 not in kept and len(kept) >= 7 // 2 + 1
    bound = defences.median_of(u.norm(dim=1).tolist())
    assert out.info["bound"] == pytest.approx(bound)
    expected = sum(u[i] * min(1.0, bound / float(u[i].norm())) for i in kept) / len(kept)
    assert torch.allclose(out.update, expected)
    a = defences.flame(u, 0.01, torch.Generator().manual_seed(3)).update
    b = defences.flame(u, 0.01, torch.Generator().manual_seed(3)).update
    c = defences.flame(u, 0.01, torch.Generator().manual_seed(4)).update
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float((a - expected).std()) == pytest.approx(0.01 * bound, rel=0.5)


def test_majority_cluster_is_hdbscans_largest():
    pts = np.array([[0.0], [0.1], [0.2], [0.15], [0.05], [5.0], [5.1]])
    dist = np.abs(pts - pts.T)
    kept = defences.majority_cluster(dist, 4)
    assert set(kept) <= {0, 1, 2, 3, 4} and len(kept) >= 4
    assert defences.majority_cluster(np.zeros((1, 1)), 1) == [0]


def test_clip_and_noise_bounds_every_update():
    u, _ = updates(flipped=(0,))
    out = defences.clip_and_noise(u, [1, 1, 1, 1, 1], 0.0, 0.0, torch.Generator().manual_seed(0))
    bound = defences.median_of(u.norm(dim=1).tolist())
    assert out.scales[0] < 0.5 and all(float((u[i] * out.scales[i]).norm()) <= bound + 1e-9 for i in range(5))
    fixed = defences.clip_and_noise(u, [1, 3, 1, 1, 1], 2.0, 0.0, torch.Generator().manual_seed(0))
    assert fixed.info["bound"] == 2.0 and fixed.weights[1] == pytest.approx(3 / 7)


# ------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("rule", ["fltrust", "flame", "clip_noise"])
def test_defences_on_updates_are_refused_where_the_server_cannot_see_updates(rule):
    with pytest.raises(ConfigError, match=f"robust.aggregator = '{rule}' cannot run under secure.mode = 'secagg'"):
        load_config("tiny", None, {"robust.aggregator": rule, "secure.mode": "secagg"})
    with pytest.raises(ConfigError, match=f"robust.aggregator = '{rule}' does not apply to"):
        load_config("tiny", None, {"robust.aggregator": rule, "federation.strategy": "dp-fedavg"})
    with pytest.raises(ConfigError, match="only where each payload is a whole model"):  # at load, not at build
        load_config("tiny", None, {"robust.aggregator": rule, "federation.strategy": "trustformer"})
    with pytest.raises(ConfigError, match="robust.noise_factor"):
        load_config("tiny", None, {"robust.aggregator": rule, "robust.noise_factor": -1.0})


def test_fltrust_needs_root_data_the_image_tasks_lack(tmp_path):
    """Refused when the configuration loads, not when the server first trains on its root data."""
    with pytest.raises(ConfigError, match="robust.aggregator = 'fltrust' needs root data.*choose another"):
        load_config("tiny", None, {"task": "image-classification", "robust.aggregator": "fltrust"})


def test_the_defences_state_is_checkpointed_and_restored():
    cfg = load_config("tiny", None, {"robust.aggregator": "flame"})
    protocol = make_protocol(cfg)
    wrapper = protocol
    while not isinstance(wrapper, robust_wrapper.RobustAggregation):
        wrapper = wrapper.inner
    wrapper._aggregations, wrapper._root_optimizer = 4, {"state": {}, "param_groups": []}
    saved = server_state(protocol)
    fresh = make_protocol(cfg)
    load_server_state(fresh, saved)
    restored = fresh
    while not isinstance(restored, robust_wrapper.RobustAggregation):
        restored = restored.inner
    assert restored._aggregations == 4 and restored._root_optimizer == {"state": {}, "param_groups": []}


# ------------------------------------------------------------------------------- the real path (tiny runs)

PLANTED = ["client=1,round=*,kind=scale,factor=-10"]  # a boosted, flipped update: what each rule must contain


TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.rounds": 3,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "robust.bound": "none",  # the rule alone
}
tiny = partial(tiny_config, defaults=TINY)


def loss_and_events(cfg):
    summary = run_in_process(cfg)
    events = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" in r]
    honest = [loss for c, loss in zip(summary["client_ids"], summary["test_loss"], strict=True) if c != 1]
    return sum(honest) / len(honest), events


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("defences")
    return {
        "honest": loss_and_events(tiny(tmp, "honest"))[0],
        "undefended": loss_and_events(tiny(tmp, "undefended", PLANTED))[0],
    }


def pass_through(updates, *args, **kwargs):
    """A defence that keeps every update with equal weight, unscaled, and adds nothing: the plain mean."""
    n = len(updates)
    return DefenceResult(updates.mean(dim=0), [1.0 / n] * n, [1.0] * n, [True] * n)


RULES = {"fltrust": "fltrust", "flame": "flame", "clip_noise": "clip_and_noise"}
EXPECTED_EVENT = {"fltrust": "refused", "flame": "excluded", "clip_noise": "clipped"}


def stops_the_attack(rule, loss, events, reference):
    """What each rule must achieve against the planted attacker: an event against client 1 in every round (refused
    by FLTrust, left out by FLAME, clipped by clip_noise), no honest client refused or left out, and the honest
    clients' test loss near the honest run's (FLTrust, FLAME), or for clip_noise, which only bounds the attacker to
    an honest-sized flipped update that still pulls back, closer to the honest run's than to the undefended one's."""
    against = [(e["round"], e["event"]) for e in events if e["client"] == 1]
    assert against == [(r, EXPECTED_EVENT[rule]) for r in (1, 2, 3)], events
    assert not [e for e in events if e["client"] != 1 and e["event"] in ("refused", "excluded")], events
    assert reference["undefended"] > reference["honest"] + 1.0, reference  # the attack does poison
    if rule == "clip_noise":
        assert loss < (reference["honest"] + reference["undefended"]) / 2, (loss, reference)
    else:
        assert loss < reference["honest"] + 0.3, (loss, reference)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("variant", ["defence", "pass-through"])
def test_each_defence_stops_its_planted_attack_and_a_pass_through_does_not(
    tmp_path, monkeypatch, reference, rule, variant
):
    if variant == "pass-through":
        monkeypatch.setattr(robust_wrapper, RULES[rule], pass_through)
    loss, events = loss_and_events(tiny(tmp_path, rule, PLANTED, **{"robust.aggregator": rule}))
    if variant == "defence":
        stops_the_attack(rule, loss, events, reference)
    else:
        with pytest.raises(AssertionError):
            stops_the_attack(rule, loss, events, reference)
