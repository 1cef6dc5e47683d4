"""Distributed noise (``privacy.noise = "distributed"``, tasks/record_dp.py): each owner adds a share of DP-SGD's
noise and secure aggregation sums them. Every run here goes through the real secure path: X25519 keys, Shamir
shares, masking in Z_2^64 and unmasking, on the in-process engine's Flower grid."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from trustformer.config import ConfigError, load_config
from trustformer.secure.masking import SecAggError
from trustformer.secure.secagg_common import SecAggParams
from trustformer.tasks import record_dp
from trustformer_lab.attack.harness import observed_run
from trustformer_lab.bench.secagg_bench import run_protocol

torch.set_num_threads(1)

DISTRIBUTED = {
    "privacy.unit": "record",
    "privacy.noise": "distributed",
    "privacy.epsilon": 1.0,
    "privacy.delta": 1e-5,
    "secure.mode": "secagg",
    "federation.rounds": 1,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
}


def config(out, **values):
    return load_config("tiny", None, {"out": str(out), **DISTRIBUTED, **values})


@pytest.mark.parametrize(
    "values, says",
    [
        ({"secure.mode": "none"}, "secure.mode = 'secagg'"),
        ({"secure.mode": "tee"}, "secure.mode = 'secagg'"),
        ({"privacy.unit": "client", "federation.strategy": "dp-fedavg"}, "privacy.unit = 'record'"),
        ({"federation.strategy": "trustformer"}, "not linear"),
        ({"federation.agg_every": 2, "federation.rounds": 2}, "agg_every = 1"),
        ({"privacy.dropout_tolerance": 3}, "dropout_tolerance = 3"),
    ],
)
def test_distributed_noise_is_refused_where_it_does_not_hold(tmp_path, values, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("*", r"\*")):
        config(tmp_path, **values)


def test_clients_refuse_to_unmask_a_sum_with_too_few_noise_shares():
    """The floor is the clients' own: a server that goes on with fewer survivors (here one that does not check it)
    gets no unmasking share from them; an honest server stops at the same point."""
    from trustformer.secure.secagg_client import SecAggClient
    from trustformer.secure.secagg_server import SecAggServer

    floor, lax = SecAggParams(threshold=2, min_survivors=3), SecAggParams(threshold=2)
    ids, session = [0, 1, 2], b"test/too-few"
    server = SecAggServer(ids, lax, 4, session)
    clients = {i: SecAggClient(i, ids, floor, session, length=4) for i in ids}
    broadcast = server.collect_keys({i: c.advertise_keys() for i, c in clients.items()})
    routed = server.route_shares({i: c.share_keys(broadcast) for i, c in clients.items()})
    masked = {i: clients[i].masked_input(np.full(4, float(i)), routed[i]) for i in (0, 1)}  # client 2 is lost
    survivors, dropped = server.collect_masked(masked)
    for i in survivors:
        with pytest.raises(SecAggError, match="refuses to unmask.*noise shares"):
            clients[i].unmask(survivors, dropped)
    vectors = {i: np.full(4, float(i)) for i in ids}
    with pytest.raises(SecAggError, match="noise shares"):
        run_protocol(vectors, floor, b"test/honest-server", drop_after_shares=[2])
    total, _seconds, _sizes = run_protocol(vectors, floor, b"test/all")
    np.testing.assert_allclose(total, np.full(4, 3.0), atol=1e-5)


def _round_one_noise(tmp_path, name: str, **values) -> tuple[float, float]:
    """(measured std of the noise on round 1's aggregate, lr·σC/B): the released aggregate of a seeded run against
    its noise-free twin (noise multiplier 0, the same Poisson draws and dropout masks), both through secure
    aggregation."""
    seeded = {"privacy.noise_source": "seeded-not-private", **values}
    noisy = observed_run(config(tmp_path / name, **seeded))
    clean_values = {**seeded, "privacy.noise_multiplier": 0.0, "privacy.on_exceed": "continue"}
    clean = observed_run(config(tmp_path / f"{name}-clean", **clean_values))
    a, b = noisy.exchanges[0].aggregate, clean.exchanges[0].aggregate
    diff = torch.cat([(a[n].double() - b[n].double()).flatten() for n in a])
    cfg = noisy.cfg
    task_sizes = [len(s) for s in _shards(cfg)]
    sigma = record_dp.plan(cfg, task_sizes[0], tuple(task_sizes)).noise_multiplier
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    lr = next(r["lr"] for r in rows if "lr" in r)
    return float(diff.std()), lr * sigma * cfg.privacy.clip_norm / record_dp.expected_batch(cfg, task_sizes[0])


def _shards(cfg):
    from trustformer.tasks.run import load_task

    task = load_task(cfg)
    return [task.shard(c) for c in range(cfg.federation.clients)]


def test_shares_add_up_to_the_noise_the_accountant_needs_and_a_missing_share_shows(tmp_path, monkeypatch):
    """Three owners, each N(0, σ²C²/3): the unmasked mean carries lr·σC/(3B), within 5%. With one owner's share
    left out (a planted bug) the noise falls to √(2/3) of it, which the same measurement shows."""
    measured, unit = _round_one_noise(tmp_path, "honest")
    assert measured / (unit / 3) == pytest.approx(1.0, abs=0.05)

    real_share, calls = record_dp.share, []

    def one_share_missing(cfg, dp):
        calls.append(1)
        mechanism = real_share(cfg, dp)
        return mechanism if len(calls) % 3 else record_dp.replace(mechanism, noise_multiplier=0.0)

    monkeypatch.setattr(record_dp, "share", one_share_missing)
    short, unit = _round_one_noise(tmp_path, "one-share-missing", **{"privacy.checks": False})  # checks stop it
    assert short / (unit / 3) == pytest.approx(math.sqrt(2 / 3), abs=0.05)
    assert short / measured < 0.9


def test_a_dropout_beyond_the_tolerance_stops_the_round_and_one_within_it_keeps_the_noise(tmp_path):
    """privacy.dropout_tolerance = 0: an owner lost after masking leaves too little noise, and the run stops naming
    the option. Tolerance 1: every share is σ/√2, the two survivors' sum still carries σC."""
    drop = {"federation.faults": ["client=2,round=1,kind=dropout"], "federation.min_clients": 2}
    with pytest.raises(Exception, match="dropout_tolerance"):
        observed_run(config(tmp_path / "refused", **drop))
    measured, unit = _round_one_noise(tmp_path, "tolerated", **drop, **{"privacy.dropout_tolerance": 1})
    assert measured / (unit / 2) == pytest.approx(1.0, abs=0.05)


def test_the_summary_states_each_threat_and_the_run_learns(tmp_path):
    """The summary gives ε against the server and against the server with one owner, one step per round."""
    run = observed_run(config(tmp_path / "run", **{"federation.rounds": 2}))
    privacy = run.summary["privacy"]
    assert privacy["noise"] == "distributed" and privacy["shares"] == 3 and privacy["steps_per_round"] == 1
    assert privacy["epsilon"] <= 1.0 + 1e-6
    assert privacy["epsilon_server_and_one_owner"] > privacy["epsilon"]
    assert all(v["steps"] == 2 for v in privacy["clients"].values())
