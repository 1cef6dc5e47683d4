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


def test_clusters_are_aligned_across_clients(tmp_path, monkeypatch):
    """Round 1 starts every client from the same rows of the initial model; later exchanges from
    the previous global centroids, identical on every client."""
    seen = []
    real = trustformer_module.cluster_layers

    def spy(matrices, inits, **kwargs):
        seen.append({k: v.clone() for k, v in inits.items()})
        return real(matrices, inits, **kwargs)

    monkeypatch.setattr(trustformer_module, "cluster_layers", spy)
    cfg = tiny(tmp_path, "align", **{"federation.beta": 0.5})
    run_in_process(cfg)
    assert len(seen) == 6  # 3 clients x 2 exchanges
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
