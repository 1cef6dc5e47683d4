"""`trustformer bench federation`: the plan, the gains, the Pareto front and the tiny end-to-end table."""

import json
import math

import pytest

from trustformer.bench.federation_bench import gain_retained, mark_pareto, plan_runs
from trustformer.cli import main


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
