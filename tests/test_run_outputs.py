"""What a run leaves a user: the models to translate with, experiment-tracker files, and clear errors."""

import pytest
from helpers import jsonl

from trustformer.cli import main
from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "fedavg"
    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(out),
            "runtime.progress": False,
            "runtime.threads": 1,
            "eval.bleu_size": 8,
            "eval.meteor": False,
            "eval.bertscore": False,
            "train.lr": 2e-2,
            "federation.rounds": 3,
            "runtime.log": ["tensorboard"],
        },
    )
    return cfg, run_in_process(cfg)


def test_clients_with_one_model_are_scored_once_and_its_model_is_saved_once(fedavg_run):
    cfg, summary = fedavg_run
    assert summary["scored_by"] == {"0": 0, "1": 0, "2": 0}  # FedAvg: one model, decoded by client 0
    assert len(set(summary["models"].values())) == 1
    folder = cfg.out + "/" + summary["models"]["0"]
    assert {"model.json", "model.safetensors", "tokenizer.model"} <= set(__import__("os").listdir(folder))
    assert len(set(summary["bleu"])) == 1


def test_translate_reads_the_run_folder(fedavg_run, capsys):
    cfg, summary = fedavg_run
    source, reference, hypothesis = summary["samples"]["0"][0]
    assert main(["translate", "--run", cfg.out, "--beam", str(cfg.eval.beam_size), source]) == 0
    assert capsys.readouterr().out.strip() == hypothesis.strip()  # the run's own decoding of that sentence
    assert main(["translate", "--run", cfg.out, "--client", "7", "x"]) == 1
    assert "its clients are 0, 1, 2" in capsys.readouterr().err


def test_tensorboard_files_are_written_and_read_back(fedavg_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, summary = fedavg_run
    events = EventAccumulator(cfg.out + "/tensorboard")
    events.Reload()
    rows = [r for r in jsonl(cfg.out + "/metrics.jsonl") if "event" not in r]
    got = sorted((e.step, e.value) for e in events.Scalars("client_1/test_loss"))
    want = sorted((r["round"], r["test_loss"]) for r in rows if r["client"] == 1)
    assert [s for s, _ in got] == [s for s, _ in want] == [1, 2, 3]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
    assert [e.value for e in events.Scalars("final/mean/test_loss")] == [pytest.approx(summary["test_loss"][0])]


def test_data_naming_a_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["run", "--preset", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "x"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "is a folder" in err and "Traceback" not in err


def test_docs_outputs_lists_every_file_of_the_run_folder(fedavg_run):
    """docs/outputs.md names every file and folder a run folder holds (a round number as <round>, a client id as
    <id>), so a user finds out what each one is."""
    import re
    from pathlib import Path

    cfg, _ = fedavg_run
    text = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text(encoding="utf-8")
    for entry in sorted(Path(cfg.out).iterdir()):
        name = re.sub(r"^client-\d+$", "client-<id>", re.sub(r"-r\d+\.pt$", "-r<round>.pt", entry.name))
        name += "/" if entry.is_dir() else ""
        assert f"`{name}" in text, f"docs/outputs.md does not list {name} ({entry.name}), which a run folder holds"
