"""FedAvg of top-k sparsified updates (the byte-matched compression baseline) through the real round loop."""

from functools import partial

import pytest
import torch
from helpers import tiny_config

from trustformer.config import load_config
from trustformer.core.dp import flatten
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols.fedavg_topk import FedAvgTopK
from trustformer.protocols.interface.base import ClientSession

TINY = {  # this module's tiny run (helpers.tiny_config)
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
}
tiny = partial(tiny_config, defaults=TINY)


def test_keeping_every_coordinate_is_fedavg(tmp_path):
    fedavg = run_in_process(tiny(tmp_path, "fedavg", **{"federation.strategy": "fedavg"}))
    full = run_in_process(tiny(tmp_path, "topk", **{"federation.strategy": "fedavg-topk", "fedavg-topk.keep": 1.0}))
    assert full["test_loss"] == pytest.approx(fedavg["test_loss"], abs=1e-4)


def test_sparse_exchange_syncs_clients_and_costs_indices_and_values(tmp_path):
    summary = run_in_process(tiny(tmp_path, "topk", **{"federation.strategy": "fedavg-topk", "fedavg-topk.keep": 0.1}))
    local = run_in_process(tiny(tmp_path, "local", **{"federation.strategy": "local"}))
    assert len(set(summary["test_loss"])) == 1  # every client adopted the same global model
    assert summary["test_loss"] != pytest.approx(local["test_loss"], abs=1e-4)
    ratio = summary["bytes"]["up_per_client_per_round"] / summary["bytes"]["fedavg_model_bytes"]
    assert 0.18 < ratio < 0.25  # 10% of the coordinates, 4-byte index + 4-byte value each, plus records


def test_aggregate_is_weighted_mean_of_sparse_updates_and_error_feedback_keeps_the_rest():
    cfg = load_config("tiny", None, {"federation.strategy": "fedavg-topk", "fedavg-topk.keep": 0.5})
    protocol = FedAvgTopK(cfg)
    payloads = [
        {"indices": torch.tensor([0, 2], dtype=torch.int32), "values": torch.tensor([1.0, 2.0])},
        {"indices": torch.tensor([2, 3], dtype=torch.int32), "values": torch.tensor([4.0, -1.0])},
    ]
    out = protocol.aggregate(1, payloads, [1, 3]).tensors
    assert out["indices"].tolist() == [0, 2, 3]
    assert out["values"].tolist() == pytest.approx([0.25, 0.5 + 3.0, -0.75])

    model = torch.nn.Linear(2, 2, bias=False)
    initial = {"weight": torch.zeros(2, 2)}
    session = ClientSession(cfg=cfg, client=0, round=1, model=model, num_examples=1, initial_tensors=lambda: initial)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, -0.1], [0.2, -4.0]]))
    payload, _ = protocol.client_payload(session)
    assert payload["indices"].tolist() == [0, 3] and payload["values"].tolist() == pytest.approx([3.0, -4.0])
    assert flatten({"r": session.protocol_state["residual"]}).tolist() == pytest.approx([0.0, -0.1, 0.2, 0.0])
