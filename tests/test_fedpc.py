"""FedPC (protocols/fedpc.py) through its own code path: Eq. 1, 3, 4/5 on the master and the workers, the
real round (report → pilot → model and packed ternary vectors → P^t) with its bytes against Eq. 8, tee,
the refusal of secure aggregation, and workers dropping out mid-epoch (pilot or not)."""

from functools import partial

import pytest
import torch
from helpers import begin_server, jsonl, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.core import ternary
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import get_protocol
from trustformer.protocols.fedpc import private_hyperparameters
from trustformer.protocols.interface.base import ClientSession

TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "task": "image-classification",
    "data.partition": "stratified",
    "federation.strategy": "fedpc",
}
tiny = partial(tiny_config, defaults=TINY)


def lines(cfg):
    return jsonl(f"{cfg.out}/metrics.jsonl")


def round_bytes(cfg, rnd=1):
    return sum(r["bytes_up"] + r["bytes_down"] for r in lines(cfg) if "event" not in r and r["round"] == rnd)


# ------------------------------------------------------------------------------------ the master's equations


def master(tmp_path, sign="paper", **overrides):
    cfg = tiny(tmp_path, "m", **{"fedpc.sign": sign, "fedpc.master_lr": 0.5, "fedpc.beta": 0.25, **overrides})
    protocol = get_protocol(cfg)
    initial = {"w": torch.zeros(5)}
    begin_server(protocol, initial)
    protocol.last = dict(initial)
    return protocol


@pytest.mark.parametrize("sign", ["paper", "flipped"])
def test_eq3_first_epoch_and_after(tmp_path, sign):
    protocol = master(tmp_path, sign)
    s = 1.0 if sign == "paper" else -1.0
    pilot = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])}
    t1 = {"ternary": ternary.pack(torch.tensor([1, -1, 0, 1, 1]))}
    t2 = {"ternary": ternary.pack(torch.tensor([1, 1, 0, -1, 0]))}
    # S = 10: pilot 5, workers 3 and 2
    new = protocol.aggregate(1, [t1, pilot, t2], [3, 5, 2]).tensors
    vote = 0.3 * torch.tensor([1.0, -1, 0, 1, 1]) + 0.2 * torch.tensor([1.0, 1, 0, -1, 0])
    assert torch.allclose(new["w"], pilot["w"] - s * 0.5 * vote)  # t = 1: Q* − α0 Σ p_k T_k
    protocol.before, protocol.last, protocol.epoch = {"w": torch.zeros(5)}, {"w": torch.tensor([1.0, -2, 0, 4, 1])}, 1
    new = protocol.aggregate(1, [t1, pilot, t2], [3, 5, 2]).tensors
    change = torch.tensor([1.0, -2, 0, 4, 1])
    assert torch.allclose(new["w"], pilot["w"] - s * 0.25 * vote * change)  # t > 1: Q* − Σ p_k β_k T_k ΔP


def test_goodness_eq1(tmp_path):
    protocol = master(tmp_path)
    assert protocol.goodness(0, 100, 2.0) == 50.0  # t = 1: S / C
    protocol.epoch, protocol.costs = 1, {0: 2.0}
    assert protocol.goodness(0, 100, 1.5) == 50.0  # t > 1: S (C^{t-1} − C^t)
    assert protocol.goodness(1, 100, 1.5) is None  # no cost of the previous epoch: ranks last


def test_worker_ternary_vector_eq4_then_eq5(tmp_path):
    cfg = tiny(tmp_path, "w")
    protocol = get_protocol(cfg)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, 0.001]]))
    initial = {"weight": torch.zeros(1, 2)}
    session = ClientSession(cfg=cfg, client=0, round=1, model=model, num_examples=4, initial_tensors=lambda: initial)
    metrics = {"lr": 0.01, "steps": 3, "examples": 12, "train_loss": 1.0}
    protocol.client_trained(session, metrics)
    assert set(metrics) == {"train_loss"}  # the private learning rate and step counts never leave the worker
    session.request = {"want": "ternary", "epoch": 1, "beta": 0.2}
    payload, _ = protocol.client_payload(session)
    assert ternary.unpack(payload["ternary"], 2).tolist() == [1, 0]  # Eq. 4 with α_k = lr = 0.01
    protocol.client_apply(session, {"weight": torch.tensor([[1.0, -1.0]])})  # P^1; P^0 kept as the one before
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[2.0, -1.1]]))
    session.request = {"want": "ternary", "epoch": 2, "beta": 0.2}
    payload, _ = protocol.client_payload(session)
    assert ternary.unpack(payload["ternary"], 2).tolist() == [1, 0]  # +1 same direction; -0.1 < 0.2·1: 0
    session.request = {"want": "model"}
    payload, _ = protocol.client_payload(session)
    assert torch.equal(payload["weight"], model.weight.detach())


def test_private_hyperparameters_are_drawn_per_worker_from_the_choices(tmp_path):
    cfg = tiny(tmp_path, "hp", **{"fedpc.lrs": [0.01, 0.02], "fedpc.local_epochs": [1, 2]})
    draws = [private_hyperparameters(cfg, c) for c in range(6)]
    assert draws == [private_hyperparameters(cfg, c) for c in range(6)]  # seeded
    assert all(
        d["batch_size"] in (128, 64, 32) and d["lr"] in (0.01, 0.02) and d["local_epochs"] in (1, 2) for d in draws
    )
    assert len({tuple(sorted(d.items())) for d in draws}) > 1


def test_configuration_errors_name_the_option(tmp_path):
    with pytest.raises(ConfigError, match="pilot worker's own model"):
        tiny(tmp_path, "s", **{"secure.mode": "secagg"})
    with pytest.raises(ConfigError, match="fedpc.sign"):
        tiny(tmp_path, "s", **{"fedpc.sign": "minus"})
    with pytest.raises(ConfigError, match="image task"):
        load_config("tiny", None, {"federation.strategy": "fedpc"})
    with pytest.raises(ConfigError, match="reply to train.payload"):
        tiny(tmp_path, "s", **{"federation.faults": ["client=0,round=1,kind=nan"]})


# ------------------------------------------------------------------------------------ the real round


def test_fedpc_round_records_pilot_goodness_and_ternary_shares_under_tee(tmp_path):
    plain = tiny(tmp_path, "plain")
    summary = run_in_process(plain)
    rows = [r for r in lines(plain) if "event" not in r]
    for rnd in (1, 2):
        got = [r for r in rows if r["round"] == rnd]
        assert sum(r["pilot"] for r in got) == 1
        pilot = next(r for r in got if r["pilot"])
        assert summary["fedpc"]["pilots"][rnd - 1] == pilot["client"] == got[0]["pilot_client"]
        for r in got:
            assert "lr" not in r and "steps" not in r and r["goodness"] is not None
            if not r["pilot"]:
                assert r["ternary_neg"] + r["ternary_zero"] + r["ternary_pos"] == pytest.approx(1.0)
        assert len({r["test_loss"] for r in got}) == 1  # every worker evaluates the master's P^t
    good = {r["client"]: r["goodness"] for r in rows if r["round"] == 1}
    assert summary["fedpc"]["pilots"][0] == max(good, key=good.get)
    sealed = tiny(tmp_path, "tee", **{"secure.mode": "tee"})
    secure = run_in_process(sealed)
    assert secure["fedpc"]["pilots"] == summary["fedpc"]["pilots"]
    assert secure["test_loss"] == pytest.approx(summary["test_loss"], abs=1e-6)
    assert secure["secure"]["counts"]["attestations"] == 3 and secure["secure"]["counts"]["rejected"] == {}


def test_workers_dropping_out_mid_epoch(tmp_path):
    base = tiny(tmp_path, "base", **{"federation.rounds": 1})
    [first] = run_in_process(base)["fedpc"]["pilots"]  # the round's training does not depend on the faults below
    # the pilot vanishes when asked for its model: the master asks the next best worker instead
    gone = tiny(
        tmp_path,
        "pilot-gone",
        **{
            "federation.rounds": 1,
            "federation.min_clients": 2,
            "federation.faults": [f"client={first},round=1,kind=dropout,message=train.payload"],
        },
    )
    summary = run_in_process(gone)
    events = [r for r in lines(gone) if "event" in r]
    assert [e["event"] for e in events] == ["dropped", "pilot_replaced"]
    replaced = events[1]["client"]
    assert summary["fedpc"]["pilots"] == [replaced] and replaced != first
    rows = [r for r in lines(gone) if "event" not in r]
    assert [r["client"] for r in rows if r.get("pilot")] == [replaced]
    assert sorted(r["client"] for r in rows) == [0, 1, 2]  # the dropped worker still receives P^t
    assert "ternary_pos" not in next(r for r in rows if r["client"] == replaced)  # its ternary vector: discarded
    # a worker that is not the pilot: its ternary vector is missing (counts as zeros), the pilot stays
    other = tiny(
        tmp_path,
        "other-gone",
        **{
            "federation.rounds": 1,
            "federation.min_clients": 2,
            "federation.faults": [f"client={(first + 1) % 3},round=1,kind=dropout,message=train.payload"],
        },
    )
    summary = run_in_process(other)
    assert summary["fedpc"]["pilots"] == [first]
    assert [e["event"] for e in lines(other) if "event" in e] == ["dropped"]


@pytest.mark.parametrize("n", [3, 10])
def test_bytes_per_epoch_match_eq8_against_fedavg(tmp_path, n):
    """Bytes counted on the real messages: FedPC's epoch / FedAvg's = Eq. 8 / 2VN within 1%."""
    wide = {"federation.clients": n, "federation.rounds": 1, "image.widths": [32, 64], "data.partition": "iid"}
    fedpc = tiny(tmp_path, f"fedpc{n}", **wide)
    summary = run_in_process(fedpc)
    fedavg = tiny(tmp_path, f"fedavg{n}", **{**wide, "federation.strategy": "fedavg"})
    run_in_process(fedavg)
    v = summary["bytes"]["fedavg_model_bytes"]  # V: the model on the wire (float32 arrays)
    eq8 = v * (n + 1) + v * (n - 1) / 16
    assert round_bytes(fedpc) / round_bytes(fedavg) == pytest.approx(eq8 / (2 * v * n), rel=0.01)
    assert round_bytes(fedpc) == pytest.approx(eq8, rel=0.02)  # plus the small cost records and requests
    assert round_bytes(fedavg) == pytest.approx(2 * v * n, rel=0.02)
