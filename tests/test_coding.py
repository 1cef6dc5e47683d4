"""Payload coding (federation.payload_bits): differences from what both ends hold, quantized, decoded by the
server before the protocol sees them; bytes counted on the real messages."""

from functools import partial

import pytest
import torch
from helpers import begin_server, jsonl, tiny_config

from trustformer.config import ConfigError
from trustformer.core.shared import trainable_tensors
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import ProtocolObserver, bare, make_protocol, observe
from trustformer.protocols.interface.base import ClientSession
from trustformer.protocols.wrappers.coding import CODES, GRID, CodedPayload
from trustformer.tasks.run import load_task

TINY = {  # this module's tiny run (helpers.tiny_config)
    "runtime.threads": 1,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
}
tiny = partial(tiny_config, defaults=TINY)


def up_bytes(cfg):
    rows = [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "event" not in r]
    return sum(r["bytes_up"] for r in rows) / len(rows)


@pytest.mark.parametrize("strategy", ["fedavg", "trustformer"])
def test_coded_runs_send_a_fraction_of_the_bytes_and_learn_as_much(tmp_path, strategy):
    plain = tiny(tmp_path, f"{strategy}-32", **{"federation.strategy": strategy})
    coded = tiny(tmp_path, f"{strategy}-4", **{"federation.strategy": strategy, "federation.payload_bits": 4})
    a, b = run_in_process(plain), run_in_process(coded)
    assert up_bytes(coded) < 0.3 * up_bytes(plain)  # a no-op quantizer would send as much as float32
    assert b["test_loss"] == pytest.approx(a["test_loss"], abs=2e-3)  # and the model learns the same


class Sent(ProtocolObserver):
    def __init__(self):
        self.sent, self.received = {}, []

    def client_sent(self, rnd, client, payload):
        self.sent[(rnd, client)] = payload

    def server_received(self, payloads, num_examples):
        self.received.append(payloads)


def test_the_server_decodes_each_payload_within_one_step_of_the_difference_from_the_global_model(tmp_path):
    """FedAvg at 8 bits: the decoded model is within one grid step of what the client sent, a step set by the
    range of the client's *difference* from the last global model, not by the range of its weights."""
    cfg = tiny(tmp_path, "x", **{"federation.payload_bits": 8, "federation.rounds": 2})
    watch = Sent()
    with observe(watch):
        run_in_process(cfg)
    initial = trainable_tensors(load_task(cfg).initial_model())
    for decoded in watch.received[1]:  # round 2: the difference from round 1's global model
        client = min(
            watch.sent,
            key=lambda k: (
                sum(float((watch.sent[k][n] - decoded[n]).abs().max()) for n in decoded) if k[0] == 2 else float("inf")
            ),
        )
        sent = watch.sent[client]
        for name in ("encoder.layers.0.ffn.0.weight", "embedding.weight"):
            if name not in sent:
                continue
            error = float((decoded[name] - sent[name]).abs().max())
            weights_step = float((initial[name].max() - initial[name].min()) / 255)
            assert error < 0.25 * weights_step, name  # coding the weights themselves could not be this close


def test_error_feedback_keeps_what_was_not_sent(tmp_path):
    cfg = tiny(tmp_path, "x", **{"federation.payload_bits": 2})
    protocol = make_protocol(cfg)
    assert isinstance(protocol, CodedPayload) and bare(protocol).name == "fedavg"
    task = load_task(cfg)
    model = task.initial_model()
    session = ClientSession(
        cfg=cfg,
        client=0,
        round=1,
        model=model,
        num_examples=10,
        initial_tensors=lambda: trainable_tensors(task.initial_model()),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    payload, phases = protocol.client_payload(session)
    assert set(payload) == {CODES, GRID} and payload[CODES].dtype == torch.uint8 and phases["code_s"] >= 0
    residuals = {n: t for n, t in session.protocol_state.items() if n.startswith("coded/residual/")}
    assert residuals and any(float(t.abs().max()) > 0 for t in residuals.values())
    server = make_protocol(cfg)
    begin_server(server, trainable_tensors(task.initial_model()))
    spec = server.expected_payload(trainable_tensors(task.initial_model()))
    assert {n: tuple(payload[n].shape) for n in payload} == {n: s for n, (s, _d) in spec.items()}
    decoded = server.decode(1, payload)
    for name, tensor in trainable_tensors(model).items():  # decoded + residual = what the client meant to send
        assert torch.allclose(decoded[name] + residuals["coded/residual/" + name], tensor, atol=1e-6), name


def test_coding_is_refused_where_it_would_change_a_guarantee(tmp_path):
    with pytest.raises(ConfigError, match="cannot carry coded payloads"):
        tiny(tmp_path, "x", **{"federation.payload_bits": 8, "secure.mode": "secagg"})
    with pytest.raises(ConfigError, match="privacy accounting"):
        tiny(tmp_path, "x", **{"federation.payload_bits": 8, "federation.strategy": "dp-fedavg"})
    assert not isinstance(make_protocol(tiny(tmp_path, "x")), CodedPayload)  # 32 bits: today's protocol itself


def _residual_norm(tmp_path, rounding):
    """A client's 2-bit upload of a small random step from the initial model: the norm of the coding error it keeps
    (its residual) and the payload it sends."""
    cfg = tiny(tmp_path, rounding, **{"federation.payload_bits": 2, "federation.payload_rounding": rounding})
    protocol = make_protocol(cfg)
    task = load_task(cfg)
    model = task.initial_model()
    session = ClientSession(
        cfg=cfg, client=0, round=1, model=model, num_examples=10,
        initial_tensors=lambda: trainable_tensors(task.initial_model()),
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    payload, _phases = protocol.client_payload(session)
    residuals = [t for n, t in session.protocol_state.items() if n.startswith("coded/residual/")]
    return float(torch.cat([t.flatten() for t in residuals]).norm()), payload


def test_rounding_to_nearest_halves_the_upload_coding_error(tmp_path):
    """``federation.payload_rounding = "nearest"``: the error a client keeps for its next upload has about half the
    stochastic rounding's squared norm (Δ²/12 against Δ²/6 per value on a uniform spread)."""
    stochastic, _ = _residual_norm(tmp_path, "stochastic")
    nearest, payload = _residual_norm(tmp_path, "nearest")
    print(f"residual norm at 2 bits: stochastic {stochastic:.4f}, nearest {nearest:.4f}")
    assert nearest < 0.8 * stochastic
    _again, repeated = _residual_norm(tmp_path / "again", "nearest")
    assert all(torch.equal(payload[n], repeated[n]) for n in payload)  # no draws: the same step codes the same


def test_rounding_to_nearest_is_refused_where_no_error_feedback_makes_up_for_its_bias(tmp_path):
    with pytest.raises(ConfigError, match="federation.payload_bits = 32 codes none"):
        tiny(tmp_path, "x", **{"federation.payload_rounding": "nearest"})
    with pytest.raises(ConfigError, match="trustformer.memberships = 'shared'"):
        tiny(
            tmp_path, "x", **{"federation.strategy": "trustformer", "federation.payload_bits": 4,
                              "federation.payload_rounding": "nearest"}
        )  # fmt: skip
    with pytest.raises(ConfigError, match="federation.payload_rounding = 'nearest' does not apply"):
        tiny(
            tmp_path, "x", **{"federation.strategy": "fedavg-topk", "federation.payload_bits": 4,
                              "federation.payload_rounding": "nearest"}
        )  # fmt: skip
    shared = tiny(
        tmp_path, "x", **{"federation.strategy": "trustformer", "federation.payload_bits": 4,
                          "federation.payload_rounding": "nearest", "trustformer.memberships": "shared"}
    )  # fmt: skip
    assert isinstance(make_protocol(shared), CodedPayload)
