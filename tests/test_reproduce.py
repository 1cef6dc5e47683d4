"""The reproduce grid: planning, the results-folder cache (reuse a finished run, rerun a changed one),
progress with ETA, and the report at the end — with real (shrunk tiny) federations."""

import json
import logging

import pytest

from trustformer import config as config_module
from trustformer.cli import main
from trustformer.config import ConfigError
from trustformer.engine.inprocess import run_in_process
from trustformer_lab.reproduce import grid as rep

# the tiny preset, shrunk further: one round, 20 pairs per client, 4 sentences decoded, no METEOR/BERTScore,
# one torch thread (two threads on a busy 2-core machine wait on each other)
FAST = {
    "federation.rounds": 1,
    "data.client_size": 20,
    "eval.bleu_size": 4,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.progress": True,
    "runtime.threads": 1,
}


def test_default_tiny_grid_covers_the_paper_grid():
    grid = rep.default_grid("tiny")
    planned = rep.plan("tiny", grid, "results")
    labels = [r.label for r in planned]
    assert "fedavg Agg_fr=1" in labels and "fedavg Agg_fr=2" in labels
    assert {
        "trustformer β=0.1 Agg_fr=1",
        "trustformer β=0.5 Agg_fr=1",
        "trustformer β=0.9 Agg_fr=1",
        "trustformer β=0.5 Agg_fr=2",
        "local",
        "centralized",
    } <= set(labels)
    # DP baselines take part exactly when this installation has them, under both readings of the paper's clipping
    for dp in ("dp-fedavg", "dp-fedsam", "dp-blur-lus"):
        for unit in ("client", "record"):
            assert (f"{dp} ({unit} level) Agg_fr=1" in labels) == (dp in config_module.STRATEGIES)
    assert len({r.key for r in planned}) == len(planned)  # one key per distinct configuration
    assert all(r.cfg.out == str(r.folder) and r.folder.name.endswith(r.key[:8]) for r in planned)


def test_cache_key_ignores_the_output_folder_only():
    a = config_module.load_config("tiny", None, {"out": "x"})
    b = config_module.load_config("tiny", None, {"out": "y", "runtime.progress": False})
    c = config_module.load_config("tiny", None, {"out": "x", "train.lr": 0.002})
    assert rep.cache_key(a) == rep.cache_key(b) == rep.cache_key(json.loads(a.to_json()))
    assert rep.cache_key(a) != rep.cache_key(c)


def test_unknown_strategy_is_refused():
    with pytest.raises(ConfigError, match="'fednova'"):
        rep.plan("tiny", rep.GridSpec(strategies=("fednova",)), "results")


@pytest.fixture
def progress_log(caplog):
    """The grid's progress lines (the CLI's logging setup stops 'trustformer' records at its own handler)."""
    logger = logging.getLogger("trustformer_lab.reproduce.grid")
    logger.addHandler(caplog.handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


def test_cache_reuses_finished_runs_and_reruns_a_changed_one(tmp_path, progress_log):
    caplog = progress_log
    calls = []

    def counting_runner(cfg):  # the real in-process federation, counted
        calls.append(cfg.federation.strategy)
        return run_in_process(cfg)

    grid = rep.GridSpec(strategies=("fedavg", "trustformer"), betas=(0.5,), agg_every=(1,))
    results = tmp_path / "results"
    first = rep.reproduce("tiny", results, grid=grid, overrides=FAST, runner=counting_runner)
    assert calls == ["fedavg", "trustformer"] and first.failed == []
    assert "[run 1/2] fedavg Agg_fr=1 · starting (1 of 2 to run)" in caplog.text
    assert "[run 2/2] trustformer β=0.5 Agg_fr=1 · starting (2 of 2 to run) · elapsed" in caplog.text
    assert "ETA" in caplog.text
    for name in (
        "report.md",
        "report.html",
        "grid.json",
        "tables/table3_bytes.csv",
        "tables/table4_time.csv",
        "tables/table5_total_time.csv",
        "figures/fig6_quality.png",
        "figures/fig4-5_loss_per_round.png",
    ):
        assert (results / name).is_file(), name
    for run in first.runs:  # every client wrote its own decoded translations
        assert (
            (run.folder / "client-0" / "translations.tsv")
            .read_text(encoding="utf-8")
            .startswith("source\treference\thypothesis\n")
        )

    caplog.clear()
    again = rep.run_grid(rep.plan("tiny", grid, results, overrides=FAST), results, runner=counting_runner)
    assert calls == ["fedavg", "trustformer"]  # nothing ran again
    assert set(again.status.values()) == {"cached"} and "[run 2/2] trustformer β=0.5 Agg_fr=1 · cached" in caplog.text

    changed = rep.plan("tiny", grid, results, overrides={**FAST, "train.lr": 0.002})[1:]  # trustformer only
    also = rep.plan("tiny", grid, results, overrides=FAST)[:1]  # fedavg as before
    third = rep.run_grid(also + changed, results, runner=counting_runner)
    assert calls == ["fedavg", "trustformer", "trustformer"]  # only the changed run
    assert [third.status[r.name] for r in third.runs] == ["cached", "ran"]
    assert changed[0].folder != first.runs[1].folder  # a new key: the old result stays, under its own key
    summary = json.loads((changed[0].folder / "summary.json").read_text(encoding="utf-8"))
    assert summary["config"]["train"]["lr"] == 0.002


def test_a_failed_run_is_reported_and_the_grid_goes_on(tmp_path):
    def runner(cfg):
        if cfg.federation.strategy == "local":
            raise RuntimeError("boom")
        return {"test_loss": [1.0], "bleu": [0.0]}

    planned = rep.plan("tiny", rep.GridSpec(strategies=("local", "fedavg")), tmp_path)
    outcome = rep.run_grid(planned, tmp_path, runner=runner)
    assert outcome.failed == [planned[0].name] and outcome.status[planned[1].name] == "ran"
    assert "RuntimeError: boom" in (planned[0].folder / "error.txt").read_text()


def test_dry_run_lists_the_runs(tmp_path, capsys):
    assert (
        main(
            [
                "reproduce",
                "--preset",
                "tiny",
                "--out",
                str(tmp_path),
                "--strategies",
                "fedavg,trustformer",
                "--betas",
                "0.2,0.4",
                "--agg-every",
                "2",
                "--dry-run",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5  # fedavg ×2 Agg_fr, trustformer β 0.2 and 0.4, trustformer β 0.5 at Agg_fr 2
    assert all("to run" in line for line in lines)
    assert main(["reproduce", "--strategies", "nope", "--dry-run", "--out", str(tmp_path)]) == 2
