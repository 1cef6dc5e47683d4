"""`trustformer attack reconstruct`: the honest-but-curious server's estimates, measured on real runs."""

import json
from functools import partial

import pytest
import torch
from helpers import tiny_config

from trustformer.cli import main
from trustformer.config import ConfigError, load_config
from trustformer.protocols import ObservedProtocol, ProtocolObserver, get_protocol, observe
from trustformer_lab.attack import reconstruct as rec

TINY = {  # this module's tiny run (helpers.tiny_config)
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
}
tiny = partial(tiny_config, defaults=TINY)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Each configuration is run (and attacked) once for the whole module."""
    root = tmp_path_factory.mktemp("attack")
    cache = {}

    def run(name, **overrides):
        if name not in cache:
            cache[name] = rec.run_attack(tiny(root, name, **overrides))
        return cache[name]

    return run


def test_fedavg_is_recovered_exactly(attacked):
    result = attacked("fedavg", **{"federation.strategy": "fedavg"})
    assert result["server_sees"] == "every payload"
    assert result["recovered_fraction"] == [1.0, 1.0, 1.0]
    assert max(result["relative_error"]) < 1e-6
    assert all(r["recovered_fraction_mean"] == 1.0 for r in result["rounds"])
    assert result["initial_error_mean"] > 0.01  # training moved the models: exactness is not trivial


def test_secure_aggregation_leaves_only_the_mean(attacked):
    plain = attacked("fedavg", **{"federation.strategy": "fedavg"})
    masked = attacked("fedavg-secagg", **{"federation.strategy": "fedavg", "secure.mode": "secagg"})
    assert masked["server_sees"] == "aggregate only"
    assert masked["relative_error_mean"] > 1e-3
    assert masked["recovered_fraction_mean"] < 0.05  # only weights every client left equal to the mean
    assert plain["recovered_fraction_mean"] == 1.0


def test_trustformer_at_beta_one_is_fedavg_and_recovered_exactly(attacked):
    result = attacked(
        "tf-1", **{"federation.strategy": "trustformer", "trustformer.beta": 1.0, "trustformer.min_cluster_rows": 1}
    )
    assert result["recovered_fraction_mean"] == 1.0
    assert result["relative_error_mean"] < 1e-6


def test_trustformer_half_recovers_less_than_fedavg_but_uses_the_payload(attacked):
    result = attacked("tf-0.5", **{"federation.strategy": "trustformer", "trustformer.beta": 0.5})
    fedavg = attacked("fedavg", **{"federation.strategy": "fedavg"})
    assert result["recovered_fraction_mean"] < fedavg["recovered_fraction_mean"]
    assert result["relative_error_mean"] > 1e-3
    # an estimator that ignored the payload would score the reference's error: first exchange = the
    # public initial model
    first = result["rounds"][0]
    assert first["relative_error_mean"] < 0.8 * first["initial_error_mean"]
    assert result["relative_error_mean"] < 0.8 * result["initial_error_mean"]
    assert result["memberships_source"]  # says how the memberships were obtained


def test_centroid_estimate_keeps_reference_deviations_and_received_means():
    torch.manual_seed(0)
    true = torch.randn(6, 3)
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    centroids = torch.stack([true[labels == j].mean(0) for j in range(3)])
    # reference = truth shifted by one offset per cluster: the estimate undoes the shift exactly
    offsets = torch.randn(3, 3)
    reference = true + offsets[labels]
    est = rec.centroid_estimate(reference, centroids, labels)
    assert torch.allclose(est, true.double(), atol=1e-6)
    # singleton clusters (row 2) come out as sent, whatever the reference
    est = rec.centroid_estimate(torch.zeros(6, 3), centroids, labels)
    assert torch.equal(est[2].float(), true[2])
    rows = torch.tensor([[0.0], [0.9], [2.1], [5.0], [1.0]])
    assert rec.nearest_centroid(rows, torch.tensor([[0.0], [2.0], [1.0], [1.0]])).tolist() == [0, 2, 1, 1, 2]


def test_score_counts_weights_within_tolerance():
    true = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[2.0]])}
    est = {"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([[2.0 + 1e-7]])}
    error, fraction = rec.score(est, true)
    assert fraction == pytest.approx(2 / 3)
    assert error == pytest.approx(0.5 / 3.0, rel=1e-5)


def test_observed_protocol_behaves_as_the_wrapped_one():
    cfg = load_config("tiny", None, {"federation.strategy": "fedavg"})
    assert not isinstance(get_protocol(cfg), ObservedProtocol)
    with observe(ProtocolObserver()):
        wrapped = get_protocol(cfg)
        assert isinstance(wrapped, ObservedProtocol)
        assert wrapped.name == "fedavg" and wrapped.spec.exchanges
        assert getattr(wrapped, "server_round", None) is None  # optional hooks stay optional
    assert not isinstance(get_protocol(cfg), ObservedProtocol)


def test_plan_refuses_unknown_names_and_skips_unsupported_combinations():
    cfg = load_config("tiny", None, {})
    with pytest.raises(ConfigError, match="--strategies"):
        rec.plan(cfg, ["fedavg", "nope"], None, None, None)
    with pytest.raises(ConfigError, match="--secure-modes"):
        rec.plan(cfg, ["fedavg"], None, None, ["magic"])
    with pytest.raises(ConfigError, match="--memberships"):
        rec.plan(cfg, ["trustformer"], None, ["global"], None)
    runs, skipped = rec.plan(
        cfg, ["fedavg", "trustformer", "fedavg-topk"], [0.1, 0.5], ["shared", "local"], ["none", "secagg"]
    )
    labels = [r.label for r in runs]
    assert "fedavg +secagg" in labels and "trustformer β=0.1 local +secagg" in labels
    assert "fedavg-topk keep=0.5" in labels
    assert len(labels) == 2 + 8 + 2
    assert any(s.startswith("fedavg-topk keep=0.1 +secagg") for s in skipped)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "attack.json"
    code = main(
        [
            "attack",
            "reconstruct",
            "--preset",
            "tiny",
            "--strategies",
            "fedavg,local",
            "--quiet",
            "--set",
            "eval.bleu_size=4",
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "fedavg" in printed and "rel. error" in printed
    body = json.loads(out.read_text())
    fedavg, local = body["runs"]
    assert fedavg["recovered_fraction_mean"] == 1.0
    assert set(fedavg) >= {
        "relative_error",
        "recovered_fraction",
        "relative_error_mean",
        "recovered_fraction_mean",
        "rounds",
        "clients",
    }
    assert local["server_sees"] == "nothing"
    assert local["relative_error_mean"] == pytest.approx(local["initial_error_mean"])


def test_cli_names_the_option_to_fix(capsys):
    assert main(["attack", "reconstruct", "--preset", "tiny", "--strategies", "fedavg,bogus"]) == 2
    assert "--strategies" in capsys.readouterr().err
