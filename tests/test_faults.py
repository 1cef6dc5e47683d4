"""A client cannot crash the server: every kind of fault of federation.faults, injected by the in-process
runtime at the message boundary, drops exactly the faulty client in the right round and changes nothing else."""

import math
from functools import partial

import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from helpers import jsonl, tiny_config

from trustformer.app import client_app
from trustformer.config import FAULT_KINDS, ConfigError, load_config
from trustformer.engine.inprocess import run_in_process

REASONS = {  # what the dropped event says for each kind
    "nan": "NaN",
    "wrong_shape": "differ from those the configuration gives",
    "empty_reply": "has no 'metrics' record",
    "malformed_reply": "not a MetricRecord",
    "huge_num_examples": "federation.max_examples",
    "replay": "is for round 1, not round 2",
    "dropout": "Node Unavailable",
    "restart": "Node Unavailable",  # federation.restart_wait_s = 0: not waited for
    "stall": "no reply to train",
}


TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.rounds": 2,
    "federation.min_clients": 2,
    "federation.round_timeout_s": 1.0,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def read(cfg):
    lines = jsonl(f"{cfg.out}/metrics.jsonl")
    rows = [x for x in lines if "event" not in x]
    return {(r["round"], r["client"]): {k: v for k, v in r.items() if not k.endswith("_s")} for r in rows}, [
        x for x in lines if "event" in x
    ]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    cfg = tiny(tmp, "clean")
    summary = run_in_process(cfg)
    return tmp, summary, *read(cfg)


@pytest.fixture(scope="module")
def reference(baseline):
    """The same run with client 1 simply gone in round 2 (dropout): what every other fault must equal."""
    tmp = baseline[0]
    cfg = tiny(tmp, "ref", ["client=1,round=2,kind=dropout"])
    return run_in_process(cfg), *read(cfg)


def test_every_fault_kind_is_covered():
    assert set(REASONS) == set(FAULT_KINDS)


@pytest.mark.parametrize("kind", sorted(FAULT_KINDS))
def test_a_faulty_client_is_dropped_in_its_round_and_nothing_else_changes(baseline, reference, kind):
    tmp, clean_summary, clean_rows, clean_events = baseline
    ref_summary, ref_rows, _ = reference
    cfg = tiny(tmp, kind, [f"client=1,round=2,kind={kind}"])
    summary = run_in_process(cfg)
    rows, events = read(cfg)
    assert clean_events == []
    assert [(e["event"], e["round"], e["client"]) for e in events] == [("dropped", 2, 1)]
    assert REASONS[kind] in events[0]["reason"], events[0]["reason"]
    assert sorted(rows) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 2)]
    for key in [(1, 0), (1, 1), (1, 2)]:  # the rounds before the fault: exactly the fault-free run
        assert rows[key] == clean_rows[key]
    for key in [(2, 0), (2, 2)]:
        # the others trained as in the fault-free run, then got the mean of the two of them: as with a dropout
        assert {k: rows[key][k] for k in ("train_loss", "num_examples", "steps")} == {
            k: clean_rows[key][k] for k in ("train_loss", "num_examples", "steps")
        }
        # (fedavg_distance, a simulation diagnostic, averages every model trained in the round, the dropped one's too)
        assert {k: v for k, v in rows[key].items() if k != "fedavg_distance"} == {
            k: v for k, v in ref_rows[key].items() if k != "fedavg_distance"
        }
    assert summary["client_ids"] == [0, 1, 2]  # the faulty client rejoins for the final evaluation
    assert [summary["test_loss"][i] for i in (0, 2)] == [ref_summary["test_loss"][i] for i in (0, 2)]
    assert all(math.isfinite(x) for x in summary["test_loss"])


@pytest.mark.parametrize("message", ["train", "train.apply"])
def test_a_node_that_dies_holding_a_message_and_comes_back_is_sent_it_again(baseline, message):
    """federation.restart_wait_s: client 1's node handles its message of round 2, dies before its reply leaves,
    and is back: the server sends the message again, the client computes it again from its snapshot, and the run
    ends exactly as the fault-free one. Only the bytes sent down grow (the message went twice)."""
    tmp, clean_summary, clean_rows, _clean_events = baseline
    cfg = tiny(
        tmp,
        f"restart-{message}",
        [f"client=1,round=2,kind=restart,message={message}"],
        **{"federation.restart_wait_s": 5.0},
    )
    summary = run_in_process(cfg)
    rows, events = read(cfg)
    assert events == []
    assert summary["test_loss"] == clean_summary["test_loss"]
    for key, row in clean_rows.items():
        resent = key == (2, 1)
        assert {k: v for k, v in rows[key].items() if k != "bytes_down"} == {
            k: v for k, v in row.items() if k != "bytes_down"
        }, key
        assert (rows[key]["bytes_down"] > row["bytes_down"]) == resent, key
    # without the wait, the same fault drops the client from the round
    cfg = tiny(tmp, f"restart-{message}-no-wait", [f"client=1,round=2,kind=restart,message={message}"])
    run_in_process(cfg)
    assert [(e["event"], e["round"], e["client"]) for e in read(cfg)[1]] == [("dropped", 2, 1)]


def test_faults_in_several_rounds_and_clients(baseline):
    tmp = baseline[0]
    cfg = tiny(
        tmp,
        "several",
        ["client=0,round=1,kind=nan", "client=2,round=2,kind=replay"],
        **{"federation.strategy": "trustformer"},
    )
    summary = run_in_process(cfg)
    _rows, events = read(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(1, 0), (2, 2)]
    assert len(summary["test_loss"]) == 3


def test_the_expected_payload_comes_from_the_configuration_not_a_vote(tmp_path):
    """Two clients, the first sends a wrong shape: a majority vote kept whichever arrived first."""
    cfg = tiny(
        tmp_path,
        "two",
        ["client=0,round=1,kind=wrong_shape"],
        **{"federation.clients": 2, "federation.min_clients": 1, "federation.rounds": 1},
    )
    run_in_process(cfg)
    rows, events = read(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(1, 0)]
    assert sorted(rows) == [(1, 1)]


def _rewrite(change):
    def call(message, context):
        reply = client_app(message, context)
        if context.node_config["partition-id"] == 1 and message.metadata.message_type == "train":
            change(reply.content)
        return reply

    return call


def _set_examples(value):
    def change(content):
        metrics = dict(content["metrics"])
        metrics["num_examples"] = value
        content["metrics"] = MetricRecord(metrics)

    return change


def _no_metrics(content):
    del content["metrics"]


def _sparse_index_past_the_model(content):
    arrays = {k: torch.from_numpy(content["payload"][k].numpy().copy()) for k in content["payload"]}
    arrays["indices"][-1] = 2**30  # beyond the model's dimension
    content["payload"] = ArrayRecord(arrays)


@pytest.mark.parametrize(
    "case, change, strategy, reason",
    [
        ("negative", _set_examples(-1), "fedavg", "num_examples = -1"),
        ("nan", _set_examples(float("nan")), "fedavg", "num_examples = nan"),
        ("huge-float", _set_examples(1e30), "fedavg", "num_examples = 1e+30"),
        ("no-metrics", _no_metrics, "fedavg", "no 'metrics' record"),
        ("sparse-index", _sparse_index_past_the_model, "dp-blur-lus", "indices must lie in [0,"),
    ],
)
def test_replies_that_used_to_crash_the_server_drop_the_client(tmp_path, case, change, strategy, reason):
    cfg = tiny(tmp_path, case, **{"federation.rounds": 1, "federation.strategy": strategy})
    summary = run_in_process(cfg, client_app=_rewrite(change))
    rows, events = read(cfg)
    assert [(e["round"], e["client"]) for e in events] == [(1, 1)]
    assert reason in events[0]["reason"], events[0]["reason"]
    assert {(1, 0), (1, 2)} <= set(rows) and len(summary["test_loss"]) == 3
    # the DP baselines send the aggregate to every client (sampled or not): the dropped one only adopts it
    assert set(rows) == ({(1, 0), (1, 1), (1, 2)} if strategy.startswith("dp-") else {(1, 0), (1, 2)})
    assert "train_loss" not in rows.get((1, 1), {})


@pytest.mark.parametrize(
    "faults, pattern",
    [
        (["client=1,round=2"], "must read client=C,round=R,kind=KIND"),
        (["client=1,round=2,kind=melt"], "kind 'melt' is not one of"),
        (["client=3,round=1,kind=nan"], "federation.clients = 3"),
        (["client=0,round=1,kind=stall"], "federation.round_timeout_s > 0"),
    ],
)
def test_fault_plans_are_validated(faults, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", None, {"federation.faults": faults})
    with pytest.raises(ConfigError, match="exchanges none"):
        load_config("tiny", None, {"federation.faults": ["client=0,round=1,kind=nan"], "federation.strategy": "local"})
    with pytest.raises(ConfigError, match="federation.max_examples"):
        load_config("tiny", None, {"federation.max_examples": 0})


def test_a_reply_that_arrived_while_a_pull_blocked_past_the_deadline_still_counts():
    """A pull can block for seconds (it fetches one reply's tensors while the client is still uploading them);
    the replies that reached the SuperLink meanwhile are taken by one more pull, not dropped as late."""
    import time
    from types import SimpleNamespace

    from trustformer.wire import exchange

    class SlowFirstPull:
        def __init__(self):
            self.pulls = 0

        def push_messages(self, messages):
            return [f"m{m.metadata.dst_node_id}" for m in messages]

        def pull_messages(self, ids):
            self.pulls += 1
            if self.pulls == 1:  # blocks past the deadline; node 2's reply arrives meanwhile
                time.sleep(0.3)
                return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id="m1"))]
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]

    messages = [SimpleNamespace(metadata=SimpleNamespace(dst_node_id=n)) for n in (1, 2)]
    grid = SlowFirstPull()
    replies = exchange(grid, messages, timeout=0.1)
    assert sorted(replies) == [1, 2]
    assert grid.pulls == 2  # the last pull started after the deadline, and there was no other


@pytest.mark.parametrize("mode", ["tee", "secagg"])
def test_a_resend_after_a_restart_is_refused_at_load_under_a_secure_channel(tmp_path, mode):
    """The secure channel takes no message twice (measured: the resent message is refused and the client dropped),
    so the configuration says so before anything runs."""
    with pytest.raises(ConfigError, match="federation.restart_wait_s"):
        tiny(tmp_path, "secure", **{"secure.mode": mode, "federation.restart_wait_s": 5.0})
