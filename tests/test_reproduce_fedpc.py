"""``trustformer reproduce --paper fedpc``: the grid, the option errors, and the tiny reproduction end to end
(FedPC's Tables 2–4 and Fig. 6, whose measured bytes match Eq. 8 within 1%)."""

import csv
import logging

import pytest

from trustformer.cli import main
from trustformer.config import ConfigError
from trustformer_lab.report import paper_fedpc
from trustformer_lab.reproduce import fedpc as rep


def test_default_grids():
    tiny = rep.plan_fedpc("tiny", rep.default_fedpc_grid("tiny"), "results")
    labels = [r.label for r in tiny]
    assert labels[0] == "image-classification · centralized"
    assert "image-classification · fedpc · N=3 · dirichlet" in labels
    assert "segmentation · phong · N=3 · stratified" in labels
    assert not any("segmentation" in x and "dirichlet" in x for x in labels)  # no classes to skew
    assert all(r.cfg.federation.rounds == 2 and r.cfg.runtime.threads == 1 for r in tiny)
    small = rep.plan_fedpc("small", rep.default_fedpc_grid("small"), "results")
    # per task: centralized once, then 3 strategies × N ∈ {3, 5, 10} × the task's splits
    assert len(small) == (1 + 3 * 3 * 2) + (1 + 3 * 3)
    assert {r.cfg.federation.clients for r in small} == {3, 5, 10}
    image = [r.cfg for r in small if r.cfg.task == "image-classification"]
    assert {c.image.dataset for c in image} == {"fashion-mnist"}
    assert {r.cfg.segmentation.dataset for r in small if r.cfg.task == "segmentation"} == {"mri-brain"}
    assert len({r.key for r in small}) == len(small)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--paper", "fedpc", "--strategies", "fedavg,trustformer"], "--strategies: 'trustformer'"),
        (["--paper", "fedpc", "--partitions", "iid"], "--partitions: 'iid'"),
        (["--paper", "fedpc", "--partitions", "dirichlet", "--tasks", "segmentation"], "--partitions: dirichlet"),
        (["--paper", "fedpc", "--tasks", "translation"], "--tasks: 'translation'"),
        (["--paper", "fedpc", "--clients", "1,3"], "--clients: 1"),
        (["--paper", "fedpc", "--strategies", ""], "--strategies: no strategy"),
        (["--paper", "fedpc", "--betas", "0.5"], "--betas applies to the Trustformer paper only"),
        (["--paper", "fedpc", "--set", "federation.clients=4"], "--set federation.clients"),
        (["--clients", "3"], "--clients applies to --paper fedpc only"),
    ],
)
def test_option_errors_name_the_option(tmp_path, capsys, argv, message):
    assert main(["reproduce", *argv, "--out", str(tmp_path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_unknown_paper_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--paper", "fedpcx"])
    assert "argument --paper: invalid choice: 'fedpcx'" in capsys.readouterr().err


def test_plan_refuses_an_unknown_strategy():
    with pytest.raises(ConfigError, match="--strategies"):
        rep.plan_fedpc("tiny", rep.FedPCGridSpec(strategies=("fedprox",)), "results")


@pytest.fixture
def progress_log(caplog):
    logger = logging.getLogger("trustformer_lab.reproduce.grid")
    logger.addHandler(caplog.handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # the slow tier (CI runs it after the README's test command)
def test_tiny_reproduction_writes_tables_2_to_4_and_fig6(tmp_path, progress_log, capsys):
    out = tmp_path / "results"
    assert main(["reproduce", "--paper", "fedpc", "--preset", "tiny", "--out", str(out), "--quiet"]) == 0
    lines = [r.getMessage() for r in progress_log.records]
    assert any("[run 2/11]" in x and "ETA" in x for x in lines)
    assert any("done in" in x and "accuracy" in x for x in lines)
    assert any("done in" in x and "Dice" in x for x in lines)
    report = (out / "report.md").read_text(encoding="utf-8")
    for heading in ("## Table 2", "## Table 3", "## Table 4", "## Figure 6", "The data differ"):
        assert heading in report
    assert paper_fedpc.fmt(paper_fedpc.TABLE2[3]["fedpc"]) in report  # the paper's printed number beside ours
    assert (out / "report.html").is_file()
    assert (out / "figures" / "fig6_bytes_per_epoch.png").stat().st_size > 0
    for name in ("fedpc_table2_accuracy", "fedpc_table3_segmentation", "fedpc_table4_accuracy"):
        rows = _rows(out / "tables" / f"{name}.csv")
        assert [r["N"] for r in rows] == ["3"]
        scores = [v for k, v in rows[0].items() if k.endswith(" ours") and not k.startswith("FedPC /")]
        assert scores and all(0.0 <= float(v) <= 1.0 for v in scores)
    fig6 = _rows(out / "tables" / "fedpc_fig6_bytes.csv")
    assert {r["task"] for r in fig6} == {"image-classification", "segmentation"}
    for r in fig6:
        n, v = int(r["N"]), float(r["V (KiB)"])
        assert float(r["Eq. 8 KiB"]) == pytest.approx(paper_fedpc.eq8_bytes(v, n), rel=1e-4)
        assert float(r["FedPC measured KiB"]) == pytest.approx(float(r["Eq. 8 KiB"]), rel=0.01)
        assert float(r["FedAvg measured KiB"]) == pytest.approx(2 * v * n, rel=0.01)
        assert float(r["Phong measured KiB"]) == pytest.approx(2 * v * n, rel=0.01)
    # a second call reuses every run
    capsys.readouterr()
    assert main(["reproduce", "--paper", "fedpc", "--preset", "tiny", "--out", str(out), "--dry-run"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 11 and all("cached" in x for x in listing)
