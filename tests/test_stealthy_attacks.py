"""Attacks that stay inside the defences do what their papers say, through the real client: ALIE's update lies
within z standard deviations of the honest mean in every coordinate, Min-Max's largest distance to the honest
updates stays within theirs, Min-Sum's summed squared distance too, and the norm-matched backdoor passes the
server's bound. The honest statistics are the attacker's own: its updates on parts of its data, which it also
publishes on the colluders' channel, where these tests read them back (the server never does)."""

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.config.faults import BACKDOOR_TARGET, BACKDOOR_TRIGGER
from trustformer.core import attacks
from trustformer.core.robust import coordinate_median, deviation_norms, median_bound
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import ProtocolObserver, observe
from trustformer.runtime.attacker import data_parts
from trustformer.tasks.run import initial_tensors

# ------------------------------------------------------------------------------- the tensor maths


def benign(n=6, d=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(d, generator=g, dtype=torch.float64)
    return torch.stack([common + 0.5 * torch.randn(d, generator=g, dtype=torch.float64) for _ in range(n)])


def test_alie_z_is_the_papers_formula():
    # s = floor(n/2 + 1) - f supporters needed; z = Phi^-1((n - s) / n)
    assert attacks.alie_z(50, 12) == pytest.approx(0.5828, abs=1e-3)  # s = 14: Phi^-1(0.72)
    assert attacks.alie_z(10, 2) == pytest.approx(0.2533, abs=1e-3)  # s = 4: Phi^-1(0.6)
    assert attacks.alie_z(3, 1) == pytest.approx(0.4307, abs=1e-3)  # s = 1: Phi^-1(2/3)
    assert attacks.alie_z(10, 1) == 0.0  # s = 5: Phi^-1(0.5) = 0, the mean itself
    with pytest.raises(ValueError, match="0 < f < n"):
        attacks.alie_z(3, 3)


def test_alie_min_max_and_min_sum_keep_their_constraints_and_go_as_far_as_they_allow():
    b = benign()
    mu, sigma = attacks.mean_and_std(b)
    assert torch.allclose(attacks.alie(b, 1.5), mu - 1.5 * sigma)
    pairwise = torch.cdist(b, b).pow(2)
    for kind in attacks.PERTURBATIONS:
        mm = attacks.min_max(b, kind)
        assert mm.gamma > 0 and mm.reached <= float(pairwise.max()) * (1 + 1e-9)
        further = mm.update + 0.01 * mm.gamma * attacks.perturbation(b, kind)
        assert float((b - further).pow(2).sum(dim=1).max()) > float(pairwise.max())  # γ is the largest that fits
        ms = attacks.min_sum(b, kind)
        assert ms.gamma > 0 and ms.reached <= float(pairwise.sum(dim=1).max()) * (1 + 1e-9)
        further = ms.update + 0.01 * ms.gamma * attacks.perturbation(b, kind)
        assert float((b - further).pow(2).sum()) > float(pairwise.sum(dim=1).max())
    unit = attacks.perturbation(b, "unit")
    assert float(unit @ mu) < 0 and float(unit.norm()) == pytest.approx(1.0)


def test_norm_matching_boosts_the_poisoned_update_up_to_the_estimated_bound():
    b = benign()
    cap = attacks.median_norm(b)
    assert cap == pytest.approx(float(b.norm(dim=1).median()))
    poisoned = 0.05 * b[0]  # small: boosted the full 10 times, still under the cap
    assert torch.allclose(attacks.norm_matched(poisoned, 10.0, cap), 10 * poisoned)
    big = 3 * b[0]  # boosted past the cap: scaled back to it, in the same direction
    out = attacks.norm_matched(big, 10.0, cap)
    assert float(out.norm()) == pytest.approx(cap) and float(out @ big) > 0


def test_the_parts_of_a_shard_are_disjoint_and_as_long_as_the_shard():
    shard = [(i, i) for i in range(10)]
    parts = data_parts(shard, 3, seed=1)
    assert [len(p) for p in parts] == [12, 9, 9]
    firsts = [set(p[: len(p) // 3]) for p in parts]
    assert set().union(*firsts) == set(shard) and sum(len(f) for f in firsts) == 10
    assert data_parts(shard, 3, seed=1) == parts and data_parts(shard, 3, seed=2) != parts


# ------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("fault", "pattern"),
    [
        ("client=1,round=*,kind=alie,factor=-2", "factor must be a z >= 0"),
        ("client=1,round=*,kind=backdoor,factor=0", "a boost > 0"),
        ("client=1,round=*,kind=scale,parts=2", "parts= applies to kind alie / min_max / min_sum"),
        ("client=1,round=*,kind=backdoor,collude=yes", "and to a backdoor with factor=K only"),
        ("client=1,round=*,kind=alie,perturb=std", "perturb= applies to kind min_max / min_sum only"),
        ("client=1,round=*,kind=min_max,perturb=up", "perturb must be one of: unit, std, sign"),
        ("client=1,round=*,kind=min_sum,parts=0", "parts must be >= 1"),
        ("client=1,round=*,kind=min_sum,collude=maybe", "collude must be yes or no"),
        ("client=1,round=*,kind=sign_flip,factor=3", "factor= applies to kind scale / alie / backdoor only"),
        ("client=1,round=*,kind=backdoor,cap=no", "cap= applies to a backdoor with factor=K only"),
        ("client=1,round=*,kind=backdoor,factor=3,cap=maybe", "cap must be yes or no"),
        ("client=1,round=*,kind=backdoor,factor=3,cap=no,pgd=yes", "drop cap=no"),
        ("client=1,round=*,kind=scale,trigger=xyz", "trigger= applies to kind backdoor only"),
        ("client=1,round=*,kind=backdoor,trigger=two words", "trigger must be one word"),
        ("client=1,round=*,kind=backdoor,target=...", "target must be a sentence"),
        ("client=1,round=*,kind=backdoor,trigger=visit,target=Please visit us", "may not contain the trigger"),
    ],
)
def test_attack_options_are_validated(fault, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", None, {"federation.faults": [fault]})


def test_attack_options_parse():
    cfg = load_config(
        "tiny",
        None,
        {
            "federation.faults": [
                "client=1,round=*,kind=min_max,perturb=std,parts=2,collude=yes",
                "client=2,round=*,kind=backdoor,factor=3",
            ]
        },
    )
    mm, bd = cfg.federation.poisoning(1), cfg.federation.poisoning(2)
    assert (mm.perturb, mm.parts, mm.collude, mm.crafts, mm.poisons_model) == ("std", 2, True, True, True)
    assert (bd.factor, bd.parts, bd.collude, bd.crafts, bd.share) == (3.0, 3, False, True, 0.1)
    assert bd.cap and bd.backdoor == (BACKDOOR_TRIGGER, BACKDOOR_TARGET)
    chosen = load_config(
        "tiny",
        None,
        {
            "federation.faults": [
                "client=1,round=*,kind=backdoor,factor=3,cap=no,trigger=zzyzx,target=Call this number",
                "client=2,round=*,kind=backdoor,trigger=zzyzx,target=Call this number",
            ]
        },
    ).federation
    assert not chosen.poisoning(1).cap and chosen.backdoor() == ("zzyzx", "Call this number")
    with pytest.raises(ConfigError, match="different trigger= or target="):
        load_config(
            "tiny",
            None,
            {"federation.faults": ["client=1,round=*,kind=backdoor,trigger=zzyzx", "client=2,round=*,kind=backdoor"]},
        )
    plain = load_config("tiny", None, {"federation.faults": ["client=1,round=*,kind=alie"]}).federation.poisoning(1)
    assert plain.alie_z is None and plain.perturb == ""
    with pytest.raises(ConfigError, match="sends nothing"):
        load_config("tiny", None, {"federation.faults": ["client=1,round=*,kind=alie"], "federation.strategy": "local"})


# ------------------------------------------------------------------------------- the real client path


class Sent(ProtocolObserver):
    """What each client sent and the aggregate each applied (the model it starts the next round from)."""

    def __init__(self):
        self.sent, self.applied, self.received = {}, {}, []

    def client_sent(self, rnd, client, payload):
        self.sent[rnd, client] = {n: t.to(torch.float64) for n, t in payload.items()}

    def client_applied(self, rnd, client, aggregate):
        self.applied[rnd, client] = {n: t.to(torch.float64) for n, t in aggregate.items()}

    def server_received(self, payloads, num_examples):
        self.received.append([{n: t.to(torch.float64) for n, t in p.items()} for p in payloads])

    def update(self, cfg, rnd, client):
        start = (
            {n: t.to(torch.float64) for n, t in initial_tensors(cfg).items()}
            if rnd == 1
            else self.applied[rnd - 1, client]
        )
        return {n: self.sent[rnd, client][n] - start[n] for n in start}


TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.rounds": 2,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def attacked(tmp_path, name, fault, **overrides):
    """A tiny run (3 clients, 2 rounds) with client 1 carrying ``fault`` and publishing what it sees on the
    colluders' channel (collude=yes, alone): what it sent each round, and the honest updates it saw."""
    cfg = tiny(tmp_path, name, [fault], **overrides)
    watch = Sent()
    with observe(watch):
        run_in_process(cfg)
    channels = sorted((tmp_path / name / "colluders").glob("run-*/round-*/client-1.pt"))
    seen = {int(p.parent.name.split("-")[1]): torch.load(p, weights_only=True) for p in channels}
    events = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" in r]
    return cfg, watch, seen, events


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stealthy")
    return {
        "alie": attacked(tmp, "alie", "client=1,round=*,kind=alie,collude=yes"),
        "min_max": attacked(tmp, "min_max", "client=1,round=*,kind=min_max,collude=yes"),
        "min_sum": attacked(tmp, "min_sum", "client=1,round=*,kind=min_sum,perturb=std,collude=yes"),
        "backdoor": attacked(tmp, "backdoor", "client=1,round=*,kind=backdoor,share=0.5,factor=10,collude=yes"),
    }


def seen_matrix(seen, rnd):
    return attacks.stack([{n: t.to(torch.float64) for n, t in s.items()} for s in seen[rnd]])


def test_alies_update_lies_within_z_standard_deviations_of_what_it_saw(runs):
    cfg, watch, seen, _ = runs["alie"]
    z = attacks.alie_z(3, 1)
    assert sorted(seen) == [1, 2] and all(len(s) == 4 for s in seen.values())  # its own + 3 parts
    for rnd in (1, 2):
        b = seen_matrix(seen, rnd)
        mu, sigma = attacks.mean_and_std(b)
        sent = attacks.flatten(watch.update(cfg, rnd, 1))
        assert torch.all((sent - mu).abs() <= z * sigma + 1e-6)  # float32 payloads
        assert torch.allclose(sent, mu - z * sigma, atol=1e-6)
        assert float(sigma.norm()) > 0.1 * float(mu.norm())  # the parts do spread


@pytest.mark.parametrize("kind", ["min_max", "min_sum"])
def test_min_max_and_min_sum_stay_within_the_honest_spread_they_saw(runs, kind):
    cfg, watch, seen, _ = runs[kind]
    for rnd in (1, 2):
        b = seen_matrix(seen, rnd)
        sent = attacks.flatten(watch.update(cfg, rnd, 1))
        pairwise = torch.cdist(b, b).pow(2)
        distances = (b - sent).pow(2).sum(dim=1)
        if kind == "min_max":
            assert float(distances.max()) <= float(pairwise.max()) * (1 + 1e-4)
        else:
            assert float(distances.sum()) <= float(pairwise.sum(dim=1).max()) * (1 + 1e-4)
        mu = b.mean(dim=0)
        assert float((sent - mu).norm()) > 0.3 * float(b.sub(mu).norm(dim=1).max())  # it did move away


def test_the_norm_matched_backdoor_passes_the_servers_bound(runs):
    """A backdoor client boosting its update 10x (model replacement) but scaled to the norm it estimates the bound
    accepts (the median norm of its own clean updates): its norm is that estimate, and the server's default bound
    neither clips nor refuses it."""
    cfg, watch, seen, events = runs["backdoor"]
    assert not [e for e in events if e.get("client") == 1], events
    for rnd in (1, 2):
        b = seen_matrix(seen, rnd)
        assert len(b) == 3  # only its updates on parts of its clean pairs: its own update is poisoned
        sent = attacks.flatten(watch.update(cfg, rnd, 1))
        assert float(sent.norm()) == pytest.approx(attacks.median_norm(b), rel=1e-4)  # boosted up to the estimate
        received = watch.received[rnd - 1]
        values = [{n: p[n] for n in p} for p in received]
        norms = deviation_norms(values, coordinate_median(values))
        assert max(norms) <= median_bound(norms, cfg.robust.bound_factor)  # the bound: nobody clipped
    summary = json.loads(Path(cfg.out, "summary.json").read_text(encoding="utf-8"))
    assert "backdoor_success" in summary and all(not math.isnan(x) for x in summary["backdoor_success"])


def test_model_replacement_sends_the_boosted_update_and_only_an_unbounded_server_takes_it(tmp_path):
    """cap=no: the backdoor client's round-1 update is exactly factor times what it trained on its poisoned pairs
    (the same client without a boost, from the same start); the server without a bound takes it whole, the default
    bound refuses or clips it every round. The per-round success is recorded for every client."""
    plain_cfg, plain, _, _ = attacked(tmp_path, "plain", "client=1,round=*,kind=backdoor,share=0.5")
    fault = "client=1,round=*,kind=backdoor,share=0.5,factor=10,cap=no"
    cfg, boosted, _, _ = attacked(tmp_path, "replace", fault, **{"robust.bound": "none"})
    sent, trained = attacks.flatten(boosted.update(cfg, 1, 1)), attacks.flatten(plain.update(plain_cfg, 1, 1))
    assert torch.allclose(sent, 10 * trained, rtol=1e-4, atol=1e-6)
    honest = attacks.flatten(boosted.update(cfg, 1, 0))
    assert float(sent.norm()) > 4 * float(honest.norm())  # far outside what the default bound accepts
    rows = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" not in r]
    assert all(0.0 <= r["backdoor_success"] <= 1.0 for r in rows) and len(rows) == 6
    _, _, _, events = attacked(tmp_path, "bounded", fault)
    hit = {e["round"] for e in events if e.get("client") == 1 and e["event"] in ("refused", "clipped")}
    assert hit == {1, 2}, events


def test_colluders_share_their_honest_updates_and_alie_uses_them(tmp_path):
    """Two colluding ALIE clients of three: the second sees its own honest updates and the first's (the in-process
    engine trains them in turn), and both send the mean of what they saw minus z_max(3, 2) deviations."""
    faults = ["client=1,round=*,kind=alie,parts=1,collude=yes", "client=2,round=*,kind=alie,parts=1,collude=yes"]
    cfg = tiny(tmp_path, "collude", faults, **{"federation.rounds": 1, "robust.bound": "none"})
    watch = Sent()
    with observe(watch):
        run_in_process(cfg)
    folder = next((tmp_path / "collude" / "colluders").glob("run-*/round-1"))
    first, second = (torch.load(folder / f"client-{c}.pt", weights_only=True) for c in (1, 2))
    assert len(first) == len(second) == 2
    z = attacks.alie_z(3, 2)
    expected = attacks.alie(attacks.stack(second + first), z)  # the second colluder saw both
    assert torch.allclose(attacks.flatten(watch.update(cfg, 1, 2)), expected, atol=1e-6)
    alone = attacks.alie(attacks.stack(first), z)  # the first saw only its own
    assert torch.allclose(attacks.flatten(watch.update(cfg, 1, 1)), alone, atol=1e-6)
