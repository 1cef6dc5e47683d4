"""Our Tables III–V (beside the paper's published numbers) and the quality table, as CSV and Markdown."""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from . import paper
from .runs import RunResult

KIB = 1024


@dataclass
class Table:
    """Rows of raw values (written to CSV as they are) with a display format per column."""

    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    formats: dict[str, Callable[[Any], str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    left: int = 1  # leading columns aligned left (text); the others right (numbers)

    def cell(self, column: str, value: Any) -> str:
        if value is None or value == "":
            return "—"
        fmt = self.formats.get(column)
        if fmt is not None:
            return fmt(value)
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return str(value)

    def display_rows(self) -> list[list[str]]:
        return [[self.cell(c, v) for c, v in zip(self.columns, row, strict=False)] for row in self.rows]

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        for row in self.rows:
            writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
        return out.getvalue()

    def to_markdown(self) -> str:
        def esc(text: str) -> str:
            return text.replace("|", "\\|")

        lines = [
            "| " + " | ".join(esc(c) for c in self.columns) + " |",
            "|" + "|".join("---" if i < self.left else "---:" for i in range(len(self.columns))) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.display_rows()]
        return "\n".join(lines)

    def to_html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f"<td class='l'>{html.escape(c)}</td>" if i < self.left else f"<td>{html.escape(c)}</td>"
                for i, c in enumerate(row)
            )
            + "</tr>"
            for row in self.display_rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def write(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        csv_path, md_path = folder / f"{self.name}.csv", folder / f"{self.name}.md"
        csv_path.write_text(self.to_csv(), encoding="utf-8")
        notes = "".join(f"\n- {n}" for n in self.notes)
        md_path.write_text(
            f"## {self.title}\n\n{self.to_markdown()}\n" + (f"\n{notes.strip()}\n" if notes else ""), encoding="utf-8"
        )
        return [csv_path, md_path]


def num(digits: int) -> Callable[[Any], str]:
    return lambda v: f"{v:,.{digits}f}"


def _ratio(v: Any) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 0.1:
        return f"×{v:.2f}"
    return f"×{v:.2g}"


def pct(v: Any) -> str:
    return f"{100 * v:.1f}%"


def _ratio_of(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs in (None, 0):
        return None
    return ours / theirs


def _spread(values: Sequence[float | None], digits: int) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    mean = sum(vals) / len(vals)
    if len(vals) == 1 or hi - lo < 0.5 * 10**-digits:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


# ----------------------------------------------------------------------------------------- quality


# the quality columns of each task: (summary key, column title, digits)
TASK_QUALITY: dict[str, list[tuple[str, str, int]]] = {
    "translation": [
        ("bleu", "BLEU", 2),
        ("chrf", "chrF", 2),
        ("meteor", "METEOR", 3),
        ("bertscore_f1", "BERTScore F1", 3),
    ],
    "image-classification": [("accuracy", "accuracy", 4)],
    "segmentation": [("dice", "Dice", 4), ("iou", "IoU", 4), ("pixel_accuracy", "pixel accuracy", 4)],
}
TEST_LOSS_UNIT = {
    "translation": "nats/token",
    "image-classification": "nats/image",
    "segmentation": "BCE + soft Dice per image",
}


def _tasks(runs: Sequence[RunResult]) -> list[str]:
    """The tasks of the runs, in TASK_QUALITY order (translation alone when there is no run)."""
    present = {r.task for r in runs}
    return [t for t in TASK_QUALITY if t in present] or ["translation"]


def quality_table(runs: Sequence[RunResult]) -> Table:
    """The main table: final test loss and the task's quality per method (mean over clients, range):
    translation BLEU, chrF, METEOR, BERTScore F1; image classification accuracy; segmentation Dice,
    IoU and pixel accuracy. A report of runs of several tasks has the columns of each."""
    tasks = _tasks(runs)
    quality = [q for task in tasks for q in TASK_QUALITY[task]]
    loss_unit = TEST_LOSS_UNIT[tasks[0]] if len(tasks) == 1 else "task's loss"
    columns = [
        "method",
        "rounds",
        "clients",
        f"final test loss ({loss_unit})",
        *[title for _, title, _ in quality],
        "distance to FedAvg",
        "up KiB/round",
        "privacy ε",
        "wall time (s)",
    ]
    what = "translation quality" if tasks == ["translation"] else "quality"
    t = Table("quality", f"Final test loss and {what} per method (mean over clients; range in brackets)", columns)
    if len(tasks) > 1:
        columns.insert(1, "task")
        t.left = 2  # method and task: text
    for r in runs:
        up, _down = r.bytes_per_exchange()
        eps = (r.summary.get("privacy") or {}).get("epsilon") if isinstance(r.summary.get("privacy"), dict) else None
        row = [
            r.label,
            r.rounds,
            len(r.client_ids),
            _spread(r.per_client("test_loss"), 3),
            *[_spread(r.per_client(key), digits) for key, _, digits in quality],
            _spread(r.per_client("fedavg_distance"), 4) if r.summary.get("fedavg_distance") else None,
            up / KIB if up is not None else None,
            eps,
            r.summary.get("time_s", {}).get("total"),
        ]
        if len(tasks) > 1:
            row.insert(1, r.task)
        t.rows.append(row)
    t.formats = {"up KiB/round": num(1), "wall time (s)": num(1), "privacy ε": lambda v: f"{v:.3g}"}
    notes = []
    if "translation" in tasks:
        bert_models = sorted(  # model names (str); the filter drops runs without one
            cast("set[str]", {r.summary.get("bertscore_model") for r in runs if r.summary.get("bertscore_model")})
        )
        notes += [
            "Scores are on the first eval.bleu_size decoded test sentences (greedy unless eval.beam_size > 1); "
            "BLEU and chrF are sacreBLEU corpus scores (0–100), METEOR the mean sentence METEOR with WordNet "
            "synonyms (0–1), BERTScore the mean F1 (0–1).",
            "BERTScore model: "
            + ("; ".join(bert_models) if bert_models else "none (switched off)")
            + ". Not comparable with BERTScore from another model (published BERTScore uses roberta-large).",
        ]
    if "image-classification" in tasks:
        notes.append(
            "Accuracy: the fraction of the whole shared test set classified correctly (0–1); per-class "
            "accuracy per client is in summary.json (per_class_accuracy)."
        )
    if "segmentation" in tasks:
        notes.append(
            "Dice, IoU and pixel accuracy pooled over every pixel of the held-out test slices (0–1); "
            "FedPC's Table 3 'accuracy' is pixel accuracy."
        )
    notes.append(
        "Distance to FedAvg: ‖W_i − W_FedAvg‖/‖W_FedAvg‖ after the last exchange, where W_FedAvg is the "
        "data-weighted mean of the same round's local models (simulation-only diagnostic; 0 for FedAvg)."
    )
    if "translation" in tasks:
        notes.append(
            "The paper publishes its quality results (Fig. 6) only as a chart: no numbers to put beside these."
        )
    t.notes = notes
    return t


def quality_per_client_table(runs: Sequence[RunResult]) -> Table:
    """Long form of the quality table: one row per run and client (CSV for further analysis)."""
    keys = ["test_loss", *[key for task in _tasks(runs) for key, _, _ in TASK_QUALITY[task]], "fedavg_distance"]
    columns = ["method", "strategy", "beta", "agg_every", "client", *keys, "run"]
    t = Table("quality_per_client", "Final scores per client", columns)
    for r in runs:
        for i, c in enumerate(r.client_ids):
            vals = [r.per_client(k)[i] if i < len(r.per_client(k)) else None for k in keys]
            t.rows.append([r.label, r.strategy, r.beta, r.agg_every, c, *vals, r.path.name])
    return t


# ----------------------------------------------------------------------------------------- Table III


def table3_bytes(runs: Sequence[RunResult]) -> Table:
    columns = [
        "method",
        "ours up KiB/round",
        "ours down KiB/round",
        "ours % of a FedAvg model",
        "paper KiB",
        "paper % of a FedAvg model",
        "ours / paper",
    ]
    t = Table("table3_bytes", "Table III — data sent by one client to the server per round (epoch)", columns)
    for r in runs:
        if r.exchanges and r.agg_every != 1:
            continue
        up, down = r.bytes_per_exchange()
        model = r.model_bytes()
        key = r.paper_key
        theirs = paper.TABLE3_KIB.get(key) if key else None
        t.rows.append(
            [
                r.label,
                up / KIB if up is not None else None,
                down / KIB if down is not None else None,
                up / model if (up is not None and model) else None,
                theirs,
                theirs / paper.PAPER_MODEL_KIB if theirs else None,
                _ratio_of(up / KIB if up is not None else None, theirs),
            ]
        )
    t.formats = {
        "ours up KiB/round": num(1),
        "ours down KiB/round": num(1),
        "paper KiB": num(0),
        "ours % of a FedAvg model": pct,
        "paper % of a FedAvg model": pct,
        "ours / paper": _ratio,
    }
    t.notes = [
        "Ours: mean length of the serialized Flower messages a client sends (up) and receives (down) in an "
        "exchange round, payload and control records included. A FedAvg model = the same serializer applied "
        "to all trainable tensors of our model. Local / centralized runs exchange control messages only.",
        "Paper: 'data in transit between each client and the server per one epoch', KB read as KiB (its FedAvg "
        f"row, {paper.PAPER_MODEL_KIB:,} KB, is one whole model with a 250k vocabulary).",
        "The absolute ratio reflects the model sizes (ours is far smaller); compare the % columns.",
    ]
    return t


# ----------------------------------------------------------------------------------------- Table IV


def table4_time(runs: Sequence[RunResult]) -> Table:
    columns = [
        "method",
        "train s",
        "cluster s",
        "aggregate s",
        "other exchange s",
        "total s",
        "paper train s",
        "paper cluster s",
        "paper aggregate s",
        "paper total s",
        "total ours / paper",
    ]
    t = Table(
        "table4_time", "Table IV — seconds per epoch (round): local training, clustering, aggregation, total", columns
    )
    for r in runs:
        if r.exchanges and r.agg_every != 1:
            continue
        e = r.epoch_times()
        key = r.paper_key
        p = paper.TABLE4_S.get(key) if key else None
        t.rows.append(
            [
                r.label,
                e["train"],
                e["cluster"],
                e["aggregate"],
                e["other"],
                e["total"],
                *(p if p else (None, None, None, None)),
                _ratio_of(e["total"], p[3] if p else None),
            ]
        )
    fmt = num(2)
    t.formats = {c: fmt for c in columns[1:6]}
    t.formats.update({c: num(0) for c in columns[6:10]})
    t.formats["total ours / paper"] = _ratio
    modes = sorted({r.memberships for r in runs if r.strategy == "trustformer"})
    timed = {
        "local": "k-means of its trained weights (the paper's Algorithm 2)",
        "shared": "fixed memberships from k-means of the initial model (run once, in round 1) and the means",
        "tracked": "k-means of the shared reference model, warm",
        "rotating": "a random balanced partition (no k-means)",
    }
    clustering = "; ".join(f"memberships = {m}: {timed.get(m, m)}" for m in modes) or "k-means"
    t.notes = [
        "Ours, per epoch: train = the slowest client's mean local-training time (clients work in parallel in a "
        "deployment, as Eq. 5 assumes; in-process they run one after another, each timed alone); cluster = "
        f"the slowest client's clustering time per exchange, memberships plus centroid means ({clustering}); "
        "aggregate = the server's aggregation time; other = "
        "the rest of a client's exchange work (applying the aggregate, estimating weights, clipping and "
        "noising); total = train + max over clients of (cluster + other) + aggregate.",
        "Paper: as printed. Its DP-FedAvg total (664 s) is not the sum of its parts (574 s).",
    ]
    return t


# ----------------------------------------------------------------------------------------- Table V


def table5_total(
    runs: Sequence[RunResult], *, epochs: int = paper.PAPER_EPOCHS, agg_every: Sequence[int] = paper.PAPER_AGG_EVERY
) -> Table:
    columns = [
        "method",
        "Agg_fr",
        "ours Eq. 5 (s)",
        "ours / FedAvg",
        "measured in an Agg_fr run (s)",
        "paper (h)",
        "paper / FedAvg",
        "paper Eq. 5 from its Table IV (h)",
        "ours / paper",
    ]
    t = Table(
        "table5_total_time",
        f"Table V — total training time for e = {epochs} epochs by Eq. 5, per aggregation frequency Agg_fr",
        columns,
    )
    base = [r for r in runs if not r.exchanges or r.agg_every == 1]
    fedavg = next((r for r in base if r.strategy == "fedavg"), None)
    fedavg_e = fedavg.epoch_times() if fedavg else None
    measured = {(r.strategy, r.beta, r.agg_every): r for r in runs if r.exchanges}
    for r in base:
        e = r.epoch_times()
        key = r.paper_key
        published = paper.TABLE5_H.get(key) if key else None
        check = paper.paper_eq5_check_h(key) if key else None
        for a in agg_every if r.exchanges else agg_every[:1]:  # no exchange: Agg_fr changes nothing
            ours = paper.eq5_total_s(
                e["train"], e["client_exchange"], e["aggregate"], epochs=epochs, agg_every=a, exchanges=r.exchanges
            )
            ref = (
                paper.eq5_total_s(
                    fedavg_e["train"], fedavg_e["client_exchange"], fedavg_e["aggregate"], epochs=epochs, agg_every=a
                )
                if fedavg_e
                else None
            )
            i = paper.PAPER_AGG_EVERY.index(a) if a in paper.PAPER_AGG_EVERY else None
            theirs = published[i] if (published and i is not None) else None
            their_fedavg = paper.TABLE5_H["fedavg"][i] if i is not None else None
            run_a = measured.get((r.strategy, r.beta, a)) if a != 1 else None
            t.rows.append(
                [
                    r.label,
                    a if r.exchanges else None,
                    ours,
                    _ratio_of(ours, ref),
                    run_a.measured_eq5_s(epochs) if run_a else None,
                    theirs,
                    _ratio_of(theirs, their_fedavg) if theirs else None,
                    check[i] if (check and i is not None) else None,
                    _ratio_of(ours, theirs * 3600 if theirs else None),
                ]
            )
    t.formats = {
        "ours Eq. 5 (s)": num(1),
        "measured in an Agg_fr run (s)": num(1),
        "paper (h)": num(2),
        "paper Eq. 5 from its Table IV (h)": num(2),
        "ours / FedAvg": _ratio,
        "paper / FedAvg": _ratio,
        "ours / paper": _ratio,
    }
    t.notes = [
        "Eq. 5: T_total = e·max_i T_l^(i) + (e / Agg_fr)·max_i (T_c^(i) + T_agg), with our per-epoch times of "
        "Table IV (T_c: the client's exchange work). 'ours / FedAvg' and 'paper / FedAvg' compare the overhead "
        "over FedAvg at the same Agg_fr, the comparison that does not depend on model size or hardware.",
        "'measured in an Agg_fr run': the same terms summed over a run actually trained with that Agg_fr "
        "(rounds without exchange pay no exchange), scaled to e epochs.",
        "'paper Eq. 5 from its Table IV' applies Eq. 5 to the paper's own Table IV: its Trustformer rows agree "
        "with its Table V within a few %, its FedAvg and DP rows do not (e.g. FedAvg, Agg_fr=1: 1.38 h vs 2.08 h "
        "printed).",
    ]
    return t


def all_tables(runs: Sequence[RunResult], *, epochs: int = paper.PAPER_EPOCHS) -> list[Table]:
    return [
        quality_table(runs),
        table3_bytes(runs),
        table4_time(runs),
        table5_total(runs, epochs=epochs),
        quality_per_client_table(runs),
    ]
