"""The Trustformer protocol end to end on the tiny preset, checked on the real wire format."""

import json

import pytest
import torch

from trustformer.app import client_app
from trustformer.config import load_config
from trustformer.core.centroids import layer_matrix, num_clusters
from trustformer.protocols import trustformer as trustformer_module
from trustformer.runtime.inprocess import run_in_process
from trustformer.workload import initial_model, load_workload


def tiny(tmp_path, name, **overrides):
    values = {"out": str(tmp_path / name), "runtime.progress": False, "federation.strategy": "trustformer"}
    values.update(overrides)
    return load_config("tiny", None, values)


def test_beta_one_reproduces_fedavg_exactly(tmp_path):
    fedavg = run_in_process(tiny(tmp_path, "fedavg", **{"federation.strategy": "fedavg"}))
    tf = run_in_process(tiny(tmp_path, "tf", **{"federation.beta": 1.0}))
    assert tf["test_loss"] == pytest.approx(fedavg["test_loss"], rel=1e-6, abs=1e-6)
    assert max(tf["fedavg_distance"]) < 1e-6
    assert tf["beta"] == 1.0


def _capture_replies(store):
    """A ClientApp that records every train reply exactly as it goes on the wire."""

    def call(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and "payload" in reply.content:
            store.append((context.node_config["partition-id"], reply.content))
        return reply

    return call


def test_server_receives_centroids_only_and_1d_tensors_are_exchanged(tmp_path):
    replies = []
    cfg = tiny(tmp_path, "wire", **{"federation.beta": 0.25, "federation.rounds": 1})
    run_in_process(cfg, client_app=_capture_replies(replies))
    model = initial_model(cfg, load_workload(cfg))
    params = dict(model.named_parameters())
    assert len(replies) == 3
    for _client, content in replies:
        assert set(content) == {"payload", "metrics"}  # nothing else travels up
        payload = content["payload"]
        assert set(payload) == set(params)  # every trainable tensor, 1-D ones included
        for name, array in payload.items():
            rows, feats = layer_matrix(params[name].detach()).shape
            assert tuple(array.shape) == (num_clusters(rows, 0.25), feats), name
            if rows >= 4:
                assert array.shape[0] < rows  # fewer rows than the weights: centroids, not weights
        one_d = [n for n, p in params.items() if p.dim() == 1]
        assert one_d and all(payload[n].shape[1] == 1 for n in one_d)


def _payload_numel(cfg, beta):
    model = initial_model(cfg, load_workload(cfg))
    total = 0
    for p in model.parameters():
        rows, feats = layer_matrix(p.detach()).shape
        total += num_clusters(rows, beta) * feats
    return total


def test_bytes_up_shrink_in_proportion_to_beta(tmp_path):
    summaries = {}
    for beta in (0.25, 0.5, 1.0):
        cfg = tiny(tmp_path, f"b{beta}", **{"federation.beta": beta, "federation.rounds": 1})
        summaries[beta] = run_in_process(cfg)["bytes"]["up_per_client_per_round"]
    for lo, hi in ((0.25, 0.5), (0.5, 1.0)):
        numel_gap = _payload_numel(cfg, hi) - _payload_numel(cfg, lo)
        # every extra centroid value costs exactly 4 bytes (float32) on the wire, up to a few length bytes
        assert summaries[hi] - summaries[lo] == pytest.approx(4 * numel_gap, rel=0.01)
    full = summaries[1.0]
    assert summaries[0.25] < 0.4 * full and summaries[0.5] < 0.6 * full


def test_local_memberships_are_aligned_across_clients(tmp_path, monkeypatch):
    """memberships = "local": round 1 starts every client from the same rows of the initial model; later exchanges from
    the previous global centroids, identical on every client."""
    seen = []
    caps = []
    real = trustformer_module.cluster_layers

    def spy(matrices, inits, **kwargs):
        seen.append({k: v.clone() for k, v in inits.items()})
        caps.append(kwargs["max_iter"])
        return real(matrices, inits, **kwargs)

    monkeypatch.setattr(trustformer_module, "cluster_layers", spy)
    cfg = tiny(tmp_path, "align", **{"federation.beta": 0.5, "federation.memberships": "local",
                                     "federation.kmeans_warm_max_iter": 2})
    run_in_process(cfg)
    assert len(seen) == 6  # 3 clients x 2 exchanges
    assert caps == [50] * 3 + [2] * 3  # cold exchange: kmeans_max_iter; warm ones: kmeans_warm_max_iter
    first, second = seen[:3], seen[3:]
    initial = {n: layer_matrix(p.detach()) for n, p in initial_model(cfg, load_workload(cfg)).named_parameters()}
    for name in first[0]:
        for other in first[1:]:
            assert torch.equal(first[0][name], other[name])
        # the round-1 start is made of rows of the identical initial model
        start = first[0][name]
        assert all(any(torch.equal(row, r) for r in initial[name]) for row in start[:3])
        for other in second[1:]:
            assert torch.equal(second[0][name], other[name])
        assert not torch.equal(second[0][name], first[0][name])  # warm start from the global centroids


def test_fedavg_distance_is_reported_and_data_size_weighting_is_an_option(tmp_path):
    cfg = tiny(tmp_path, "weighted", **{"federation.beta": 0.5, "federation.weighting": "data_size"})
    summary = run_in_process(cfg)
    assert len(summary["fedavg_distance"]) == 3 and all(0 < d < 1 for d in summary["fedavg_distance"])
    rows = [json.loads(x) for x in open(f"{cfg.out}/metrics.jsonl", encoding="utf-8")]
    for row in rows:
        assert {"cluster_s", "aggregate_s", "estimate_s", "fedavg_distance"} <= set(row)


def test_shared_memberships_pull_every_client_towards_the_fedavg_model():
    """With the same clusters on every client, Algorithm 5 is a projection: W_i − W̄ loses its
    cluster-mean component, so no client can move away from the FedAvg model (any β, any data)."""
    from trustformer.core.centroids import estimate_global_weights
    from trustformer.core.kmeans import choose_initial_rows, cluster_layers, lloyd_update

    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(96, 16, generator=gen)
    for beta in (0.1, 0.5, 0.9):
        k = num_clusters(96, beta)
        start = w0[choose_initial_rows(96, k, seed=1)]
        labels = cluster_layers({"w": w0}, {"w": start})["w"].labels
        clients = [w0 + 0.3 * torch.randn(96, 16, generator=gen) for _ in range(3)]
        mean = sum(clients) / 3
        local = [lloyd_update(c, labels, start) for c in clients]
        global_ = sum(local) / 3
        for c, l in zip(clients, local):
            moved = estimate_global_weights(c, labels, l, global_)
            assert (moved - mean).norm() <= (c - mean).norm() + 1e-5
            # and the cluster means now agree exactly with the FedAvg model's
            assert torch.allclose(lloyd_update(moved, labels, start), lloyd_update(mean, labels, start), atol=1e-5)


def test_shared_memberships_are_identical_on_every_client_and_beta_one_is_fedavg(tmp_path):
    states = []
    real = trustformer_module.Trustformer._shared_payload

    def spy(self, session, matrices):
        out = real(self, session, matrices)
        states.append({n: t.clone() for n, t in session.protocol_state.items()
                       if n.startswith(trustformer_module.LABELS)})
        return out

    import unittest.mock

    with unittest.mock.patch.object(trustformer_module.Trustformer, "_shared_payload", spy):
        run_in_process(tiny(tmp_path, "shared", **{"federation.beta": 0.5, "federation.memberships": "shared"}))
    assert len(states) == 6
    for other in states[1:]:
        assert states[0].keys() == other.keys()
        assert all(torch.equal(states[0][n], other[n]) for n in states[0])
    fedavg = run_in_process(tiny(tmp_path, "fedavg1", **{"federation.strategy": "fedavg"}))
    shared = run_in_process(tiny(tmp_path, "shared1", **{"federation.beta": 1.0, "federation.memberships": "shared"}))
    assert shared["test_loss"] == pytest.approx(fedavg["test_loss"], rel=1e-6, abs=1e-6)
