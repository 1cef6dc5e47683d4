"""Build the report of finished runs: tables (CSV + Markdown), figures (PNG), report.md and report.html."""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from . import figures, paper, tables
from .document import Document
from .runs import RunResult, load_runs

log = logging.getLogger(__name__)

# configuration keys that identify a run of a grid rather than its setting
_GRID_KEYS = {("federation", "strategy"), ("federation", "beta"), ("federation", "agg_every")}


@dataclass
class ReportFiles:
    folder: Path
    markdown: Path
    html: Path
    tables: list[Path] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)

    def all(self) -> list[Path]:
        return [self.markdown, self.html, *self.tables, *self.figures.values()]


def build_report(
    run_dirs: Iterable[str | Path],
    out_dir: str | Path,
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
    epochs: int = paper.PAPER_EPOCHS,
) -> ReportFiles:
    """Report every finished run under ``run_dirs`` into ``out_dir``.

    ``context`` (from ``trustformer reproduce``) adds the command, the grid and the run list with
    their status; ``epochs`` is e of Eq. 5 for Table V (the paper's 10 by default).
    """
    runs = load_runs(run_dirs)
    return build_report_for(runs, out_dir, title=title, context=context, epochs=epochs)


def build_report_for(
    runs: Sequence[RunResult],
    out_dir: str | Path,
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
    epochs: int = paper.PAPER_EPOCHS,
) -> ReportFiles:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    context = context or {}
    all_tables = tables.all_tables(runs, epochs=epochs)
    table_files: list[Path] = []
    for t in all_tables:
        table_files += t.write(out / "tables")
    figs = figures.all_figures(runs, out / "figures")
    presets = sorted({str(r.summary.get("preset", "?")) for r in runs})
    doc = Document(title or f"Trustformer reproduction report — preset {', '.join(presets)}")
    _intro(doc, runs, context, out)
    by_name = {t.name: t for t in all_tables}
    doc.heading("Main results")
    doc.table(by_name["quality"], files=_files(out, "quality", "quality_per_client"))
    translation = any(r.task == "translation" for r in runs) or not runs
    doc.image(
        figs["quality"],
        "Figure 6 — BLEU, METEOR and BERTScore F1 per client and method."
        if translation
        else "Accuracy (classification) or Dice, IoU and pixel accuracy (segmentation) per client and "
        "method, on the shared held-out test set.",
    )
    doc.heading("Communication (Table III)")
    doc.table(by_name["table3_bytes"], files=_files(out, "table3_bytes"))
    doc.image(
        figs["bytes_vs_beta"],
        "Table III as a chart — bytes per client per round relative to a FedAvg model, ours and the paper's.",
    )
    doc.heading("Time (Tables IV and V)")
    doc.table(by_name["table4_time"], files=_files(out, "table4_time"))
    doc.table(by_name["table5_total_time"], files=_files(out, "table5_total_time"))
    doc.heading("Convergence (Figures 4 and 5)")
    doc.image(figs["loss_per_round"], "Figure 4/5 — test loss of every client per round, per method.")
    doc.image(
        figs["loss_vs_beta"],
        "Figure 4/5 — final test loss against β with FedAvg, no aggregation and "
        "the other methods as references; distance to FedAvg against β.",
    )
    if "data_per_client" in figs or "class_counts" in figs:
        doc.heading("Data")
    if "data_per_client" in figs:
        doc.image(figs["data_per_client"], "Training pairs of every client per domain, and the shared test set's.")
    if "class_counts" in figs:
        doc.image(figs["class_counts"], "Training images of every client per class (the data partition).")
    masks = {name.split(":", 1)[1]: path for name, path in figs.items() if name.startswith("masks:")}
    if masks:
        doc.heading("Predicted masks")
        for label, path in masks.items():
            doc.image(
                path,
                f"{label} — held-out test slices: the image, the true mask, the first client's "
                "predicted mask, and the overlay (green: both, red: missed, blue: false positive).",
            )
    if translation:
        _samples(doc, runs, out)
    doc.heading("Where this differs from the paper, and why")
    doc.bullets(differences(runs, epochs=epochs))
    _setup(doc, runs, context)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(doc.to_markdown(out), encoding="utf-8")
    html_path.write_text(doc.to_html(), encoding="utf-8")
    log.info("report: %s (and report.html, %d tables, %d figures)", md_path, len(table_files), len(figs))
    return ReportFiles(folder=out, markdown=md_path, html=html_path, tables=table_files, figures=figs)


def _files(out: Path, *names: str) -> str:
    return ", ".join(f"[{n}.csv](tables/{n}.csv)" for n in names)


def provenance(doc: Document, runs: Sequence[RunResult], context: dict[str, Any]) -> None:
    """A report's first lines: when, by which command, from how many runs, and the grid it ran."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = context.get("command")
    doc.para(f"Generated {now}" + (f" by `{command}`" if command else "") + f" from {len(runs)} finished run(s).")
    if context.get("subset"):
        doc.para(f"**Grid run**: {context['subset']}")


def _intro(doc: Document, runs: Sequence[RunResult], context: dict[str, Any], out: Path) -> None:
    provenance(doc, runs, context)
    doc.para(
        "Each of our numbers stands beside the paper's published number where the paper gives one (Tables "
        "III–V), with the ratio ours / paper. The paper trained "
        f"{paper.PAPER_SETUP}; these runs are far smaller (see *Configuration* and *Where this differs*), so "
        "absolute bytes and seconds differ by orders of magnitude: the relative columns (% of a FedAvg model, "
        "× FedAvg) are the ones to compare."
    )


def _samples(doc: Document, runs: Sequence[RunResult], out: Path, shown: int = 2) -> None:
    doc.heading("Sample translations")
    doc.para(
        f"The first {shown} test sentences as decoded by each method's first client. Every client's full "
        "list is in its `translations.tsv` (source, reference, hypothesis), written by the client itself "
        "(the server only ever receives the scores and three samples)."
    )
    table = tables.Table(
        "samples",
        "Sample translations (first client of each method)",
        ["method", "source", "reference", "hypothesis"],
        left=4,
    )
    links = []
    for r in runs:
        samples = r.summary.get("samples") or {}
        first: list[Any] = next(iter(samples.values()), []) if isinstance(samples, dict) else []
        for src, ref, hyp in first[:shown]:
            table.rows.append([r.label, _clip(src), _clip(ref), _clip(hyp) or "(empty)"])
        files = r.summary.get("translations") or {}
        found = [
            f"[{'all shards' if str(c) == '-1' else 'client ' + str(c)}]({_rel(r.path / p, out)})"
            for c, p in files.items()
            if (r.path / p).is_file()
        ]
        if found:
            links.append(f"{r.label}: " + ", ".join(found))
    if table.rows:
        doc.table(table)
    doc.bullets(links)


def _clip(text: str, n: int = 70) -> str:
    text = " ".join(str(text).split()).replace("`", "'")
    return text if len(text) <= n else text[: n - 1] + "…"


def _rel(path: Path, base: Path) -> str:
    from .document import relative_link

    return relative_link(path, base)


def _setup(doc: Document, runs: Sequence[RunResult], context: dict[str, Any]) -> None:
    doc.heading("Configuration, seeds and machine")
    if context.get("grid"):
        doc.para("Grid: " + ", ".join(f"{k} = {v}" for k, v in context["grid"].items()))
    seeds = sorted({r.seed for r in runs})
    doc.para(
        f"Seeds: {', '.join(map(str, seeds))} (the run seed; every other seed — data split, model "
        "initialisation, batch order, dropout, k-means starts — is derived from it, so a run is repeatable)."
    )
    base = _common_config(runs)
    doc.para(
        "Configuration shared by the runs (keys that vary between runs — strategy, β, Agg_fr, and any other "
        "— are listed per run below; `out` omitted):"
    )
    doc.code(json.dumps(base, indent=2, sort_keys=True, ensure_ascii=False), "json")
    run_items = []
    status = {Path(x["folder"]).name: x for x in context.get("runs", [])}
    for r in runs:
        varying = _varying(r, base)
        st = status.get(r.path.name)
        extra = ""
        if st:
            extra = f" · {st.get('status', '')}" + (f" in {st['seconds']:.0f} s" if st.get("seconds") else "")
        run_items.append(
            f"{r.label}: `{r.path.name}`"
            + (f" ({varying})" if varying else "")
            + extra
            + f" · seed {r.seed} · {r.rounds} round(s) · "
            f"wall {r.summary.get('time_s', {}).get('total', 0):.0f} s"
        )
    doc.bullets(run_items)
    machines = {json.dumps(r.summary.get("machine", {}), sort_keys=True) for r in runs}
    versions = {json.dumps(r.summary.get("versions", {}), sort_keys=True) for r in runs}
    items = [f"Machine: {kv(json.loads(m))}" for m in sorted(machines)]
    items += [f"Versions: {kv(json.loads(v))}" for v in sorted(versions)]
    if context.get("machine"):
        items.append(f"Host during the grid: {kv(context['machine'])}")
    data: dict[str, Any] = next(
        (r.summary.get("data", {}).get("clients", {}) for r in runs if r.summary.get("data")), {}
    )
    first = next(iter(data.values()), None) if data else None
    if first:
        items.append(f"Data: {kv(first)}")
    doc.bullets(items)


def kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def flatten(d: dict[str, Any], prefix: tuple = ()) -> dict[tuple, Any]:
    out: dict[tuple, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _common_config(runs: Sequence[RunResult]) -> dict[str, Any]:
    flats = [flatten(r.config) for r in runs if r.config]
    if not flats:
        return {}
    common = {
        k: v
        for k, v in flats[0].items()
        if k != ("out",) and k not in _GRID_KEYS and all(f.get(k, object()) == v for f in flats[1:])
    }
    return nest(common)


def nest(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """The inverse of ``flatten``: {("a", "b"): 1} → {"a": {"b": 1}}, keys sorted."""
    nested: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        node = nested
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return nested


def _varying(run: RunResult, base: dict[str, Any]) -> str:
    flat_base = flatten(base)
    diffs = [
        f"{'.'.join(k)}={v}"
        for k, v in sorted(flatten(run.config).items())
        if k != ("out",) and k not in _GRID_KEYS and flat_base.get(k, object()) != v
    ]
    return ", ".join(diffs)


# ----------------------------------------------------------------------------------------- differences


def differences(runs: Sequence[RunResult], *, epochs: int = paper.PAPER_EPOCHS) -> list[str]:
    """What differs from the paper, measured on these runs where possible, with the reason."""
    tf = sorted(
        (r for r in runs if r.strategy == "trustformer" and r.agg_every == 1 and r.beta is not None),
        key=lambda r: cast(float, r.beta),  # runs with a β (the filter above)
    )
    fedavg = next((r for r in runs if r.strategy == "fedavg" and r.agg_every == 1), None)
    notes = [
        _scale_note(runs),
        _bytes_note(tf),
        _clustering_note(tf),
        _total_time_note(fedavg, tf, epochs),
        TIMING_NOTE,
        _bertscore_note(runs),
        _quality_note(runs),
        _dp_note(runs, fedavg),
        _convergence_note(runs, fedavg, tf),
    ]
    return [note for note in notes if note]


TIMING_NOTE = (
    "**Timing conditions.** Our clients run one after another in one process on a shared CPU (each timed "
    "alone; Eq. 5 takes the slowest, as if they ran in parallel). Other work on the machine inflates and "
    "scatters the seconds; repeat runs to judge small differences."
)


def _scale_note(runs: Sequence[RunResult]) -> str | None:
    if not runs:
        return None
    first = runs[0]
    m, d, fed = (first.config.get(k, {}) for k in ("model", "data", "federation"))
    no_client: dict[str, Any] = {}
    vocab = next(iter((first.summary.get("data", {}).get("clients") or {}).values()), no_client).get("vocab_size", "?")
    return (
        f"**Scale.** Ours: d_model {m.get('d_model')}, {m.get('n_heads')} heads, "
        f"{m.get('n_encoder_layers')}+{m.get('n_decoder_layers')} layers, FFN {m.get('d_ff')}, vocabulary "
        f"{vocab}, {fed.get('clients')} clients × {d.get('client_size') or 'all'} pairs of {d.get('source')} "
        f"data, {first.rounds} round(s), CPU. Paper: {paper.PAPER_SETUP}. Bytes and seconds scale with the "
        "model and the hardware, so only relative numbers are comparable; our models are far from converged, "
        "so quality scores are low."
    )


def _bytes_note(tf: Sequence[RunResult]) -> str | None:
    rel = []
    for r in tf:
        up, _ = r.bytes_per_exchange()
        model = r.model_bytes()
        if up is not None and model and r.paper_key in paper.TABLE3_KIB:
            rel.append(
                f"β={r.beta:g}: {100 * up / model:.1f}% vs "
                f"{100 * paper.TABLE3_KIB[r.paper_key] / paper.PAPER_MODEL_KIB:.1f}%"
            )
    if not rel:
        return None
    return (
        "**Communication (Table III).** Trustformer's payload relative to a FedAvg model, ours vs the paper's: "
        + "; ".join(rel)
        + ". Both grow like β (k = ⌊r·β⌋ centroids per layer). Ours counts every trainable "
        "tensor (biases and LayerNorm as r×1, never skipped), rounds k down per layer and includes the message "
        "framing and control records; small layers (k ≥ 1) weigh more in a small model."
    )


def _clustering_note(tf: Sequence[RunResult]) -> str | None:
    shares = []
    for r in tf:
        e = r.epoch_times()
        if e["train"] > 0 and r.paper_key in paper.TABLE4_S:
            p = paper.TABLE4_S[r.paper_key]
            shares.append(f"β={r.beta:g}: {e['cluster'] / e['train']:.2f}× vs {p[1] / p[0]:.2f}×")
    if not shares:
        return None
    return (
        "**Clustering time (Table IV).** k-means time as a multiple of local-training time per epoch, ours vs "
        "the paper's: " + "; ".join(shares) + ". Our Trustformer runs here cluster as the paper's Algorithm 2 "
        "(k-means of each client's trained weights at every exchange, memberships = local, no privacy floor); "
        "after the first exchange k-means starts from the previous global centroids and runs at most "
        "trustformer.kmeans_warm_max_iter Lloyd iterations; the paper's clustering "
        "of a 200 M-parameter model dominates its epoch. The paper's clustering time is not monotone in β "
        "(it peaks at β = 0.6), which it attributes to k-means convergence."
    )


def _total_time_note(fedavg: RunResult | None, tf: Sequence[RunResult], epochs: int) -> str | None:
    if fedavg is None or not tf:
        return None
    return (
        "**Total time (Table V).** Computed by Eq. 5 with e = "
        f"{epochs} from our per-epoch times. The paper's Table V follows Eq. 5 applied to its Table IV for "
        "Trustformer (within a few %) but not for the baselines (FedAvg, Agg_fr = 1: Eq. 5 gives "
        f"{cast('tuple[float, ...]', paper.paper_eq5_check_h('fedavg'))[0]:.2f} h from its Table IV, "
        f"{paper.TABLE5_H['fedavg'][0]:.2f} h printed), "
        "and its DP-FedAvg total in Table IV (664 s) is not the sum of its parts (574 s): the "
        "'paper / FedAvg' column inherits that."
    )


def _bertscore_note(runs: Sequence[RunResult]) -> str | None:
    bert = next((r.summary.get("bertscore_model") for r in runs if r.summary.get("bertscore_model")), None)
    if not bert:
        return None
    return (
        f"**BERTScore.** Computed with {bert}, without baseline rescaling; the paper does not name its model "
        "(bert-score's default for English is roberta-large, which needs a download). Compare BERTScore only "
        "between runs scored with the same model."
    )


def _quality_note(runs: Sequence[RunResult]) -> str | None:
    bleu = [v for r in runs for v in r.per_client("bleu") if v is not None]
    if not bleu or max(bleu) >= 1.0:
        return None
    return (
        "**Quality.** Every BLEU here is below 1: at this scale and number of rounds the models have not "
        "learnt to translate yet (many hypotheses are empty or repeat frequent words), so Figure 6 shows noise, "
        "not a ranking. The paper's Figure 6 gives no numbers to compare with."
    )


def _dp_note(runs: Sequence[RunResult], fedavg: RunResult | None) -> str:
    dp = [r for r in runs if r.strategy.startswith("dp-")]
    if not dp:
        return (
            "**DP baselines.** No DP-FedAvg / DP-FedSAM / DP-BLUR-LUS runs in this report, so their paper "
            "rows stand alone."
        )
    desc = []
    for r in dp:
        privacy: dict[str, Any] = (
            cast("dict[str, Any]", r.summary.get("privacy")) if isinstance(r.summary.get("privacy"), dict) else {}
        )
        loss, eps = r.mean("test_loss"), privacy.get("epsilon")
        text = f"{r.label}: ε = {eps:.3g}" if isinstance(eps, (int, float)) else f"{r.label}: ε = ?"
        text += ", final test loss " + (f"{loss:.3f}" if loss is not None else "—")
        if r.noise_not_private:
            text += (
                " — its noise and client sampling were derived from the run seed "
                "(privacy.noise_source = seeded-not-private): anyone who knows the seed can remove the "
                "noise, so this ε protects nothing"
            )
        desc.append(text)
    ref = fedavg.mean("test_loss") if fedavg is not None else None
    return (
        "**DP baselines.** "
        + "; ".join(desc)
        + (f" (FedAvg: {ref:.3f})" if ref is not None else "")
        + ". "
        + _dp_reading_verdict(dp)
    )


def learned(run: RunResult) -> bool | None:
    """Whether a run's model learnt anything: its mean test loss below ln(vocabulary), what predicting every
    token uniformly costs (None when unknown)."""
    loss = run.mean("test_loss")
    no_client: dict[str, Any] = {}
    vocab = next(iter((run.summary.get("data", {}).get("clients") or {}).values()), no_client).get("vocab_size")
    if loss is None or not isinstance(vocab, (int, float)) or vocab < 2:
        return None
    return math.isfinite(loss) and loss < math.log(vocab)


def _dp_reading_verdict(dp: Sequence[RunResult]) -> str:
    """Which reading of the paper's clipping ("each client's gradient" clipped at B = 0.5, ε = 1, 3 clients) its
    DP baselines fit: the paper shows them learning (its Figs. 5 and 6), so a reading whose baselines do not
    learn here cannot be the one behind its numbers."""
    by_unit = {unit: [learned(r) for r in dp if r.privacy_unit == unit] for unit in ("client", "record")}
    known = {unit: [v for v in values if v is not None] for unit, values in by_unit.items()}
    if not known["client"] or not known["record"]:
        ran = [u for u in known if known[u]]
        return (
            f"Only the {ran[0] if ran else '?'}-level reading ran here; run both (reproduce runs each DP baseline "
            "with privacy.unit = client and record) to see which one the paper's DP rows fit."
        )
    client_learns, record_learns = all(known["client"]), all(known["record"])
    if record_learns and not client_learns:
        return (
            "**Which reading the paper's DP rows fit:** at the client level (each client's update clipped and "
            "noised, McMahan et al. 2018) the baselines do not learn here: with 3 clients the noise on the mean "
            "update dwarfs it. At the record level (DP-SGD, each training pair's gradient clipped at B) they "
            "learn. The paper shows its DP baselines learning at ε = 1 with 3 clients, so its numbers fit the "
            "record-level reading, or noise that was not calibrated to the stated ε."
        )
    if record_learns and client_learns:
        return (
            "**Which reading the paper's DP rows fit:** both readings learn here, so these runs cannot tell them apart."
        )
    diverged = {unit: [r.mean("test_loss") for r in dp if r.privacy_unit == unit] for unit in ("client", "record")}
    worst = {unit: max((v for v in values if v is not None), default=None) for unit, values in diverged.items()}
    detail = "".join(
        f" At the {unit} level the worst final test loss is {loss:.3g}."
        for unit, loss in worst.items()
        if loss is not None
    )
    return (
        "**Which reading the paper's DP rows fit:** neither reading learns here at this scale (final test loss "
        "at or above ln(vocabulary), what uniform guessing costs), so these runs cannot tell which one the paper "
        "used." + detail
    )


def _convergence_note(runs: Sequence[RunResult], fedavg: RunResult | None, tf: Sequence[RunResult]) -> str | None:
    local = next((r for r in runs if r.strategy == "local"), None)
    parts = []
    ff = [v for v in fedavg.per_client("test_loss") if v is not None] if fedavg is not None else []
    if ff:
        parts.append(f"FedAvg's clients share one model (final test loss {statistics.fmean(ff):.3f})")
    lf = [v for v in local.per_client("test_loss") if v is not None] if local is not None else []
    if lf:
        parts.append(f"clients trained alone end between {min(lf):.3f} and {max(lf):.3f}")
    dist = [
        (r.beta, statistics.fmean(d))
        for r in tf
        if (d := [x for x in (r.summary.get("fedavg_distance") or []) if x is not None])
    ]
    if len(dist) >= 2:
        falling = all(b[1] < a[1] for a, b in zip(dist, dist[1:], strict=False))
        parts.append(
            "Trustformer's mean distance to FedAvg after the last exchange is "
            + ", ".join(f"{d:.4f} at β={b:g}" for b, d in dist)
            + (
                ": it falls as β grows, as Theorem 1 predicts (→ 0 at β = 1)"
                if falling
                else ": not monotone in β here (too few rounds or too much noise to show Theorem 1's trend)"
            )
        )
    return (
        ("**Convergence (Fig. 4/5).** " + "; ".join(parts) + ". The paper shows this only as plots.") if parts else None
    )
