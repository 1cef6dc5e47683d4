"""FedProx (protocols/fedprox.py): the proximal term against a hand-computed reference, μ = 0 is FedAvg to the last
bit, μ > 0 pulls every client toward the global model, and its section is validated at load."""

from functools import partial

import pytest
import torch
from helpers import Quadratic, jsonl, session_of, tiny_config

from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import bare, make_protocol
from trustformer.protocols.fedprox import FedProx, proximal_step, proximal_term

tiny = partial(tiny_config, defaults={"federation.strategy": "fedprox"})


def test_the_proximal_term_is_half_mu_times_the_squared_distance():
    params = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    anchors = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    assert float(proximal_term(params, anchors, 0.5)) == pytest.approx(0.5 * 0.5 * (1 + 4 + 4))


def test_a_proximal_step_adds_mu_times_the_distance_to_the_gradient():
    """One SGD step on h(w) = F(w) + μ/2‖w − w0‖² from w ≠ w0 (the anchor is where training starts)."""
    start, target = torch.tensor([0.0, 0.0]), torch.tensor([[4.0, -2.0]])
    model = Quadratic(start)
    step = proximal_step(session_of(model), mu=2.0)  # anchor w0 = start
    with torch.no_grad():
        model.w.add_(torch.tensor([1.0, 1.0]))  # as if an earlier batch had moved w to (1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, count = step(model, optimizer, None, target)
    # grad = (w − t) + μ(w − w0) = (1−4, 1+2) + 2·(1, 1) = (−1, 5); w ← w − 0.1·grad
    assert model.w.detach().tolist() == pytest.approx([1.1, 0.5])
    assert float(loss) == pytest.approx(0.5 * (9 + 9)) and count == 1  # the reported loss is F alone


def test_a_proximal_step_clips_its_gradient_as_the_task_does():
    model = Quadratic(torch.zeros(2))
    session = session_of(model)
    session.grad_clip = 1.0
    step = proximal_step(session, mu=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    step(model, optimizer, None, torch.tensor([[30.0, 40.0]]))  # grad (−30, −40), norm 50, clipped to norm 1
    assert model.w.detach().tolist() == pytest.approx([0.3, 0.4])


def test_a_larger_mu_keeps_the_local_solution_closer_to_the_global_model():
    target = torch.tensor([[10.0, 10.0]])
    distances = []
    for mu in (0.0, 1.0, 10.0):
        model = Quadratic(torch.zeros(2))
        step = proximal_step(session_of(model), mu=mu)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(200):
            step(model, optimizer, None, target)
        distances.append(float(model.w.detach().norm()))
    # the minimiser of ½‖w − t‖² + μ/2‖w‖² is t/(1 + μ)
    assert distances == pytest.approx([10 * 2**0.5 / (1 + mu) for mu in (0.0, 1.0, 10.0)], rel=1e-3)


def test_fedprox_section_is_validated_and_round_trips(tmp_path):
    cfg = tiny(tmp_path, "cfg", **{"fedprox.mu": 0.1})
    assert cfg.section("fedprox").mu == 0.1 and cfg.flat()["fedprox.mu"] == 0.1
    assert type(cfg).from_json(cfg.to_json()) == cfg
    assert isinstance(bare(make_protocol(cfg)), FedProx) and bare(make_protocol(cfg)).mu == 0.1
    with pytest.raises(ConfigError, match="fedprox.mu"):
        tiny(tmp_path, "bad", **{"fedprox.mu": -0.5})
    with pytest.raises(ConfigError, match="fedprox.nu"):
        tiny(tmp_path, "typo", **{"fedprox.nu": 1})
    assert tiny(tmp_path, "default").section("fedprox").mu == 0.01


def _lines(cfg):
    return [r for r in jsonl(f"{cfg.out}/metrics.jsonl") if "test_loss" in r]


def test_mu_zero_is_fedavg_to_the_last_bit_and_mu_positive_is_not(tmp_path):
    fedavg_cfg = tiny(tmp_path, "fedavg", **{"federation.strategy": "fedavg", "federation.rounds": 2})
    fedavg = run_in_process(fedavg_cfg)
    zero_cfg = tiny(tmp_path, "mu0", **{"fedprox.mu": 0.0, "federation.rounds": 2})
    zero = run_in_process(zero_cfg)
    assert zero["strategy"] == "fedprox"
    assert [r["test_loss"] for r in _lines(zero_cfg)] == [r["test_loss"] for r in _lines(fedavg_cfg)]
    assert zero["test_loss"] == fedavg["test_loss"]
    strong_cfg = tiny(tmp_path, "mu1", **{"fedprox.mu": 1.0, "federation.rounds": 2})
    strong = run_in_process(strong_cfg)
    assert [r["test_loss"] for r in _lines(strong_cfg)] != [r["test_loss"] for r in _lines(fedavg_cfg)]
    assert strong["test_loss"] == pytest.approx(fedavg["test_loss"], rel=0.2)  # it still learns like FedAvg
