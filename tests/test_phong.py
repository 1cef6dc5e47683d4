"""Phong & Phuong's sequential baseline (protocols/phong.py) through its own round: the model visits the
workers one after another, in a fixed or seeded shuffled order, 2VN bytes per epoch."""

from functools import partial

import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import get_protocol

TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "task": "image-classification",
    "federation.strategy": "phong",
}
tiny = partial(tiny_config, defaults=TINY)


class FakeRound:
    """What run_round sees of runtime.rounds.RoundIO: each worker adds its client id + 1 to the weights."""

    def __init__(self, rnd, nodes, drop=()):
        self.rnd, self.nodes, self.rows, self.sent, self.drop = rnd, nodes, {}, [], set(drop)
        self.server = type("S", (), {"initial": staticmethod(lambda: {"w": torch.zeros(2)})})()

    def client(self, node):
        return node - 100

    def initial(self):
        return self.server.initial()

    def prepare(self, nodes, *, sampled=False):
        return nodes

    def train(self, nodes, *, payload, models):
        [node] = nodes
        self.sent.append((self.client(node), models[node]["w"].clone()))
        if node in self.drop:
            return {}
        self.rows[node] = {}
        return {node: {"w": models[node]["w"] + self.client(node) + 1}}

    def note(self, node, **fields):
        self.rows[node].update(fields)

    def require(self, step):
        assert self.rows

    def apply(self, nodes, tensors, phases=None):
        self.applied = (nodes, tensors)


@pytest.mark.parametrize("order", ["fixed", "shuffled"])
def test_the_model_visits_the_workers_one_after_another(tmp_path, order):
    protocol = get_protocol(tiny(tmp_path, "u", **{"phong.order": order, "federation.rounds": 3}))
    io = FakeRound(1, [100, 101, 102, 103])
    protocol.run_round(io)
    visited = [c for c, _ in io.sent]
    assert sorted(visited) == [0, 1, 2, 3] and (visited == [0, 1, 2, 3]) == (order == "fixed")
    expected = torch.zeros(2)
    for client, model in io.sent:  # each worker starts from the previous worker's weights
        assert torch.equal(model, expected)
        expected = expected + client + 1
    assert [io.rows[n]["position"] for n in sorted(io.rows, key=lambda n: visited.index(n - 100))] == [0, 1, 2, 3]
    first = protocol.order(2, [0, 1, 2, 3])[0]
    io2 = FakeRound(2, [100, 101, 102, 103], drop={first + 100})  # epoch 2 continues; a dropout is skipped
    protocol.run_round(io2)
    assert torch.equal(io2.sent[0][1], expected) and torch.equal(io2.sent[1][1], expected)
    assert not hasattr(io2, "applied")  # the final model goes to every worker after the last epoch only
    io3 = FakeRound(3, [100, 101, 102, 103])
    protocol.run_round(io3)
    assert sorted(io3.applied[0]) == [100, 101, 102, 103]
    orders = protocol.server_summary()["phong"]["orders"]
    assert orders == [protocol.order(r, [0, 1, 2, 3]) for r in (1, 2, 3)]  # seeded per epoch


def test_phong_round_bytes_are_2vn_and_every_client_ends_with_the_final_model(tmp_path):
    cfg = tiny(tmp_path, "run", **{"image.widths": [32, 64]})
    summary = run_in_process(cfg)
    rows = jsonl(f"{cfg.out}/metrics.jsonl")
    rows = [r for r in rows if "event" not in r]
    v, n = summary["bytes"]["fedavg_model_bytes"], cfg.federation.clients
    epoch1 = sum(r["bytes_up"] + r["bytes_down"] for r in rows if r["round"] == 1)
    assert epoch1 == pytest.approx(2 * v * n, rel=0.02)
    assert [r["position"] for r in rows if r["round"] == 1] == [0, 1, 2]
    assert len(set(summary["accuracy"])) == 1 and len({r["test_loss"] for r in rows if r["round"] == 2}) == 1
    assert summary["phong"]["orders"] == [[0, 1, 2], [0, 1, 2]]


def test_secure_aggregation_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="one worker at a time"):
        tiny(tmp_path, "s", **{"secure.mode": "secagg"})
    with pytest.raises(ConfigError, match="phong.order"):
        tiny(tmp_path, "s", **{"phong.order": "random"})
