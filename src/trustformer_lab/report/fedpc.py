"""FedPC's report (``reproduce --paper fedpc``): Tables 2–4 and Fig. 6 beside the paper's numbers.

- Table 2: test accuracy, image classification, class-stratified imbalanced split, per N and method.
- Table 3: segmentation Dice and pixel accuracy, same split (the paper prints one "accuracy").
- Table 4: test accuracy, image classification, Dirichlet split.
- Fig. 6: bytes exchanged per epoch against N, measured on the real messages, beside Eq. 8
  (D = V(N+1) + V(N−1)/16) and 2VN, with V the run's model on the wire (``fedavg_model_bytes``).

Written like the Trustformer report (``builder.py``): ``tables/*.csv|md``, ``figures/*.png``,
``report.md`` and a self-contained ``report.html``. The paper's numbers are in ``paper_fedpc.py``.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import paper_fedpc as paper
from .builder import ReportFiles, flatten, kv, nest, provenance
from .document import Document
from .runs import RunResult, load_runs
from .tables import Table, num, pct

log = logging.getLogger(__name__)

KIB = 1024
_DATA = {
    "image-classification": {"fashion-mnist": "Fashion-MNIST", "digits": "scikit-learn digits", "cifar10": "CIFAR-10"},
    "segmentation": {"mri-brain": "MRI brain extraction (mricron ch2 / ch2bet)", "lgg": "LGG (kaggle_3m)"},
}


@dataclass
class Cell:
    """One run of FedPC's grid, with what the tables need."""

    run: RunResult

    @property
    def task(self) -> str:
        return self.run.task

    @property
    def strategy(self) -> str:
        return self.run.strategy

    @property
    def n(self) -> int:
        return int(self.run.config.get("federation", {}).get("clients", len(self.run.client_ids)))

    @property
    def partition(self) -> str:
        return str(self.run.config.get("data", {}).get("partition", "iid"))

    def score(self, key: str) -> float | None:
        return self.run.mean(key)

    def model_bytes(self) -> float | None:
        return self.run.model_bytes()

    def epoch_bytes(self) -> float | None:
        """Bytes up + down of all workers in one epoch, on the real messages (mean over the epochs; Phong's
        last epoch, which also sends the final model to every worker, is left out when there is another)."""
        per_round: dict[int, float] = defaultdict(float)
        for r in self.run.records:
            per_round[int(r["round"])] += float(r.get("bytes_up", 0)) + float(r.get("bytes_down", 0))
        rounds = sorted(per_round)
        if self.strategy == "phong" and len(rounds) > 1:
            rounds = rounds[:-1]
        return statistics.fmean(per_round[r] for r in rounds) if rounds else None


def dataset_name(cells: Sequence[Cell], task: str) -> str:
    for c in cells:
        if c.task == task:
            section = "image" if task == "image-classification" else "segmentation"
            name = str(c.run.config.get(section, {}).get("dataset", "?"))
            return _DATA[task].get(name, name)
    return "?"


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _pick(
    cells: Sequence[Cell], task: str, strategy: str, n: int | None, partition: str | None, key: str
) -> float | None:
    """Our score: mean over the matching runs (one per cell in a grid) of the mean over their clients."""
    return _mean(
        c.score(key)
        for c in cells
        if c.task == task
        and c.strategy == strategy
        and (n is None or c.n == n)
        and (partition is None or c.partition == partition)
    )


def _centralized(cells: Sequence[Cell], task: str, key: str) -> float | None:
    return _pick(cells, task, "centralized", None, None, key)


def _ns(cells: Sequence[Cell], task: str, partition: str) -> list[int]:
    return sorted({c.n for c in cells if c.task == task and c.partition == partition and c.strategy != "centralized"})


def _pct2(v: Any) -> str:
    return f"{100 * v:.2f}%"


def _four(v: Any) -> str:
    return f"{v:.4f}"


def _data_note(cells: Sequence[Cell], task: str) -> str:
    return (
        f"Ours: {dataset_name(cells, task)}; paper: {paper.PAPER_SETUP[task]}. The data, models and epochs "
        "differ, so compare the methods' order and gaps, not the absolute numbers."
    )


# ----------------------------------------------------------------------------------------- Tables 2 and 4


def accuracy_table(cells: Sequence[Cell], partition: str) -> Table:
    """Table 2 (``stratified``) or Table 4 (``dirichlet``): test accuracy per N and method."""
    task = "image-classification"
    number, table = ("2", "table2") if partition == "stratified" else ("4", "table4")
    split = "class-stratified imbalanced split" if partition == "stratified" else "Dirichlet split"
    columns = ["N"]
    for m in paper.METHODS:
        columns += [f"{paper.NAMES[m]} ours", f"{paper.NAMES[m]} paper"]
    columns += [
        "centralized ours",
        "centralized paper (Table 1)",
        "FedPC / centralized ours",
        "FedPC / centralized paper",
    ]
    t = Table(
        f"fedpc_table{number}_accuracy",
        f"Table {number} — test accuracy, image classification, {split} "
        f"(ours: {dataset_name(cells, task)}; paper: {paper.PAPER_DATASET[task]})",
        columns,
    )
    central = _centralized(cells, task, "accuracy")
    central_paper = paper.TABLE1[task]
    for n in _ns(cells, task, partition):
        row: list[Any] = [n]
        for m in paper.METHODS:
            row += [_pick(cells, task, m, n, partition, "accuracy"), paper.fmt(paper.published(table, n, m))]
        ours_fedpc = row[1]
        theirs_fedpc = paper.published(table, n, "fedpc")
        row += [
            central,
            paper.fmt(central_paper),
            ours_fedpc / central if (ours_fedpc is not None and central) else None,
            theirs_fedpc[0] / central_paper[0] if theirs_fedpc else None,
        ]
        t.rows.append(row)
    t.formats = {c: _four for c in columns if c.endswith(" ours") and not c.startswith("FedPC /")}
    t.formats.update({"FedPC / centralized ours": pct, "FedPC / centralized paper": pct})
    printed = sorted(paper.TABLE2 if partition == "stratified" else paper.TABLE4)
    t.notes = [
        _data_note(cells, task),
        "Ours: the fraction of the shared test set classified correctly, mean over the workers after the last "
        "epoch (FedAvg, Phong and FedPC end with one model on every worker); one seed. Paper: mean ± standard "
        "deviation as printed"
        + (" (Table 4 prints no deviation)" if partition == "dirichlet" else "")
        + f", for N = {', '.join(map(str, printed))}; a blank paper cell: no N there.",
        "The paper heads the columns 'Phong et al. [2]' and 'FedAvg [1]' while its text cites Phong et al. as [1]; "
        "the columns are taken as headed. FedPC / centralized: the paper's 'performance approximation'.",
    ]
    return t


# ----------------------------------------------------------------------------------------- Table 3


def segmentation_table(cells: Sequence[Cell]) -> Table:
    task, partition = "segmentation", "stratified"
    columns = ["N"]
    for m in paper.METHODS:
        columns += [f"{paper.NAMES[m]} Dice ours", f"{paper.NAMES[m]} pixel acc. ours", f"{paper.NAMES[m]} paper"]
    columns += ["centralized Dice ours", "centralized pixel acc. ours", "centralized paper (Table 1)"]
    t = Table(
        "fedpc_table3_segmentation",
        f"Table 3 — segmentation Dice and pixel accuracy, imbalanced split "
        f"(ours: {dataset_name(cells, task)}; paper: {paper.PAPER_DATASET[task]})",
        columns,
    )
    for n in _ns(cells, task, partition):
        row: list[Any] = [n]
        for m in paper.METHODS:
            row += [
                _pick(cells, task, m, n, partition, "dice"),
                _pick(cells, task, m, n, partition, "pixel_accuracy"),
                paper.fmt(paper.published("table3", n, m)),
            ]
        row += [
            _centralized(cells, task, "dice"),
            _centralized(cells, task, "pixel_accuracy"),
            paper.fmt(paper.TABLE1[task]),
        ]
        t.rows.append(row)
    t.formats = {c: _four for c in columns if c.endswith(" ours")}
    t.notes = [
        _data_note(cells, task),
        "Ours: Dice and pixel accuracy pooled over every pixel of the held-out test slices, mean over the workers "
        "after the last epoch; one seed. Paper: its 'accuracy' (read as pixel accuracy; no Dice printed), mean ± "
        f"standard deviation, for N = {', '.join(map(str, sorted(paper.TABLE3)))}. Pixel accuracy is high even "
        "for a poor mask when the background dominates: Dice is the informative column.",
        "Segmentation has no classes: the split is the imbalanced one only (no Dirichlet table).",
    ]
    return t


# ----------------------------------------------------------------------------------------- Fig. 6


def fig6_rows(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Per task and N: V, bytes per epoch measured per strategy, Eq. 8 and 2VN (one run per strategy:
    the stratified split's when there is one, the bytes do not depend on the split)."""
    rows = []
    for task in paper.PAPER_SETUP:
        ns = sorted({c.n for c in cells if c.task == task and c.strategy in paper.METHODS})
        for n in ns:
            row: dict[str, Any] = {"task": task, "n": n, "v": None}
            for m in paper.METHODS:
                found = [c for c in cells if c.task == task and c.n == n and c.strategy == m]
                found.sort(key=lambda c: c.partition != "stratified")
                row[m] = found[0].epoch_bytes() if found else None
                row["v"] = row["v"] or (found[0].model_bytes() if found else None)
            v = row["v"]
            row["eq8"] = paper.eq8_bytes(v, n) if v else None
            row["2vn"] = paper.baseline_bytes(v, n) if v else None
            rows.append(row)
    return rows


def fig6_table(cells: Sequence[Cell]) -> Table:
    columns = [
        "task",
        "N",
        "V (KiB)",
        "FedPC measured KiB",
        "Eq. 8 KiB",
        "FedPC measured / Eq. 8",
        "FedAvg measured KiB",
        "Phong measured KiB",
        "2VN KiB",
        "FedAvg / 2VN",
        "Phong / 2VN",
        "FedPC saves vs FedAvg (measured)",
        "Eq. 8 saves vs 2VN",
        "paper: saved",
        "paper Eq. 8 MB",
    ]
    t = Table(
        "fedpc_fig6_bytes", "Figure 6 — bytes exchanged between the master and all workers per epoch", columns, left=1
    )

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if (a is not None and b) else None

    for row in fig6_rows(cells):
        n, v = row["n"], row["v"]
        saved_paper = paper.FIG6_SAVED.get(n)
        t.rows.append(
            [
                row["task"],
                n,
                v / KIB if v else None,
                row["fedpc"] / KIB if row["fedpc"] is not None else None,
                row["eq8"] / KIB if row["eq8"] else None,
                ratio(row["fedpc"], row["eq8"]),
                row["fedavg"] / KIB if row["fedavg"] is not None else None,
                row["phong"] / KIB if row["phong"] is not None else None,
                row["2vn"] / KIB if row["2vn"] else None,
                ratio(row["fedavg"], row["2vn"]),
                ratio(row["phong"], row["2vn"]),
                1 - row["fedpc"] / row["fedavg"] if (row["fedpc"] is not None and row["fedavg"]) else None,
                1 - row["eq8"] / row["2vn"] if row["eq8"] else None,
                saved_paper,
                paper.eq8_bytes(paper.FIG6_MODEL_MB[row["task"]], n),
            ]
        )
    kib = num(1)
    t.formats = {
        "V (KiB)": kib,
        "FedPC measured KiB": kib,
        "Eq. 8 KiB": kib,
        "FedAvg measured KiB": kib,
        "Phong measured KiB": kib,
        "2VN KiB": kib,
        "FedPC measured / Eq. 8": lambda x: f"{x:.4f}",
        "FedAvg / 2VN": lambda x: f"{x:.4f}",
        "Phong / 2VN": lambda x: f"{x:.4f}",
        "FedPC saves vs FedAvg (measured)": _pct2,
        "Eq. 8 saves vs 2VN": _pct2,
        "paper: saved": _pct2,
        "paper Eq. 8 MB": num(1),
    }
    t.notes = [
        "Measured: the serialized messages of one epoch, every worker's up and down (model, packed ternary "
        "vectors, cost records, requests and their framing), mean over the epochs (Phong's last epoch, which "
        "also sends the final model to every worker, left out when the run has another).",
        "V: one model as float32 arrays on the wire (the run's `fedavg_model_bytes`). Eq. 8: D = V(N+1) + "
        "V(N−1)/16 (P^t down to N workers, the pilot's model up, N−1 ternary vectors at 2 bits per value); "
        "2VN: FedAvg and Phong et al. (every worker downloads and uploads one model).",
        "Paper: Figure 6 is a chart only; its text states FedPC saves 'at least 31.25%' (N = 3) and 'up to "
        "42.20%' (N = 10) against 2VN, and the last column is Eq. 8 with its model sizes (35 MB ResNet50 FIXUP, "
        "119 MB U-Net).",
    ]
    return t


def fig6_figure(cells: Sequence[Cell], path: Path) -> Path:
    from .figures import pyplot

    plt = pyplot()
    rows = fig6_rows(cells)
    tasks = [t for t in paper.PAPER_SETUP if any(r["task"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(4.6 * (len(tasks) + 1), 4.0), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        mine = [r for r in rows if r["task"] == task]
        ns = [r["n"] for r in mine]
        v = next((r["v"] for r in mine if r["v"]), None)
        if v:
            grid = list(range(min(2, *ns), max(10, *ns) + 1))  # the formulas over the paper's range of N
            ax.plot(
                grid,
                [paper.eq8_bytes(v, n) / KIB for n in grid],
                "-",
                color="#d62728",
                lw=1.2,
                label="Eq. 8: V(N+1) + V(N−1)/16",
            )
            ax.plot(grid, [paper.baseline_bytes(v, n) / KIB for n in grid], "--", color="black", lw=1.2, label="2VN")
        for m, marker, color in (("fedpc", "o", "#d62728"), ("fedavg", "s", "#1f77b4"), ("phong", "^", "#2ca02c")):
            pts = [(r["n"], r[m] / KIB) for r in mine if r[m] is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker, color=color, ms=7, mfc="none", mew=1.5, label=f"{paper.NAMES[m]}, measured")
        ax.set_title(f"{dataset_name(cells, task)}" + (f" (V = {v / KIB:,.1f} KiB)" if v else ""))
        ax.set_xlabel("workers N")
        ax.set_ylabel("KiB per epoch (all workers, up + down)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    grid = list(range(2, 11))
    ax.plot(
        grid,
        [paper.eq8_bytes(1, n) / paper.baseline_bytes(1, n) for n in grid],
        "-",
        color="#d62728",
        label="Eq. 8 / 2VN (any model)",
    )
    ax.plot(
        list(paper.FIG6_SAVED),
        [1 - s for s in paper.FIG6_SAVED.values()],
        "k*",
        ms=10,
        label="paper's text (31.25% / 42.20% saved)",
    )
    for task, marker in zip(tasks, ("o", "D"), strict=False):
        pts = [(r["n"], r["fedpc"] / r["fedavg"]) for r in rows if r["task"] == task and r["fedpc"] and r["fedavg"]]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(
                xs, ys, marker, mfc="none", ms=8, mew=1.5, label=f"measured FedPC / FedAvg, {dataset_name(cells, task)}"
            )
    ax.set_title("FedPC's bytes as a fraction of FedAvg's")
    ax.set_xlabel("workers N")
    ax.set_ylabel("fraction")
    ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(
        "Figure 6 — data exchanged per training epoch (measured on the real messages, beside Eq. 8 and 2VN)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------- the report


def differences(cells: Sequence[Cell]) -> list[str]:
    items = []
    for task in paper.PAPER_SETUP:
        mine = [c for c in cells if c.task == task]
        if not mine:
            continue
        rounds = sorted({c.run.rounds for c in mine})
        v = next((c.model_bytes() for c in mine if c.model_bytes()), None)
        items.append(
            f"**Data and scale ({task}).** Ours: {dataset_name(cells, task)}, "
            f"{', '.join(map(str, rounds))} epoch(s), a model of {v / 2**20:.2f} MiB on the wire, CPU. Paper: "
            f"{paper.PAPER_SETUP[task]}. "
            if v
            else f"**Data ({task}).** Ours: {dataset_name(cells, task)}. "
        )
    items.append(
        "**Repeats.** The paper prints mean ± standard deviation over repeated runs; ours are one seed per cell "
        "(repeat with `--seed`)."
    )
    signs = sorted({str(c.run.config.get("fedpc", {}).get("sign")) for c in cells if c.strategy == "fedpc"})
    if signs:
        items.append(
            f"**Eq. 3's sign.** FedPC ran with `fedpc.sign = {', '.join(signs)}` ('paper': Eq. 3 as printed, "
            "Q* − Σ p_k T_k…; 'flipped': the sum added). As printed, a worker that keeps moving a parameter "
            "in the "
            "same direction (T = +1) pushes it back; see docs/protocols.md 'FedPC and Phong' for both signs measured."
        )
    items.append(
        "**Private hyper-parameters.** Each FedPC worker draws its batch size, learning rate, local epochs and "
        "optimizer from `fedpc.*` (seeded per worker, never sent); FedAvg, Phong and centralized use the task's."
    )
    items.append(
        "**Bytes.** Ours are counted on the serialized messages, so they include the cost reports, the requests "
        "and the framing that Eq. 8 leaves out; the measured / Eq. 8 column shows their share."
    )
    return items


# keys the grid sets per run (named in each run's label), and the section of the other task
_GRID_KEYS = {("task",), ("out",), ("federation", "strategy"), ("federation", "clients"), ("data", "partition")}
_OTHER_SECTION = {"image-classification": "segmentation", "segmentation": "image"}


def label(cell: Cell) -> str:
    if cell.strategy == "centralized":
        return f"{cell.task} · centralized"
    return f"{cell.task} · {paper.NAMES.get(cell.strategy, cell.strategy)} · N={cell.n} · {cell.partition}"


def _relevant(cell: Cell) -> dict[tuple, Any]:
    other = _OTHER_SECTION.get(cell.task)
    return {k: v for k, v in flatten(cell.run.config).items() if k not in _GRID_KEYS and k[0] != other}


def _setup(doc: Document, cells: Sequence[Cell], context: dict[str, Any]) -> None:
    """Configuration per task (what its runs share, then what each run changes), seeds and machine."""
    doc.heading("Configuration, seeds and machine")
    if context.get("grid"):
        doc.para("Grid: " + ", ".join(f"{k} = {v}" for k, v in context["grid"].items()))
    doc.para(
        f"Seeds: {', '.join(map(str, sorted({c.run.seed for c in cells})))} (the run seed; the data split, "
        "the model initialisation, the batch order and FedPC's private hyper-parameters are derived from it)."
    )
    status = {Path(x["folder"]).name: x for x in context.get("runs", [])}
    for task in paper.PAPER_SETUP:
        order = ("centralized", *paper.METHODS)
        mine = sorted(
            (c for c in cells if c.task == task),
            key=lambda c: (order.index(c.strategy) if c.strategy in order else len(order), c.partition, c.n),
        )
        if not mine:
            continue
        flats = [_relevant(c) for c in mine]
        common = {k: v for k, v in flats[0].items() if all(f.get(k, object()) == v for f in flats[1:])}
        nested = nest(common)
        doc.para(
            f"Configuration shared by the {task} runs (strategy, N and split in each run's name; other "
            "keys that differ listed per run):"
        )
        doc.code(json.dumps(nested, indent=2, sort_keys=True, ensure_ascii=False), "json")
        items = []
        for c, flat in zip(mine, flats, strict=True):
            varying = ", ".join(f"{'.'.join(k)}={v}" for k, v in sorted(flat.items()) if k not in common)
            st = status.get(c.run.path.name)
            extra = ""
            if st:
                extra = f" · {st.get('status', '')}" + (f" in {st['seconds']:.0f} s" if st.get("seconds") else "")
            items.append(
                f"{label(c)}: `{c.run.path.name}`"
                + (f" ({varying})" if varying else "")
                + extra
                + f" · {c.run.rounds} epoch(s) · wall {c.run.summary.get('time_s', {}).get('total', 0):.0f} s"
            )
        doc.bullets(items)
    machines = {json.dumps(c.run.summary.get("machine", {}), sort_keys=True) for c in cells}
    versions = {json.dumps(c.run.summary.get("versions", {}), sort_keys=True) for c in cells}
    items = [f"Machine: {kv(json.loads(m))}" for m in sorted(machines)]
    items += [f"Versions: {kv(json.loads(v))}" for v in sorted(versions)]
    if context.get("machine"):
        items.append(f"Host during the grid: {kv(context['machine'])}")
    doc.bullets(items)


def build_fedpc_report(
    run_dirs: Iterable[str | Path],
    out_dir: str | Path,
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
) -> ReportFiles:
    """FedPC's Tables 2–4 and Fig. 6 from every finished run under ``run_dirs``, into ``out_dir``."""
    return build_fedpc_report_for(load_runs(run_dirs), out_dir, title=title, context=context)


def build_fedpc_report_for(
    runs: Sequence[RunResult], out_dir: str | Path, *, title: str | None = None, context: dict[str, Any] | None = None
) -> ReportFiles:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    context = context or {}
    cells = [Cell(r) for r in runs if r.task in paper.PAPER_SETUP]
    tasks = {c.task for c in cells}
    partitions = {(c.task, c.partition) for c in cells}
    tables: list[Table] = []
    if ("image-classification", "stratified") in partitions:
        tables.append(accuracy_table(cells, "stratified"))
    if ("segmentation", "stratified") in partitions:
        tables.append(segmentation_table(cells))
    if ("image-classification", "dirichlet") in partitions:
        tables.append(accuracy_table(cells, "dirichlet"))
    fig6 = fig6_table(cells)
    tables.append(fig6)
    table_files: list[Path] = []
    for t in tables:
        table_files += t.write(out / "tables")
    figs = {"fig6_bytes": fig6_figure(cells, out / "figures" / "fig6_bytes_per_epoch.png")}
    presets = sorted({str(r.summary.get("preset", "?")) for r in runs})
    doc = Document(title or f"FedPC reproduction report — preset {', '.join(presets)}")
    provenance(doc, runs, context)
    doc.para(
        "FedPC's Tables 2–4 and Figure 6 (seed paper: *FedPC*, Section 5) with the paper's printed numbers beside "
        "ours. **The data differ**: the paper trains ResNet50 FIXUP on CIFAR-10 and a U-Net on LGG MRI scans on "
        "GPUs for 250 and 35 epochs; these runs use "
        + " and ".join(dataset_name(cells, t) for t in paper.PAPER_SETUP if t in tasks)
        + " with far smaller models and few epochs, so absolute scores are not comparable; the order of the "
        "methods, their gaps and the bytes relative to Eq. 8 are."
    )
    for t in tables[:-1]:
        doc.heading(t.title.split(" — ")[0])
        doc.table(t, files=f"[{t.name}.csv](tables/{t.name}.csv)")
    if not any(t.name.startswith("fedpc_table") for t in tables):
        doc.para("No finished run for Tables 2–4.")
    doc.heading("Figure 6")
    doc.table(fig6, files=f"[{fig6.name}.csv](tables/{fig6.name}.csv)")
    doc.image(
        figs["fig6_bytes"],
        "Figure 6 — bytes per epoch against N: measured (markers) beside Eq. 8 and 2VN "
        "(lines); right, FedPC's bytes as a fraction of FedAvg's.",
    )
    doc.heading("Where this differs from the paper, and why")
    doc.bullets(differences(cells))
    _setup(doc, cells, context)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(doc.to_markdown(out), encoding="utf-8")
    html_path.write_text(doc.to_html(), encoding="utf-8")
    log.info("report: %s (and report.html, %d tables, %d figures)", md_path, len(table_files), len(figs))
    return ReportFiles(folder=out, markdown=md_path, html=html_path, tables=table_files, figures=figs)
