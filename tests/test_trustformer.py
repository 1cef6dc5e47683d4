"""The Trustformer protocol end to end on the tiny preset, through the protocol class and the real wire."""

from functools import partial

import pytest
import torch
from flwr.app import RecordDict
from helpers import jsonl, tiny_config

from trustformer.app import FederationError, client_app
from trustformer.config import ConfigError
from trustformer.core.centroids import cluster_means, layer_matrix
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import trustformer as trustformer_module
from trustformer.protocols.trustformer import PAYLOAD, Trustformer
from trustformer.wire import from_array_record, payload_bytes

ALIGNED = ("shared", "tracked", "rotating", "focused")


TINY = {  # this module's tiny run (helpers.tiny_config)
    "federation.strategy": "trustformer",
    "eval.diagnostics": True,
}
tiny = partial(tiny_config, defaults=TINY)


def initial(cfg):
    from trustformer.tasks.translation_workload import initial_model, load_workload

    return {n: p.detach() for n, p in initial_model(cfg, load_workload(cfg)).named_parameters()}


class Spy:
    """Wraps the protocol class's own client steps: records each client's trained model, what it
    sent and its memberships (client_payload), and its model after the exchange (client_apply)."""

    def __init__(self, monkeypatch):
        self.trained, self.sent, self.labels, self.applied, self.received = {}, {}, {}, {}, {}
        real_payload, real_apply = Trustformer.client_payload, Trustformer.client_apply
        spy = self

        def client_payload(self, session):
            payload, phases = real_payload(self, session)
            key = (session.round, session.client)
            spy.trained[key] = {n: p.detach().clone() for n, p in session.model.named_parameters()}
            spy.sent[key] = {n: t.clone() for n, t in payload.items()}
            spy.labels[key] = {
                n[len(trustformer_module.LABELS) :]: t.clone()
                for n, t in session.protocol_state.items()
                if n.startswith(trustformer_module.LABELS)
            }
            return payload, phases

        def client_apply(self, session, aggregate):
            out = real_apply(self, session, aggregate)
            spy.received[(session.round, session.client)] = {n: t.clone() for n, t in aggregate.items()}
            spy.applied[(session.round, session.client)] = {
                n: p.detach().clone() for n, p in session.model.named_parameters()
            }
            return out

        monkeypatch.setattr(Trustformer, "client_payload", client_payload)
        monkeypatch.setattr(Trustformer, "client_apply", client_apply)


def _distance(a, b):
    return sum(float((a[n] - b[n]).pow(2).sum()) for n in a) ** 0.5


def _fedavg(models):
    return {n: sum(m[n] for m in models) / len(models) for n in models[0]}


@pytest.mark.parametrize("mode", ALIGNED)
def test_exchange_moves_every_client_towards_the_fedavg_of_the_local_models(tmp_path, monkeypatch, mode):
    """At β < 1 every client ends the exchange closer to the FedAvg of the round's locally trained
    models, and its cluster means equal the FedAvg model's exactly (a no-op apply fails both)."""
    spy = Spy(monkeypatch)
    cfg = tiny(tmp_path, mode, **{"trustformer.beta": 0.25, "trustformer.memberships": mode})
    run_in_process(cfg)
    layout = Trustformer(cfg).clusters(initial(cfg))
    for rnd in (1, 2):
        local = [spy.trained[(rnd, c)] for c in range(3)]
        mean = _fedavg(local)
        for c in range(3):
            after = spy.applied[(rnd, c)]
            assert _distance(after, mean) < _distance(local[c], mean) - 1e-4, (mode, rnd, c)
            for name, (k, _f) in layout.items():
                labels = spy.labels[(rnd, c)][name]
                got, _ = cluster_means(layer_matrix(after[name]), labels, k)
                want, _ = cluster_means(layer_matrix(mean[name]), labels, k)
                assert torch.allclose(got, want, atol=1e-5), (mode, name)


def test_memberships_agree_across_clients_and_the_server_can_derive_them(tmp_path, monkeypatch):
    for mode in ALIGNED:
        spy = Spy(monkeypatch)
        cfg = tiny(
            tmp_path,
            f"agree-{mode}",
            **{"trustformer.beta": 0.25, "trustformer.memberships": mode, "federation.rounds": 3},
        )
        run_in_process(cfg)
        protocol, init = Trustformer(cfg), initial(cfg)
        history = []
        for rnd in (1, 2, 3):
            labels = [spy.labels[(rnd, c)] for c in range(3)]
            derived = protocol.server_labels(init, history, rnd)
            for name in labels[0]:
                assert all(torch.equal(labels[0][name], other[name]) for other in labels[1:]), (mode, rnd, name)
                assert torch.equal(derived[name], labels[0][name]), (mode, rnd, name)
            history.append((rnd, spy.received[(rnd, 0)]))
        if mode in ("rotating", "focused"):
            name = next(iter(layout := protocol.clusters(init)))
            assert not torch.equal(spy.labels[(1, 0)][name], spy.labels[(2, 0)][name]), layout
    assert Trustformer(tiny(tmp_path, "l", **{"trustformer.memberships": "local"})).server_labels(init, [], 1) is None


def _capture_replies(store):
    """A ClientApp that records every train reply exactly as it goes on the wire."""

    def call(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and reply.has_content() and "payload" in reply.content:
            store.append((context.node_config["partition-id"], reply.content))
        return reply

    return call


@pytest.mark.parametrize("mode,beta", [("shared", 0.5), ("local", 0.5), ("rotating", 0.25), ("tracked", 0.1)])
def test_floor_holds_on_the_wire_and_framing_is_one_header(tmp_path, monkeypatch, mode, beta):
    """Every centroid on the wire is the mean of ≥ min_cluster_rows rows of the client's trained layer,
    1-D tensors included; the payload is one flat array whose framing is ≤ 2% of its values' bytes."""
    spy, replies = Spy(monkeypatch), []
    cfg = tiny(
        tmp_path,
        f"wire-{mode}",
        **{"trustformer.beta": beta, "trustformer.memberships": mode, "trustformer.min_cluster_rows": 2},
    )
    run_in_process(cfg, client_app=_capture_replies(replies))
    protocol, init = Trustformer(cfg), initial(cfg)
    layout = protocol.clusters(init)
    assert any(t.dim() == 1 for n, t in init.items() if n in layout)  # 1-D tensors are exchanged too
    assert len(replies) == 6
    for round_index, (client, content) in enumerate(replies):
        assert set(content) == {"payload", "metrics"}  # nothing else travels up
        payload = from_array_record(content["payload"], protocol.expected_payload(init))
        values = payload[PAYLOAD].numel()
        framing = payload_bytes(RecordDict({"payload": content["payload"]})) - 4 * values
        assert 0 < framing <= 0.02 * 4 * values
        rnd = 1 + round_index // 3
        assert torch.equal(payload[PAYLOAD], spy.sent[(rnd, client)][PAYLOAD])
        centroids = protocol.unpack_payload(payload, init)
        for name, (k, _f) in layout.items():
            x = layer_matrix(spy.trained[(rnd, client)][name])
            means, counts = cluster_means(x, spy.labels[(rnd, client)][name], k)
            assert int(counts.min()) >= 2, (mode, name)
            assert torch.allclose(centroids[name], means, atol=1e-6)
            if x.shape[1] > 1:  # no row of the trained layer leaves verbatim
                gap = torch.cdist(centroids[name], x).min()
                assert gap > 1e-6, (mode, name)


def test_a_client_refuses_to_send_centroids_below_the_floor(tmp_path, monkeypatch):
    monkeypatch.setattr(trustformer_module, "enforce_min_rows", lambda x, labels, k, m: labels)  # repair disabled
    cfg = tiny(tmp_path, "refuse", **{"trustformer.beta": 0.5, "trustformer.memberships": "local"})
    replies = []
    with pytest.raises(FederationError):
        run_in_process(cfg, client_app=_capture_replies(replies))
    assert replies == []  # no payload left any client
    events = jsonl(f"{cfg.out}/metrics.jsonl")
    reasons = " ".join(e.get("reason", "") for e in events if e.get("event") == "dropped")
    assert "min_cluster_rows" in reasons


def test_beta_above_the_floor_is_refused_and_beta_one_without_floor_is_fedavg(tmp_path):
    with pytest.raises(ConfigError, match="min_cluster_rows"):
        tiny(tmp_path, "x", **{"trustformer.beta": 0.6, "trustformer.min_cluster_rows": 2})
    fedavg = run_in_process(tiny(tmp_path, "fedavg", **{"federation.strategy": "fedavg"}))
    for mode in ("shared", "rotating"):
        tf = run_in_process(
            tiny(
                tmp_path,
                f"tf-{mode}",
                **{"trustformer.beta": 1.0, "trustformer.min_cluster_rows": 1, "trustformer.memberships": mode},
            )
        )
        assert tf["test_loss"] == pytest.approx(fedavg["test_loss"], rel=1e-6, abs=1e-6)
        assert max(tf["fedavg_distance"]) < 1e-6


def test_phases_and_kmeans_iterations_are_real_in_every_round(tmp_path):
    cfg = tiny(
        tmp_path,
        "phases",
        **{"trustformer.beta": 0.5, "trustformer.memberships": "local", "trustformer.weighting": "data_size"},
    )
    run_in_process(cfg)
    rows = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "round" in r]
    rows = [r for r in rows if "cluster_s" in r]
    assert len(rows) == 6
    for row in rows:
        assert {"cluster_s", "memberships_s", "aggregate_s", "estimate_s", "fedavg_distance"} <= set(row)
        assert row["kmeans_iterations"] >= 1  # the paper's mode runs k-means on trained weights every exchange
    shared = tiny(tmp_path, "phases-shared", **{"trustformer.beta": 0.5, "trustformer.memberships": "shared"})
    run_in_process(shared)
    rows = [r for r in jsonl(f"{shared.out}/metrics.jsonl") if "cluster_s" in r]
    assert [r["kmeans_iterations"] >= 1 for r in rows] == [True] * 3 + [False] * 3  # k-means once, on round 1
