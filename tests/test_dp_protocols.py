"""The DP baselines end to end on the tiny preset, through the Flower apps and the real wire format."""

from functools import partial

import pytest
import torch
from helpers import jsonl, tiny_config

from trustformer.app import FederationError, client_app
from trustformer.cli import main as cli_main
from trustformer.core.accounting import epsilon_after, solve_noise_multiplier
from trustformer.core.dp import keep_count
from trustformer.engine.inprocess import run_in_process
from trustformer.tasks.translation_workload import initial_model, load_workload

# one torch thread: on a busy 2-core machine, spinning worker threads make tiny runs several times slower
TINY = {  # this module's tiny run (helpers.tiny_config)
    "eval.diagnostics": True,  # fedavg_distance, unclipped norms, the measured secagg error
    "runtime.threads": 1,
    "federation.rounds": 1,
    "eval.bleu_size": 4,
}
tiny = partial(tiny_config, defaults=TINY)


def read_rows(cfg):
    lines = jsonl(f"{cfg.out}/metrics.jsonl")
    return [x for x in lines if "event" not in x], [x for x in lines if "event" in x]


def test_dp_fedavg_without_noise_and_clipping_equals_fedavg(tmp_path):
    """σ = 0 and C = ∞ (far above any update norm): W_global + mean(W_k − W_global) = mean(W_k),
    round after round (the global model is carried in every client's protocol state)."""
    fedavg = run_in_process(tiny(tmp_path, "fedavg", **{"federation.rounds": 2}))
    cfg = tiny(
        tmp_path,
        "dp",
        **{
            "federation.rounds": 2,
            "federation.strategy": "dp-fedavg",
            "privacy.noise_multiplier": 0.0,
            "privacy.clip_norm": 1e12,
            "privacy.on_exceed": "continue",
        },
    )
    dp = run_in_process(cfg)
    assert dp["test_loss"] == pytest.approx(fedavg["test_loss"], rel=1e-5, abs=1e-5)
    assert max(dp["fedavg_distance"]) < 1e-5
    assert dp["privacy"]["epsilon"] is None  # no noise: no finite epsilon
    assert dp["privacy"]["noise_multiplier"] == 0.0 and dp["privacy"]["rounds"] == 2
    rows, _ = read_rows(cfg)
    assert all(r["epsilon"] is None and r["update_norm"] > 0 for r in rows)


def _capture_replies(store):
    def call(message, context):
        reply = client_app(message, context)
        if message.metadata.message_type == "train" and "payload" in reply.content:
            store.append(reply.content)
        return reply

    return call


def test_dp_blur_lus_sends_the_sparse_encoding_and_reports_the_privacy_object(tmp_path):
    replies = []
    cfg = tiny(tmp_path, "blur", **{"federation.strategy": "dp-blur-lus"})
    summary = run_in_process(cfg, client_app=_capture_replies(replies))
    dim = sum(p.numel() for p in initial_model(cfg, load_workload(cfg)).parameters())
    kept = keep_count(dim, cfg.privacy.lus_keep)
    assert len(replies) == 3
    for content in replies:
        payload = content["payload"]
        assert set(payload) == {"indices", "values"}  # no dense tensor travels up (the server knows the dimension)
        indices = torch.from_numpy(payload["indices"].numpy())
        values = torch.from_numpy(payload["values"].numpy())
        assert indices.dtype == torch.int32 and values.dtype == torch.float32
        assert indices.numel() == values.numel() == kept
        assert int(indices.max()) < dim
        assert float(values.double().norm()) <= cfg.privacy.clip_norm * (1 + 1e-6)
    up = summary["bytes"]["up_per_client_per_round"]
    assert 8 * kept < up < 8 * kept + 2000  # 4 bytes of index + 4 of value per kept coordinate
    assert up < 0.25 * summary["bytes"]["fedavg_model_bytes"]
    assert summary["bytes"]["down_per_client_per_round"] < 8 * 3 * kept + 2000  # the union, still sparse
    assert len(set(summary["test_loss"])) == 1  # every client holds the same global model

    privacy = summary["privacy"]
    sigma = solve_noise_multiplier(1.0, 1e-3, 1.0, 1)
    assert privacy["noise_multiplier"] == pytest.approx(sigma, rel=1e-9)
    assert privacy["epsilon"] == pytest.approx(epsilon_after(sigma, 1.0, 1, 1e-3), rel=1e-12)
    assert 0.999 < privacy["epsilon"] <= 1.0
    assert {k: privacy[k] for k in ("delta", "clip_norm", "sampling_rate", "rounds")} == {
        "delta": 1e-3,
        "clip_norm": 0.5,
        "sampling_rate": 1.0,
        "rounds": 1,
    }
    assert "rdp" in privacy["accountant"] and "dp-accounting" in privacy["accountant"]
    rows, _ = read_rows(cfg)
    assert all(r["kept"] == kept and {"clip_s", "aggregate_s", "apply_s", "train_s"} <= set(r) for r in rows)


def test_dp_fedsam_with_client_sampling(tmp_path):
    """q = 0.5: each round only the sampled clients train and send; every client adopts the result."""
    cfg = tiny(
        tmp_path,
        "sam",
        **{
            "federation.strategy": "dp-fedsam",
            "federation.rounds": 2,
            "privacy.sampling_rate": 0.5,
            "privacy.noise_multiplier": 1.0,
            "privacy.epsilon": 100.0,
            # the seed's sampling, known to take some clients and leave others out
            "privacy.noise_source": "seeded-not-private",
        },
    )
    summary = run_in_process(cfg)
    rows, events = read_rows(cfg)
    assert summary["privacy"]["sampling_rate"] == 0.5 and summary["privacy"]["rounds"] == 2
    assert summary["privacy"]["epsilon"] == pytest.approx(epsilon_after(1.0, 0.5, 2, 1e-3), rel=1e-9)
    sampled = [r for r in rows if r["sampled"]]
    sat_out = [r for r in rows if not r["sampled"]]
    assert sampled and sat_out  # this seed samples some clients and leaves others out
    assert all("train_s" in r and r["bytes_up"] > 10_000 for r in sampled)
    assert all("train_s" not in r and r["bytes_up"] < 1000 and r["bytes_down"] > 10_000 for r in sat_out)
    for rnd in (1, 2):
        losses = {r["test_loss"] for r in rows if r["round"] == rnd}
        assert len(losses) <= 1  # sampled or not, every client holds the same global model
    assert len(set(summary["test_loss"])) == 1


def test_budget_refuses_to_start_or_stops_the_run(tmp_path, capsys):
    # sigma 0.5 for 2 rounds spends far more than epsilon = 1: nothing starts
    cfg = tiny(
        tmp_path,
        "refuse",
        **{"federation.strategy": "dp-fedavg", "federation.rounds": 2, "privacy.noise_multiplier": 0.5},
    )
    with pytest.raises(FederationError, match=r"refuses to start.*epsilon = .* more than privacy.epsilon = 1"):
        run_in_process(cfg)
    assert not (tmp_path / "refuse" / "metrics.jsonl").exists()
    code = cli_main(
        [
            "run",
            "--preset",
            "tiny",
            "--strategy",
            "dp-fedavg",
            "--rounds",
            "2",
            "--quiet",
            "--out",
            str(tmp_path / "refuse-cli"),
            "--set",
            "privacy.noise_multiplier=0.5",
            "--set",
            "runtime.threads=1",
        ]
    )
    assert code == 1 and "refuses to start" in capsys.readouterr().err

    # sigma enough for one round only, on_exceed = stop: round 1 runs, the run stops before round 2
    sigma = solve_noise_multiplier(1.0, 1e-3, 1.0, 1)
    cfg = tiny(
        tmp_path,
        "stop",
        **{
            "federation.strategy": "dp-fedavg",
            "federation.rounds": 2,
            "privacy.noise_multiplier": sigma,
            "privacy.on_exceed": "stop",
        },
    )
    summary = run_in_process(cfg)
    rows, events = read_rows(cfg)
    assert summary["rounds"] == 1 and summary["privacy"]["rounds"] == 1
    assert summary["privacy"]["epsilon"] <= 1.0 and summary["privacy"]["planned_rounds"] == 2
    assert {r["round"] for r in rows} == {1}
    assert [(e["event"], e["round"]) for e in events] == [("stopped", 2)]
    assert "privacy budget" in events[0]["reason"]
