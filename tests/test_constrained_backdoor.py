"""Constrained backdoors (federation.faults: backdoor with pgd=yes, mask=R): the projection of projected gradient
descent (Sun et al. 2019; Wang et al. 2020) and Neurotoxin's mask (Zhang et al. 2022) against their definitions, the
attacker's step keeping every iterate inside its constraint, and the options refused where they do not apply."""

import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import attacks
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols.interface.base import ClientSession
from trustformer.runtime.attacker import Constraint, constrained_step


def test_the_projection_keeps_the_norm_bound_and_turns_toward_the_reference():
    g = torch.Generator().manual_seed(0)
    reference = torch.randn(50, generator=g, dtype=torch.float64)
    away = -reference + 0.3 * torch.randn(50, generator=g, dtype=torch.float64)
    out = attacks.projected(away * 10, norm_cap=2.0, reference=reference, min_cosine=0.6)
    assert float(out.norm()) == pytest.approx(2.0)
    assert float(out @ reference / (out.norm() * reference.norm())) == pytest.approx(0.6)
    inside = 0.1 * reference
    assert torch.equal(attacks.projected(inside, 2.0, reference, 0.6), inside)  # already inside: unchanged
    assert torch.equal(attacks.projected(away, 1e9, None, 0.6), away)  # no reference: the norm alone


def test_neurotoxin_leaves_the_top_share_of_the_last_global_update_alone():
    last = torch.tensor([0.1, -5.0, 0.0, 3.0, -0.2, 0.05, 1.0, 0.0, 0.3, -0.4])
    mask = attacks.neurotoxin_mask(last, 0.2)
    assert mask.tolist() == [1, 0, 1, 0, 1, 1, 1, 1, 1, 1]  # the two largest magnitudes, -5 and 3
    assert attacks.neurotoxin_mask(last, 0.0).sum() == 10


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(6))

    def loss(self, src, tgt, label_smoothing=0.0):
        return ((self.w - tgt) ** 2).sum(), 1


def test_every_step_of_the_attack_stays_inside_its_constraint():
    """Projected gradient descent toward a target far outside the bounds: after every step the update from the
    round's start has norm ≤ the cap, cosine ≥ the bound with the reference, and nothing on masked coordinates."""
    model = Linear()
    start = {"w": torch.zeros(6)}
    reference = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    mask = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])}
    constraint = Constraint(start, mask, True, 0.5, reference, 0.8)
    session = ClientSession(cfg=None, client=1, round=2, model=model, num_examples=1, initial_tensors=dict)
    session.label_smoothing = 0.0
    step = constrained_step(session, constraint)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    target = torch.tensor([0.0, 0.0, 5.0, -5.0, 5.0, 5.0])  # the backdoor: orthogonal to the honest direction
    for _ in range(20):
        step(model, optimizer, None, target)
        update = model.w.detach().double()
        assert float(update.norm()) <= 0.5 + 1e-6  # float32 weights
        assert float(update @ reference / (update.norm() * reference.norm())) >= 0.8 - 1e-6
        assert update[5] == 0  # Neurotoxin's mask
    assert float(update[2:5].abs().sum()) > 0.1  # and it still moved toward its target where it may


def _events(cfg):
    rows = jsonl(f"{cfg.out}/metrics.jsonl")
    return [(e["round"], e["event"]) for e in rows if e.get("client") == 1 and "event" in e]


def test_the_constrained_backdoor_runs_through_the_real_path(tmp_path):
    """A tiny federation with the default update bound and a strict direction check (robust.min_cosine = 0.8): the
    unconstrained boosted backdoor is refused in every round; projected descent passes round 1, where its own
    honest samples estimate the honest direction well (later rounds: docs/robustness.md)."""
    faults = {
        "plain": "client=1,round=*,kind=backdoor,factor=5,share=0.5",
        "pgd": "client=1,round=*,kind=backdoor,factor=5,share=0.5,pgd=yes,mask=0.1",
    }
    refused = {}
    for name, fault in faults.items():
        cfg = tiny_config(tmp_path, name, [fault], **{"federation.rounds": 3, "robust.min_cosine": 0.8})
        run_in_process(cfg)
        refused[name] = {r for r, e in _events(cfg) if e == "refused"}
    assert refused["plain"] == {1, 2, 3}
    assert 1 not in refused["pgd"]


@pytest.mark.parametrize(
    "fault, message",
    [
        ("client=1,round=*,kind=backdoor,pgd=yes", "pgd= applies to a backdoor with factor=K only"),
        ("client=1,round=*,kind=scale,mask=0.1", "mask= applies to kind backdoor only"),
        ("client=1,round=*,kind=backdoor,mask=1.5", "mask must be in"),
        ("client=1,round=*,kind=backdoor,factor=3,pgd=maybe", "pgd must be yes or no"),
    ],
)
def test_misplaced_options_are_refused_at_load(fault, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", None, {"federation.faults": [fault]})
