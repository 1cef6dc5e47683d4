"""`trustformer bench finetune`: each owner's free fine-tuning of a finished run's saved model, through the task's
own ``finetune`` on a real tiny public-start LoRA run."""

from __future__ import annotations

import json
from statistics import mean

import pytest
import torch

from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process
from trustformer_lab.bench.finetune_bench import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    values = {
        "out": str(out),
        "train.init": "public",
        "train.public_epochs": 1,
        "model.adapters": "lora",
        "model.lora_rank": 4,
        "data.partition": "domain",
        "data.own_test_size": 20,
        "runtime.progress": False,
        "eval.meteor": False,
        "eval.bertscore": False,
        "eval.bleu_size": 4,
        "eval.beam_size": 1,
    }
    return out, run_in_process(load_config("tiny", None, values))


def test_the_sweep_starts_from_what_the_run_scored_and_fine_tunes_every_owner(lora_run, tmp_path, capsys):
    out, summary = lora_run
    table = tmp_path / "ft.json"
    assert main([str(out), "--epochs", "2", "--rate", "1", "--public", "--json", str(table)]) == 0
    rows = {(r["start"], r["epochs"]): r for r in json.loads(table.read_text())["rows"]}
    assert set(rows) == {("run", 0), ("run", 2), ("public", 0), ("public", 2)}
    before, tuned = rows["run", 0], rows["run", 2]
    # epochs 0 is the saved model as the run scored it (merged adapters compute what the adapted model did)
    assert before["own_loss_per_owner"] == pytest.approx(summary["own_test_loss"], abs=1e-4)
    assert before["test_loss"] == pytest.approx(mean(summary["test_loss"]), abs=1e-4)
    assert before["test_bleu"] == pytest.approx(mean(summary["bleu"]), abs=1e-6)
    # fine-tuning trained each owner's copy on its own shard: a no-op fine-tuning fails here
    assert all(a != b for a, b in zip(before["own_loss_per_owner"], tuned["own_loss_per_owner"], strict=True))
    # the control starts from the public model the run began from (its cache key in summary.json)
    recorded = summary["data"]["clients"]["0"]["public_model_test_loss"]
    assert rows["public", 0]["test_loss"] == pytest.approx(recorded, abs=1e-4)
    assert rows["public", 0]["own_loss"] != before["own_loss"]
    assert "public" in capsys.readouterr().out


def test_bad_options_name_the_option(lora_run):
    out, _ = lora_run
    with pytest.raises(SystemExit, match="--rate"):
        main([str(out), "--rate", "0"])
    with pytest.raises(SystemExit, match="--clients"):
        main([str(out), "--clients", "7"])
