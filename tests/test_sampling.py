"""Client sampling (federation.clients_per_round): seeded draws recorded per round, clients left out catching
up as their protocol defines, and the protocols that refuse it."""

from functools import partial

import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import ProtocolObserver, observe

TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "federation.clients": 6,
    "federation.rounds": 3,
    "federation.clients_per_round": 2,
    "data.client_size": 30,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def rows_of(cfg):
    return [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" not in r]


class StartingPoints(ProtocolObserver):
    """Each client's trained model at every round, and the aggregate of every round."""

    def __init__(self):
        self.trained, self.aggregates = {}, {}

    def client_trained(self, rnd, client, trained, num_examples):
        self.trained[(rnd, client)] = trained

    def client_applied(self, rnd, client, aggregate):
        self.aggregates[rnd] = aggregate


def test_fedavg_draws_the_same_clients_for_a_seed_and_a_late_client_catches_up(tmp_path):
    # a learning rate so small that a client's trained model is the model it started from
    cfg = tiny(tmp_path, "a", **{"train.lr": 1e-12, "train.warmup_steps": 0})
    watch = StartingPoints()
    with observe(watch):
        run_in_process(cfg)
    rows = rows_of(cfg)
    drawn = {rnd: sorted(r["client"] for r in rows if r["round"] == rnd) for rnd in (1, 2, 3)}
    assert all(len(c) == 2 for c in drawn.values()) and all(r["sampled"] for r in rows)
    again = tiny(tmp_path, "b", **{"train.lr": 1e-12, "train.warmup_steps": 0})
    run_in_process(again)
    assert {rnd: sorted(r["client"] for r in rows_of(again) if r["round"] == rnd) for rnd in (1, 2, 3)} == drawn
    # every client drawn in round r starts from the global model of round r - 1, whether or not it was drawn then
    late = [(rnd, c) for rnd in (2, 3) for c in drawn[rnd] if c not in drawn[rnd - 1]]
    assert late, "this seed draws a client that sat out the round before"
    for rnd, client in late:
        for name, tensor in watch.trained[(rnd, client)].items():
            assert torch.allclose(tensor, watch.aggregates[rnd - 1][name], atol=1e-6), (rnd, client, name)
        row = next(r for r in rows if (r["round"], r["client"]) == (rnd, client))
        stayed = (
            next(r for r in rows if r["round"] == rnd and r["client"] in drawn[rnd - 1])
            if set(drawn[rnd]) & set(drawn[rnd - 1])
            else None
        )
        if stayed is not None:  # the catch-up model costs one model more on the way down
            assert row["bytes_down"] > 1.8 * stayed["bytes_down"]


def test_trustformer_and_topk_clients_left_out_keep_their_state(tmp_path):
    for strategy in ("trustformer", "fedavg-topk"):
        cfg = tiny(tmp_path, strategy, **{"federation.strategy": strategy})
        summary = run_in_process(cfg)
        rows = rows_of(cfg)
        assert [len([r for r in rows if r["round"] == rnd]) for rnd in (1, 2, 3)] == [2, 2, 2]
        assert len(summary["test_loss"]) == 6  # every client is evaluated at the end, drawn or not


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"federation.strategy": "dp-fedavg"}, "privacy.sampling_rate"),
        ({"federation.strategy": "local"}, "nothing is exchanged"),
        ({"federation.strategy": "trustformer", "trustformer.memberships": "tracked"}, "every aggregate"),
        ({"federation.clients_per_round": 7}, "federation.clients_per_round = 7"),
        ({"federation.min_clients": 3}, "exceeds federation.clients_per_round"),
    ],
)
def test_sampling_is_refused_where_a_protocol_cannot_work_with_it(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny(tmp_path, "x", **overrides)
