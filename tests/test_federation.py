"""End-to-end runs of the tiny preset through the Flower apps and the in-process runtime."""

import math
from functools import partial

import pytest
import torch
from flwr.app import ArrayRecord
from helpers import jsonl, tiny_config

from trustformer.app import FederationError, client_app
from trustformer.engine.inprocess import run_in_process

tiny = partial(tiny_config, defaults={"eval.diagnostics": True})


def read_metrics(cfg):
    lines = jsonl(f"{cfg.out}/metrics.jsonl")
    return [x for x in lines if "event" not in x], [x for x in lines if "event" in x]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for strategy in ("fedavg", "local", "centralized"):
        cfg = tiny(tmp, strategy, **{"federation.strategy": strategy})
        out[strategy] = (cfg, run_in_process(cfg))
    return out


def test_summary_has_every_measurement(runs):
    for strategy, (cfg, summary) in runs.items():
        for key in ("strategy", "rounds", "clients", "seed", "config", "test_loss", "bleu", "chrf", "bytes", "time_s"):
            assert key in summary, (strategy, key)
        assert summary["strategy"] == strategy and summary["seed"] == cfg.seed
        assert summary["config"] == cfg.to_dict()
        assert set(summary["bytes"]) >= {"up_per_client_per_round", "down_per_client_per_round", "fedavg_model_bytes"}
        assert summary["time_s"]["train"] > 0 and summary["time_s"]["total"] >= summary["time_s"]["train"] / 3
        assert all(math.isfinite(x) for x in summary["test_loss"])
        assert all(0 <= b <= 100 for b in summary["bleu"])
        rows, events = read_metrics(cfg)
        assert events == []
        assert len(rows) == cfg.federation.rounds * summary["clients"]
        for row in rows:
            assert {"round", "client", "test_loss", "bytes_up", "bytes_down", "train_s"} <= set(row)


def test_fedavg_clients_share_the_model_and_pay_a_model_per_round(runs):
    cfg, summary = runs["fedavg"]
    assert summary["clients"] == 3
    assert len(set(summary["test_loss"])) == 1  # after the exchange every client holds the same model
    model_bytes = summary["bytes"]["fedavg_model_bytes"]
    assert model_bytes > 10_000
    assert model_bytes <= summary["bytes"]["up_per_client_per_round"] < 1.01 * model_bytes + 1000
    assert model_bytes <= summary["bytes"]["down_per_client_per_round"] < 1.01 * model_bytes + 1000
    assert summary["fedavg_distance"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_local_clients_train_alone(runs):
    _cfg, summary = runs["local"]
    assert len(set(summary["test_loss"])) == 3  # three different models
    assert summary["bytes"]["up_per_client_per_round"] < 1000  # control messages only, no weights


def test_centralized_is_one_client_with_every_shard(runs):
    cfg, summary = runs["centralized"]
    assert summary["clients"] == 1
    rows, _ = read_metrics(cfg)
    assert rows[0]["num_examples"] == 3 * cfg.data.client_size


def test_same_seed_same_result_and_disk_store_equals_memory(tmp_path, runs):
    cfg, summary = runs["local"]
    again = run_in_process(tiny(tmp_path, "again", **{"federation.strategy": "local", "runtime.store": "disk"}))
    assert again["test_loss"] == pytest.approx(summary["test_loss"], abs=1e-6)
    # per-round snapshots (runtime/store.py) under <state-dir>/<run key>/: the last two rounds are kept
    assert sorted(p.name for p in (tmp_path / "again" / "client-state").glob("*/client-0/*")) == [
        "r00001-end.pt",
        "r00002-end.pt",
    ]


def _failing_client_app(fail):
    """Wrap the real ClientApp; ``fail(message, context)`` returns None or a replacement reply."""

    def call(message, context):
        reply = fail(message, context)
        return reply if reply is not None else client_app(message, context)

    return call


def test_client_crash_is_dropped_and_the_round_goes_on(tmp_path):
    def fail(message, context):
        if (
            context.node_config["partition-id"] == 1
            and message.metadata.group_id == "2"
            and message.metadata.message_type == "train"
        ):
            raise RuntimeError("simulated crash")
        return None

    cfg = tiny(tmp_path, "crash", **{"federation.min_clients": 2})
    summary = run_in_process(cfg, client_app=_failing_client_app(fail))
    rows, events = read_metrics(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(2, 1)]
    assert "simulated crash" in events[0]["reason"]
    assert sorted((r["round"], r["client"]) for r in rows) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 2)]
    assert summary["clients"] == 3 and len(summary["test_loss"]) == 3  # it rejoins for the final evaluation


def test_too_few_clients_stops_with_a_clear_error(tmp_path):
    def fail(message, context):
        if context.node_config["partition-id"] == 0 and message.metadata.message_type == "train":
            raise RuntimeError("simulated crash")
        return None

    with pytest.raises(FederationError, match=r"round 1 \(train\): only 2 client\(s\).*3 required"):
        run_in_process(tiny(tmp_path, "few"), client_app=_failing_client_app(fail))


@pytest.mark.parametrize("corruption", ["nan", "shape"])
def test_bad_payload_is_rejected_and_not_averaged(tmp_path, corruption):
    def fail(message, context):
        if context.node_config["partition-id"] != 2 or message.metadata.message_type != "train":
            return None
        reply = client_app(message, context)
        payload = reply.content["payload"]
        name = next(iter(payload))
        tensor = torch.from_numpy(payload[name].numpy().copy())
        if corruption == "nan":
            tensor.view(-1)[0] = float("nan")
        else:
            tensor = tensor[:-1]
        arrays = {k: torch.from_numpy(payload[k].numpy()) for k in payload}
        arrays[name] = tensor
        reply.content["payload"] = ArrayRecord(arrays)
        return reply

    cfg = tiny(tmp_path, f"bad-{corruption}", **{"federation.min_clients": 2, "federation.rounds": 1})
    summary = run_in_process(cfg, client_app=_failing_client_app(fail))
    _rows, events = read_metrics(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(1, 2)]
    assert ("NaN" if corruption == "nan" else "differ") in events[0]["reason"]
    assert all(math.isfinite(x) for x in summary["test_loss"])


def test_too_few_clients_stops_a_local_run_too(tmp_path):
    def fail(message, context):
        if context.node_config["partition-id"] == 2 and message.metadata.message_type == "train":
            raise RuntimeError("simulated crash")
        return None

    cfg = tiny(tmp_path, "few-local", **{"federation.strategy": "local"})
    with pytest.raises(FederationError, match=r"round 1 \(train\): only 2 client\(s\).*3 required"):
        run_in_process(cfg, client_app=_failing_client_app(fail))


def test_server_time_is_counted_once_per_round(runs):
    cfg, summary = runs["fedavg"]
    rows, _ = read_metrics(cfg)
    per_round = {r["round"]: r["aggregate_s"] for r in rows}
    assert summary["time_s"]["aggregate"] == pytest.approx(sum(per_round.values()), abs=1e-3)
    assert summary["server_time_s"]["aggregate_s"] == pytest.approx(sum(per_round.values()), abs=1e-3)


def test_server_shows_who_is_connected_while_it_waits(tmp_path, caplog):
    """Fewer client nodes than expected: the server says who is connected while it waits, then goes on
    with the min_clients it has (real in-process grid and ClientApps answering the identification query)."""
    import logging

    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from trustformer import app
    from trustformer.engine.inprocess import InProcessGrid, node_configs
    from trustformer.runtime.client_nodes import Nodes

    cfg = tiny(tmp_path, "wait")
    grid = InProcessGrid(client_app, node_configs(cfg)[:2], {app.CONFIG_KEY: cfg.to_json()}, run_id=7)
    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    try:
        with caplog.at_level(logging.INFO, logger="trustformer"):
            known = Nodes(grid, cfg)
            nodes = known.wait_for(want=3, need=2, wait_s=1.0)
        with pytest.raises(FederationError, match="federation.min_clients"):
            known.wait_for(want=3, need=3, wait_s=0.5)
        clients = known.clients
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous
    assert sorted(clients[n] for n in nodes) == [0, 1]
    shown = [r.getMessage() for r in caplog.records if "waiting for client nodes" in r.getMessage()]
    assert shown and "2 of 3 connected (clients 0, 1)" in shown[0] and "federation.node_wait_s" in shown[0]
