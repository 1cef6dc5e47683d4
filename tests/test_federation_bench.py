"""`trustformer bench federation --preset tiny`: the table, its JSON and the byte-matched baselines."""

import json
import math

import pytest

from trustformer.bench.federation_bench import gain_retained, plan_runs
from trustformer.cli import main


def test_plan_has_byte_matched_baselines_per_beta():
    runs = plan_runs(["trustformer"], [0.1, 0.5], ["shared", "local"])
    labels = [r.label for r in runs]
    assert labels[:2] == ["local", "fedavg"]
    assert sum(r.strategy == "trustformer" for r in runs) == 4
    every = {r.beta: r.overrides["federation.agg_every"] for r in runs if "federation.agg_every" in r.overrides}
    assert every == {0.1: 10, 0.5: 2}
    keep = {r.beta: r.overrides["federation.topk_keep"] for r in runs if r.strategy == "fedavg-topk"}
    assert keep == {0.1: 0.05, 0.5: 0.25}  # an index travels with every value: β/2 costs β of the bytes
    assert gain_retained(4.0, local=5.0, fedavg=4.0) == 1.0 and gain_retained(5.0, 5.0, 4.0) == 0.0
    assert math.isnan(gain_retained(4.0, local=4.0, fedavg=4.5))


def test_tiny_benchmark_prints_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "federation", "--preset", "tiny", "--betas", "0.5", "--memberships", "shared",
                 "--rounds", "2", "--out", str(tmp_path / "runs"), "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "gain" in printed and "fedavg every 2" in printed and "FedAvg − local" in printed
    result = json.loads(out.read_text())
    rows = {r["run"]: r for r in result["rows"]}
    assert set(rows) == {"local", "fedavg", "trustformer β=0.5 shared", "fedavg every 2 (β=0.5)",
                         "fedavg-topk 0.25 (β=0.5)"}
    assert rows["fedavg"]["upload_vs_fedavg"] == 1.0
    assert rows["local"]["upload_vs_fedavg"] < 0.05
    assert rows["fedavg every 2 (β=0.5)"]["upload_vs_fedavg"] == pytest.approx(0.5, abs=0.05)
    assert 0.4 < rows["trustformer β=0.5 shared"]["upload_vs_fedavg"] < 0.7
    for row in rows.values():
        assert len(row["test_loss"]) == 3 and row["wall_s"] > 0
        assert row["test_loss_mean"] == pytest.approx(sum(row["test_loss"]) / 3)
    if not math.isnan(rows["fedavg"]["gain_retained"]):
        assert rows["fedavg"]["gain_retained"] == pytest.approx(1.0)
        assert rows["local"]["gain_retained"] == pytest.approx(0.0)


def test_reuse_takes_only_a_finished_run_of_the_same_configuration(tmp_path):
    from trustformer.bench.federation_bench import _finished
    from trustformer.config import load_config

    cfg = load_config("tiny", None, {"out": str(tmp_path / "run")})
    assert _finished(cfg) is None  # nothing there
    (tmp_path / "run").mkdir()
    summary = {"config": cfg.to_dict(), "rounds": cfg.federation.rounds, "time_s": {"total": 1.0}}
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    assert _finished(cfg) == summary
    other = load_config("tiny", None, {"out": str(tmp_path / "run"), "train.lr": 0.5})
    assert _finished(other) is None  # another configuration in the same folder is trained again
    (tmp_path / "run" / "summary.json").write_text("{not json")
    assert _finished(cfg) is None


def test_attack_column_shows_what_the_server_recovers(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "federation", "--preset", "tiny", "--betas", "0.5", "--memberships", "rotating",
                 "--attack", "--no-baselines", "--rounds", "2", "--out", str(tmp_path / "runs"), "--json", str(out)])
    assert code == 0
    assert "recovered" in capsys.readouterr().out
    rows = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"local", "fedavg", "trustformer β=0.5 rotating"}
    assert rows["fedavg"]["attack_recovered_fraction"] == 1.0 and rows["fedavg"]["attack_relative_error"] < 1e-6
    tf = rows["trustformer β=0.5 rotating"]
    assert tf["attack_recovered_fraction"] < 0.01 and tf["attack_relative_error"] > 1e-3  # the floor: no row verbatim
