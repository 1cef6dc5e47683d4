"""The robust learning rate (robust.aggregator = rlr; Ozdayi et al. 2021): the rule against a hand-computed reference,
a planted backdoor-like update stopped through the protocol's own aggregate where a pass-through lets it in, and the
same rule under secure aggregation (the clients' signs summed unseen) equal to the plain one, in a real tiny run."""

from functools import partial

import pytest
import torch
from helpers import begin_server, jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import defences
from trustformer.core.defences import DefenceResult
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import make_protocol
from trustformer.protocols.wrappers import robust as robust_wrapper

tiny = partial(tiny_config, defaults={"robust.aggregator": "rlr", "robust.bound": "none", "eval.bleu_size": 4})


def test_the_step_is_reversed_where_fewer_than_theta_clients_agree_on_the_sign():
    updates = torch.tensor([[1.0, 2.0, -1.0], [3.0, -1.0, -2.0], [2.0, 1.0, 1.0]], dtype=torch.float64)
    out = defences.robust_learning_rate(updates, [1, 1, 2], threshold=2)
    mean = (updates[0] + updates[1] + 2 * updates[2]) / 4
    # sign sums: 3, 1, -1 -> coordinate 0 kept, coordinates 1 and 2 reversed
    assert out.update.tolist() == pytest.approx([mean[0].item(), -mean[1].item(), -mean[2].item()])
    assert out.info["reversed_share"] == pytest.approx(2 / 3)
    assert out.kept == [True] * 3
    with pytest.raises(AssertionError):  # θ = 0 reverses nothing: the plain mean, which the reference is not
        assert defences.robust_learning_rate(updates, [1, 1, 2], 0).update.tolist() == pytest.approx(
            out.update.tolist()
        )


HONEST, ATTACKER, DIM, BACKDOOR = 9, 1, 40, slice(30, 40)


def planted_round(seed=0):
    """Ten clients' models one round after the identical start (zeros): nine honest ones move together, with jitter,
    on coordinates 0–29 and leave 30–39 alone (a trigger word's embedding row that no honest pair uses); one attacker
    pushes hard on coordinates 30–39 (its backdoor)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(DIM, generator=g)
    models = [common + 0.2 * torch.randn(DIM, generator=g) for _ in range(HONEST)]
    for model in models:
        model[BACKDOOR] = 0.0
    attacker = 0.2 * torch.randn(DIM, generator=g)
    attacker[BACKDOOR] = 3.0
    return [{"w": m} for m in (*models, attacker)]


def server_aggregate(tmp_path):
    cfg = tiny(tmp_path, **{"federation.clients": 10})
    protocol = make_protocol(cfg)
    begin_server(protocol, {"w": torch.zeros(DIM)})
    result = protocol.aggregate(1, planted_round(), [1] * (HONEST + ATTACKER))
    return result.tensors["w"], result.events


def stops_the_backdoor(step, events):
    """The server's step moves against the attacker's coordinates and along the honest majority's."""
    assert float(step[BACKDOOR].sum()) < 0, step[BACKDOOR]
    honest = planted_round()[0]["w"]
    assert float(torch.dot(step[:30], honest[:30])) > 0
    assert [e["event"] for e in events] == ["rlr_reversed"]


def pass_through(updates, num_examples, *args, **kwargs):
    total = float(sum(num_examples))
    n = len(num_examples)
    mean = sum(float(w) / total * u for w, u in zip(num_examples, updates, strict=True))
    return DefenceResult(mean, [1.0 / n] * n, [1.0] * n, [True] * n, {"reversed_share": 0.0})


@pytest.mark.parametrize("variant", ["rlr", "pass-through"])
def test_a_planted_backdoor_update_is_stopped_and_a_pass_through_lets_it_in(tmp_path, monkeypatch, variant):
    if variant == "pass-through":
        monkeypatch.setattr(robust_wrapper, "robust_learning_rate", pass_through)
    step, events = server_aggregate(tmp_path)
    if variant == "rlr":
        stops_the_backdoor(step, events)
    else:
        with pytest.raises(AssertionError):
            stops_the_backdoor(step, events)


def _run(cfg):
    summary = run_in_process(cfg)
    events = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if r.get("event") == "rlr_reversed"]
    return summary, events


def test_under_secure_aggregation_it_runs_from_the_summed_signs_and_matches_the_plain_rule(tmp_path):
    plain, plain_events = _run(tiny(tmp_path, "plain", **{"federation.rounds": 2}))
    secure, secure_events = _run(tiny(tmp_path, "secure", **{"federation.rounds": 2, "secure.mode": "secagg"}))
    mean, _ = _run(tiny(tmp_path, "mean", **{"federation.rounds": 2, "robust.aggregator": "mean"}))
    assert len(plain_events) == len(secure_events) == 2
    shares = [(s["reversed_share"], p["reversed_share"]) for s, p in zip(secure_events, plain_events, strict=True)]
    assert shares[0][0] == pytest.approx(shares[0][1], abs=1e-9)  # round 1: the same signs, summed unseen
    assert shares[1][0] == pytest.approx(shares[1][1], abs=1e-3)  # round 2 starts from the masked sum's rounding
    assert 0 < plain_events[0]["reversed_share"] < 1
    assert secure["test_loss"] == pytest.approx(plain["test_loss"], rel=1e-4)  # fixed-point masking's rounding
    assert secure["test_loss"] != pytest.approx(mean["test_loss"], rel=1e-4)  # and the rule did something


def test_configuration():
    load_config("tiny", None, {"robust.aggregator": "rlr", "secure.mode": "secagg"})  # accepted there
    with pytest.raises(ConfigError, match="cannot run under secure.mode = 'secagg'"):
        load_config("tiny", None, {"robust.aggregator": "rlr", "robust.bound": "median", "secure.mode": "secagg"})
    with pytest.raises(ConfigError, match="robust.rlr_threshold"):
        load_config("tiny", None, {"robust.aggregator": "rlr", "robust.rlr_threshold": -1})
    cfg = load_config("tiny", None, {"robust.aggregator": "rlr", "federation.clients": 10})
    assert cfg.robust.rlr_threshold_for(10) == 4.0
