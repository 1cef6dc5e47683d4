"""`trustformer bench dp-recipe`: each lever becomes a row of the frontier's table, at one ε, from the public start."""

import json

import pytest

from trustformer.cli import main
from trustformer_lab.bench.dp_recipe_bench import federation_argv, lever_options, parse_args


def test_each_lever_is_its_options_and_the_rows_share_the_baseline():
    assert lever_options(["lr×4"], lr=0.004, client_size=3000) == {"privacy.batch_size": 1024, "train.lr": 0.016}
    # the benchmark's record rows run the winner with the fine-tuning at the run's own rate
    from trustformer_lab.bench.federation_plan import RECORD_DP

    recipe = lever_options(["recipe"], lr=0.004, client_size=3000)
    assert recipe == {k: v for k, v in RECORD_DP.items() if k in recipe} and "train.lr" not in recipe
    assert lever_options(["B=full", "adam-bc"], lr=0.004, client_size=3000) == {
        "privacy.batch_size": 3000,
        "privacy.adam_correction": True,
    }
    with pytest.raises(Exception, match="unknown lever"):
        lever_options(["nope"], lr=0.004, client_size=3000)
    argv = federation_argv(
        parse_args(["--levers", "baseline,ffa", "--combine", "B=1024+adam-bc"]), lr=0.004, client_size=3000
    )
    rows = [argv[i + 1] for i, a in enumerate(argv) if a == "--row"]
    assert len(rows) == 3 and all("privacy.unit=record" in r and "privacy.epsilon=8.0" in r for r in rows)
    assert "model.lora_train=b" in rows[1] and "privacy.adam_correction=true" in rows[2]


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_a_tiny_sweep_prints_the_gap_closed_per_lever(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    code = main(
        [
            "bench",
            "dp-recipe",
            "--preset",
            "tiny",
            "--levers",
            "baseline,adam-bc",
            "--rounds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(out),
            "--set",
            "train.public_epochs=1",
            "--set",
            "federation.finetune_epochs=0",
        ]
    )
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    swept = [r for name, r in rows.items() if " dp ε=8 " in name and not name.endswith("fine-tuning")]
    assert len(swept) == 2 and all(r["epsilon"] <= 8.0 + 1e-6 for r in swept)
    assert all("pgain_loss" in r for r in swept)
    assert "pgain" in capsys.readouterr().out
