"""SCAFFOLD (protocols/scaffold.py): the corrected step and option II's control variate against the paper's formulas
by hand, the server's c ← c + (|S|/N)·mean Δc_i, round 1 equal to FedAvg to the last bit (c = c_i = 0) and later
rounds not, and record-level DP refused at load."""

from functools import partial

import pytest
import torch
from helpers import Quadratic, begin_server, jsonl, session_of, tiny_config

from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import bare, make_protocol
from trustformer.protocols.scaffold import C_I, CONTROL, C, Scaffold, corrected_step

tiny = partial(tiny_config, defaults={"federation.strategy": "scaffold"})


def test_the_step_descends_along_the_gradient_corrected_by_c_minus_c_i():
    model = Quadratic(torch.zeros(2))
    c, c_i = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    session = session_of(model, {C + "w": c, C_I + "w": c_i}, rnd=2)
    step = corrected_step(session)
    step(model, torch.optim.SGD(model.parameters(), lr=0.1), None, torch.tensor([[4.0, -2.0]]))
    # g = w − t = (−4, 2); g − c_i + c = (−3, 0); w ← −0.1·(−3, 0)
    assert model.w.detach().tolist() == pytest.approx([0.3, 0.0])
    assert session.protocol_state["scaffold/grad_sum/w"].tolist() == pytest.approx([-4.0, 2.0])  # the raw gradient


def test_option_two_control_variate_is_the_mean_raw_gradient_and_matches_the_paper_under_sgd():
    """c_i⁺ = c_i − c + (x − y_i)/(K η_l) (Alg. 1, line 12, option II), after K plain SGD steps from x."""
    x, lr, steps = torch.tensor([0.5, -1.0]), 0.05, 7
    c, c_i = torch.tensor([0.3, -0.2]), torch.tensor([-0.1, 0.4])
    model = Quadratic(x)
    session = session_of(model, {C + "w": c, C_I + "w": c_i}, rnd=2)
    step, optimizer = corrected_step(session), torch.optim.SGD(model.parameters(), lr=lr)
    for k in range(steps):
        step(model, optimizer, None, torch.tensor([[float(k), 2.0 - k]]))
    payload, _ = Scaffold.client_payload(None, session)
    y = model.w.detach()
    paper = c_i - c + (x - y) / (steps * lr)
    assert torch.allclose(payload[CONTROL + "w"], paper - c_i, atol=1e-5)  # Δc_i = c_i⁺ − c_i
    assert torch.allclose(session.protocol_state[C_I + "w"], paper, atol=1e-5)
    assert torch.equal(payload["w"], y)
    assert "scaffold/grad_sum/w" not in session.protocol_state  # the sum starts again for the next exchange


@pytest.mark.parametrize("per_round, share", [(0, 1.0), (2, 2 / 3)])
def test_the_server_adds_the_share_of_clients_times_the_weighted_mean_of_the_controls(tmp_path, per_round, share):
    protocol = bare(make_protocol(tiny(tmp_path, **{"federation.clients_per_round": per_round})))
    begin_server(protocol, {"w": torch.tensor([0.0])})
    first = {"w": torch.tensor([1.0]), CONTROL + "w": torch.tensor([3.0])}
    second = {"w": torch.tensor([4.0]), CONTROL + "w": torch.tensor([-3.0])}
    out = protocol.aggregate(1, [first, second], [1, 2]).tensors
    assert out["w"].item() == pytest.approx(3.0)  # (1·1 + 2·4) / 3
    assert out[CONTROL + "w"].item() == pytest.approx(share * (3.0 - 6.0) / 3)
    again = protocol.aggregate(2, [first, first], [1, 1]).tensors  # c keeps what the last round added
    assert again[CONTROL + "w"].item() == pytest.approx(share * (-1.0) + share * 3.0)


def _losses(cfg):
    return [r["test_loss"] for r in jsonl(f"{cfg.out}/metrics.jsonl") if "test_loss" in r]


def test_round_one_is_fedavg_to_the_last_bit_and_the_controls_change_later_rounds(tmp_path):
    fedavg_cfg = tiny(tmp_path, "fedavg", **{"federation.strategy": "fedavg", "federation.rounds": 2})
    run_in_process(fedavg_cfg)
    cfg = tiny(tmp_path, "scaffold", **{"federation.rounds": 2})
    summary = run_in_process(cfg)
    assert summary["strategy"] == "scaffold"
    fedavg, scaffold = _losses(fedavg_cfg), _losses(cfg)
    assert scaffold[:3] == fedavg[:3]  # round 1: c = c_i = 0, the step is the task's own
    assert scaffold[3:] != fedavg[3:] and scaffold[-1] == pytest.approx(fedavg[-1], rel=0.1)


def test_record_level_dp_is_refused_at_load_naming_the_option(tmp_path):
    with pytest.raises(ConfigError, match="privacy.unit"):
        tiny(tmp_path, **{"privacy.unit": "record", "privacy.epsilon": 8.0})
