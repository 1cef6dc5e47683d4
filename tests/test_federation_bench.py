"""`trustformer bench federation`: the plan, the gains, the Pareto front and the tiny end-to-end table."""

import json
import math

import pytest

from trustformer.cli import main
from trustformer.config import ConfigError, load_config
from trustformer_lab.bench.federation_bench import gain_retained, mark_pareto, plan_runs
from trustformer_lab.bench.federation_plan import plan_download_runs, plan_extra_rows
from trustformer_lab.bench.federation_run import curve, finished
from trustformer_lab.bench.federation_table import _bytes_to_target


def test_plan_has_the_byte_matched_baselines_and_seeds_the_deciding_runs():
    runs = plan_runs([0.1, 0.5], [4, 2], [0, 1])
    labels = {r.label for r in runs}
    assert {
        "local",
        "fedavg",
        "fedavg 4-bit",
        "fedavg 2-bit",
        "trustformer β=0.1",
        "trustformer β=0.5",
        "trustformer β=0.1 4-bit",
        "trustformer β=0.5 4-bit",
        "trustformer β=0.1 2-bit",
        "trustformer β=0.5 2-bit",
        "fedavg every 10",
        "fedavg every 2",
        "top-k 0.05",
        "top-k 0.25",
        "trustformer β=0.1 +secagg",
        "trustformer β=0.5 +secagg",
        "fedavg +secagg",
        "dp-fedavg",
        "dp-fedsam",
        "dp-blur-lus",
    } == labels
    seeds = {}
    for r in runs:
        seeds.setdefault(r.label, []).append(r.seed)
    assert seeds["trustformer β=0.1"] == [0, 1] and seeds["dp-fedavg"] == [0] and seeds["fedavg +secagg"] == [0]
    keep = {r.beta: r.overrides["fedavg-topk.keep"] for r in runs if r.label.startswith("top-k")}
    assert keep == {0.1: 0.05, 0.5: 0.25}  # an index travels with every value: β/2 costs β of the bytes
    both = plan_runs([0.5, 0.7], [4], [0, 1])  # ⌈1/0.5⌉ = ⌈1/0.7⌉ = 2: FedAvg every 2 runs once per seed
    assert [(r.label, r.seed) for r in both].count(("fedavg every 2", 0)) == 1
    assert gain_retained(4.0, local=5.0, fedavg=4.0) == 1.0 and gain_retained(5.0, 5.0, 4.0) == 0.0
    assert gain_retained(12.0, local=10.0, fedavg=14.0, higher_is_better=True) == 0.5
    assert math.isnan(gain_retained(4.0, local=4.0, fedavg=4.5))


def row(name, gain, up, adv, spread=math.nan):
    return {"run": name, "gain_loss": gain, "gain_loss_spread": spread, "upload_vs_fedavg": up, "mia_advantage": adv}


def test_the_pareto_front_calls_differences_below_the_seed_spread_ties():
    rows = [
        row("a", 1.0, 1.0, 0.3, 0.05),
        row("b", 0.97, 0.5, 0.3, 0.05),
        row("c", 0.5, 0.5, 0.3),
        row("d", 0.5, 0.1, 0.0),
        row("e", 0.9, 0.5, 0.3),
    ]
    mark_pareto(rows, "gain_loss", "front")
    assert [r["run"] for r in rows if r["front"]] == ["b", "d"]
    assert rows[0]["front_by"] == ["b"]  # a: 0.03 more gain than b is within the seed spread, and b is cheaper
    # e: 0.07 less gain than b is beyond it
    assert rows[2]["front_by"] == ["b", "d", "e"] and rows[4]["front_by"] == ["b"]


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_tiny_benchmark_prints_writes_and_draws_the_frontier(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "federation",
            "--preset",
            "tiny",
            "--betas",
            "0.5",
            "--seeds",
            "0",
            "--rounds",
            "2",
            "--no-dp",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(out),
            "--figure",
            str(tmp_path / "frontier.png"),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "front" in printed and "FedAvg − local" in printed
    rows = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    assert {
        "local",
        "fedavg",
        "fedavg + fine-tuning",
        "trustformer β=0.5 4-bit",
        "fedavg every 2",
        "top-k 0.25",
        "trustformer β=0.5 +secagg",
    } <= set(rows)
    assert rows["fedavg"]["upload_vs_fedavg"] == 1.0 and rows["local"]["upload_vs_fedavg"] < 0.05
    assert rows["fedavg every 2"]["upload_vs_fedavg"] == pytest.approx(0.5, abs=0.05)
    assert 0.4 < rows["trustformer β=0.5"]["upload_vs_fedavg"] < 0.7
    assert (
        rows["trustformer β=0.5 4-bit"]["upload_vs_fedavg"]
        < 0.25 * rows["trustformer β=0.5"]["upload_vs_fedavg"] + 0.05
    )
    assert rows["fedavg"]["recovered"] == 1.0 and rows["trustformer β=0.5"]["recovered"] < 0.01
    assert rows["local"]["mia_advantage"] == 0.0  # the server holds nothing of a client that trains alone
    for r in rows.values():
        assert not math.isnan(r["loss"]) and not math.isnan(r["own_loss"]) and isinstance(r["pareto"], bool)
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    # --reuse: a second invocation trains nothing and rebuilds the same table from the runs' bench.json
    again = tmp_path / "again.json"
    assert (
        main(
            [
                "bench",
                "federation",
                "--preset",
                "tiny",
                "--betas",
                "0.5",
                "--seeds",
                "0",
                "--rounds",
                "2",
                "--no-dp",
                "--jobs",
                "1",
                "--out",
                str(tmp_path / "runs"),
                "--json",
                str(again),
                "--reuse",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "reusing" in err and "[1/" not in err
    assert json.loads(again.read_text())["rows"] == json.loads(out.read_text())["rows"]


def test_a_run_the_configuration_refuses_stops_the_benchmark_before_anything_trains(tmp_path, capsys):
    code = main(
        [
            "bench",
            "federation",
            "--preset",
            "tiny",
            "--betas",
            "0.5,0.7",
            "--seeds",
            "0",
            "--rounds",
            "2",
            "--no-dp",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "runs"),
        ]
    )
    assert code != 0
    err = capsys.readouterr().err
    assert "benchmark run 'trustformer β=0.7'" in err and "trustformer.min_cluster_rows" in err
    assert not (tmp_path / "runs").exists()


def test_download_rows_code_each_base_at_every_width_and_seed_the_target_widths():
    runs = plan_download_runs([8, 4, 2], [0, 1], bits=[4, 2], beta=0.5, ranks=[4, 16], public=True)
    labels = {(r.label, r.seed) for r in runs}
    assert ("fedavg 2-bit", 0) in labels and ("fedavg 2-bit · down 8", 0) in labels
    assert ("fedavg 2-bit · down 2", 1) in labels and ("fedavg 2-bit · down 4", 1) not in labels
    assert ("trustformer β=0.5 4-bit · down 4", 1) in labels
    assert ("public + fedavg lora r16 4-bit · down 4", 1) in labels and ("public + fedavg lora r4 4-bit", 0) in labels
    coded = next(r for r in runs if r.label == "public + fedavg lora r4 4-bit · down 2")
    assert coded.overrides["federation.download_bits"] == 2 and coded.overrides["model.lora_rank"] == 4
    assert coded.overrides["federation.payload_bits"] == 4


def test_the_curve_counts_both_ways_and_bytes_to_target_is_the_first_round_past_it(tmp_path):
    lines = [
        {"round": 1, "client": 0, "test_loss": 5.0, "bytes_up": 10, "bytes_down": 100},
        {"round": 1, "client": 1, "test_loss": 4.0, "bytes_up": 10, "bytes_down": 100},
        {"event": "dropped", "round": 1, "client": 2},
        {"round": 2, "client": 0, "test_loss": 3.0, "bytes_up": 10, "bytes_down": 5},
        {"round": 2, "client": 1, "test_loss": 3.0, "bytes_up": 10, "bytes_down": 5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    points = curve(tmp_path / "metrics.jsonl")
    assert points == [[1, 4.5, 220], [2, 3.0, 250]]
    local = {"seeds": [0, 1], "loss_per_seed": [5.0, 5.0]}
    fedavg = {"seeds": [0, 1], "loss_per_seed": [3.0, 4.5]}  # targets: 3.2 (seed 0), 4.55 (seed 1)
    row = {"seeds": [0, 1], "curves": [points, points]}
    _bytes_to_target(row, local, fedavg)
    assert row["bytes_to_target_per_seed"] == [250.0, 220.0] and row["bytes_to_target"] == 235.0
    slow = {"seeds": [0], "curves": [[[1, 4.5, 220], [2, 3.5, 250]]]}
    _bytes_to_target(slow, local, fedavg)
    assert slow["bytes_to_target_per_seed"] == [None] and math.isnan(slow["bytes_to_target"])


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_tiny_download_rows_print_bytes_both_ways_and_draw_the_curves(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "federation",
            "--preset",
            "tiny",
            "--betas",
            "0.5",
            "--bits",
            "4,2",
            "--download-bits",
            "2",
            "--only",
            "download",
            "--no-attacks",
            "--seeds",
            "0",
            "--rounds",
            "2",
            "--no-dp",
            "--no-secagg",
            "--jobs",
            "1",
            "--set",
            "federation.finetune_epochs=0",
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(out),
            "--curves",
            str(tmp_path / "curves.png"),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "to 90% MB" in printed and "fedavg 2-bit · down 2" in printed
    rows = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    assert "fedavg + fine-tuning" not in rows  # no fine-tuning ran: no such rows
    plain, coded = rows["fedavg 2-bit"], rows["fedavg 2-bit · down 2"]
    assert plain["download_vs_fedavg"] == 1.0 and coded["download_vs_fedavg"] < 0.2
    assert coded["upload_vs_fedavg"] == pytest.approx(plain["upload_vs_fedavg"], rel=0.01)
    assert coded["total_bytes"] < 0.3 * plain["total_bytes"]
    assert coded["download_code_s_per_round"] > 0 and plain["download_code_s_per_round"] == 0
    assert math.isnan(coded["mia_advantage"])  # --no-attacks
    assert rows["fedavg"]["bytes_to_target"] == rows["fedavg"]["total_bytes"]  # FedAvg reaches it in its last round
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_reuse_takes_a_run_measured_before_a_record_dp_default_changed_only_where_dp_is_off(tmp_path):
    """``--reuse``: privacy.batch_size only changes record-level DP-SGD, so a FedAvg run measured at its old default
    is taken; a record-DP run at another batch size, or a run of another protocol, is not."""

    def stored(cfg, **privacy):
        config = cfg.to_dict()
        config["privacy"] = {**config["privacy"], **privacy}
        (tmp_path / "bench.json").write_text(json.dumps({"config": config, "attacks": False}), encoding="utf-8")

    fedavg = load_config("tiny", None, {"out": str(tmp_path), "federation.strategy": "fedavg"})
    stored(fedavg, batch_size=0)
    assert finished(fedavg, attacks=False) is not None
    assert finished(load_config("tiny", None, {"out": str(tmp_path), "federation.strategy": "local"}), False) is None
    record = load_config("tiny", None, {"out": str(tmp_path), "privacy.unit": "record", "privacy.delta": 1e-5})
    stored(record, batch_size=0)
    assert finished(record, attacks=False) is None
    stored(record)
    assert finished(record, attacks=False) is not None


def test_a_row_runs_with_every_seed_or_with_its_own():
    both = plan_extra_rows(["fedprox: federation.strategy=fedprox"], [0, 1])
    assert [r.seed for r in both] == [0, 1] and both[0].overrides == {"federation.strategy": "fedprox"}
    once = plan_extra_rows(["fedprox: federation.strategy=fedprox seeds=1"], [0, 1])
    assert [r.seed for r in once] == [1] and once[0].overrides == {"federation.strategy": "fedprox"}
    for bad in ("seeds=2", "seeds=x", "seeds="):
        with pytest.raises(ConfigError, match="must name some of --seeds"):
            plan_extra_rows([f"fedprox: federation.strategy=fedprox {bad}"], [0, 1])
