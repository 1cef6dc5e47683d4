"""The table of ``trustformer bench federation``: one row per label (seeds averaged), the gain retained over training
alone, the Pareto front of (gain, upload, membership advantage) and the printed table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, cast

from .federation_plan import BenchRun


def gain_retained(value: float, local: float, fedavg: float, *, higher_is_better: bool = False) -> float:
    """(L_local − L) / (L_local − L_fedavg) for a loss, (B − B_local) / (B_fedavg − B_local) for a score; NaN when
    FedAvg is no better than training alone."""
    gap = (fedavg - local) if higher_is_better else (local - fedavg)
    gain = (value - local) if higher_is_better else (local - value)
    return gain / gap if gap > 0 else math.nan


METRICS = (
    ("loss", "test_loss", False),
    ("bleu", "bleu", True),
    ("own_loss", "own_test_loss", False),
    ("own_bleu", "own_bleu", True),
)


def mean_of(values: Sequence[float | None]) -> float:
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.fmean(kept) if kept else math.nan


def table(runs: list[BenchRun], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per label (seeds averaged, their spread kept), plus a ``+ fine-tuning`` row per label."""
    by_label: dict[str, list[tuple[BenchRun, dict[str, Any]]]] = {}
    for run, result in zip(runs, results, strict=True):
        by_label.setdefault(run.label, []).append((run, result))
    rows = []
    for label, group in by_label.items():
        for tuned in (False, True):
            if tuned and label in ("local", "public model"):  # nothing to fine-tune after / scored untrained
                continue
            if tuned and not any("ft_test_loss" in res["summary"] for _, res in group):  # finetune_epochs = 0
                continue
            rows.append(_row(label + (" + fine-tuning" if tuned else ""), group, tuned))
    local, fedavg = rows[0], next(r for r in rows if r["run"] == "fedavg")
    up, down = fedavg["up_bytes"], fedavg["down_bytes"]
    for row in rows:
        for name, _key, higher in METRICS:  # per seed against local and FedAvg of the same seed, then averaged
            row[f"gain_{name}_per_seed"] = [
                gain_retained(v, lv, fv, higher_is_better=higher)
                for v, lv, fv in zip(
                    row[f"{name}_per_seed"], local[f"{name}_per_seed"], fedavg[f"{name}_per_seed"], strict=True
                )
            ]
            spread = row[f"gain_{name}_per_seed"]
            row[f"gain_{name}"] = mean_of(spread)
            row[f"gain_{name}_spread"] = (max(spread) - min(spread)) / 2 if len(spread) > 1 else math.nan
        row["upload_vs_fedavg"] = row["up_bytes"] / up if up else math.nan
        row["download_vs_fedavg"] = row["down_bytes"] / down if down else math.nan
    public_refs = [next((r for r in rows if r["run"] == name), None) for name in ("public + local", "public + fedavg")]
    if all(public_refs):  # the public-start references: public + training alone = 0, public + FedAvg = 1
        p_local, p_fedavg = cast("list[dict[str, Any]]", public_refs)  # all(...): both found
        for row in rows:
            for name, _key, higher in METRICS:
                per_seed = [
                    gain_retained(v, lv, fv, higher_is_better=higher)
                    for v, lv, fv in zip(
                        row[f"{name}_per_seed"], p_local[f"{name}_per_seed"], p_fedavg[f"{name}_per_seed"], strict=True
                    )
                ]
                row[f"pgain_{name}_per_seed"] = per_seed
                row[f"pgain_{name}"] = mean_of(per_seed)
    for row in rows:
        _bytes_to_target(row, local, fedavg)
    mark_pareto(rows, "gain_loss", "pareto")
    mark_pareto(rows, "gain_own_loss", "pareto_own")
    return rows


TARGET_SHARE = 0.9
"""The bytes-to-target column's target: this share of FedAvg's final gain over training alone (shared test loss)."""


def _bytes_to_target(row: dict[str, Any], local: dict[str, Any], fedavg: dict[str, Any]) -> None:
    """``row["bytes_to_target_per_seed"]``: per seed, the cumulative bytes (up + down, all clients) after the first
    round whose mean shared-test loss is at most local − 0.9·(local − FedAvg), the same seed's final losses; None
    where the run never gets there. ``bytes_to_target``: their mean when every seed got there, else NaN."""
    refs = {
        seed: (lv, fv)
        for seed, lv, fv in zip(local["seeds"], local["loss_per_seed"], fedavg["loss_per_seed"], strict=True)
        if seed in fedavg["seeds"]
    }
    reached: list[float | None] = []
    for seed, points in zip(row["seeds"], row["curves"], strict=True):
        if seed not in refs or not points:
            reached.append(None)
            continue
        lv, fv = refs[seed]
        target = lv - TARGET_SHARE * (lv - fv)
        reached.append(next((float(b) for _rnd, loss, b in points if loss <= target), None))
    row["bytes_to_target_per_seed"] = reached
    row["bytes_to_target"] = mean_of(reached) if reached and all(b is not None for b in reached) else math.nan


def _row(label: str, group: list[tuple[BenchRun, dict[str, Any]]], tuned: bool) -> dict[str, Any]:
    run0, first = group[0]
    row: dict[str, Any] = {
        "run": label,
        "strategy": first["config"]["federation"]["strategy"],
        "beta": run0.beta,
        "overrides": run0.overrides,
        "seeds": [r.seed for r, _ in group],
        "wall_s": mean_of([res["wall_s"] for _, res in group]),
    }
    prefix = "ft_" if tuned else ""
    for name, key, _higher in METRICS:
        per_seed = [mean_of(res["summary"].get(prefix + key) or [math.nan]) for _, res in group]
        row[f"{name}_per_seed"] = per_seed
        row[name] = mean_of(per_seed)
        row[f"{name}_spread"] = (max(per_seed) - min(per_seed)) / 2 if len(per_seed) > 1 else math.nan
    row["curves"] = [res.get("curve") or [] for _, res in group]
    row["total_bytes"] = mean_of([_total_bytes(res["summary"]) for _, res in group])
    row["server_s_per_round"] = mean_of([_server_s(res["summary"]) for _, res in group])
    row["download_code_s_per_round"] = mean_of([_server_s(res["summary"], "download_code_s") for _, res in group])
    bytes_ = first["summary"]["bytes"]
    row["up_bytes"], row["down_bytes"] = bytes_["up_per_client_per_round"], bytes_["down_per_client_per_round"]
    mia = [res["membership"].get("advantage") or {} for _, res in group]
    row["mia_advantage"] = mean_of([m.get("auc_minus_half") for m in mia])
    row["mia_advantage_per_seed"] = [m.get("auc_minus_half") for m in mia]
    row["mia_tpr_1pct"] = mean_of([m.get("tpr_at_1pct_fpr") for m in mia])
    row["mia_score"] = mia[0].get("score")
    row["mia_ci95"] = mia[0].get("auc_ci95")
    row["true_local_auc"] = mean_of([_best(res["membership"].get("true-local", {})) for _, res in group])
    row["epsilon"] = mean_of([(res["summary"].get("privacy") or {}).get("epsilon") for _, res in group])
    row["epsilon_lb"] = mean_of([(res["membership"].get("audit") or {}).get("epsilon_lb") for _, res in group])
    row["recovered"] = mean_of([res["attack"]["recovered_fraction_mean"] for _, res in group])
    row["relative_error"] = mean_of([res["attack"]["relative_error_mean"] for _, res in group])
    row["samples"] = (first["summary"].get("samples") or {}).get("0", [])[:2]
    return row


def _total_bytes(summary: dict[str, Any]) -> float:
    per_round = (summary.get("bytes") or {}).get("per_round")
    return float(sum(r["up"] + r["down"] for r in per_round)) if per_round else math.nan


def _server_s(summary: dict[str, Any], phase: str | None = None) -> float:
    """The server's seconds per round: every phase it timed, or one (``download_code_s``)."""
    times, rounds = summary.get("server_time_s") or {}, summary.get("rounds") or 0
    if not rounds or not times:
        return math.nan
    return (sum(times.values()) if phase is None else times.get(phase, 0.0)) / rounds


def _best(view: dict[str, Any]) -> float:
    return max((s["auc_mean"] for s in view.values()), default=math.nan)


def _tolerance(rows: list[dict[str, Any]], key: str) -> float:
    """The typical seed-to-seed spread of ``key`` (median over the rows run with several seeds)."""
    spreads = [r[f"{key}_spread"] for r in rows if not math.isnan(r.get(f"{key}_spread", math.nan))]
    return statistics.median(spreads) if spreads else 0.0


def mark_pareto(rows: list[dict[str, Any]], gain_key: str, flag: str) -> None:
    """``row[flag]``: no other row is at least as good on gain (↑), upload (↓) and membership advantage (↓) and
    better on one, beyond the seed-to-seed spread (a smaller difference is a tie); ``row[flag + "_by"]`` names
    the rows that dominate it."""
    gain_tol = _tolerance(rows, gain_key)
    adv_tol = 0.02  # membership AUC: differences below this are within its bootstrap noise at n = 300
    for row in rows:
        dominated_by = []
        for other in rows:
            if other is row or any(math.isnan(other[k]) for k in (gain_key, "upload_vs_fedavg", "mia_advantage")):
                continue
            no_worse = (
                other[gain_key] >= row[gain_key] - gain_tol
                and other["upload_vs_fedavg"] <= row["upload_vs_fedavg"] * 1.02
                and other["mia_advantage"] <= row["mia_advantage"] + adv_tol
            )
            better = (
                other[gain_key] > row[gain_key] + gain_tol
                or other["upload_vs_fedavg"] < row["upload_vs_fedavg"] * 0.98
                or other["mia_advantage"] < row["mia_advantage"] - adv_tol
            )
            if no_worse and better:
                dominated_by.append(other["run"])
        row[flag] = not dominated_by and not math.isnan(row[gain_key])
        row[flag + "_by"] = dominated_by


def format_table(rows: list[dict[str, Any]]) -> str:
    public = any("pgain_loss" in r for r in rows)
    head = (
        f"{'run':<48} {'loss':>6} {'±':>5} {'BLEU':>5} {'own':>6} {'gain':>5} {'±':>4} {'gBLEU':>5} {'g own':>5} "
        + (f"{'pgain':>5} {'pgown':>5} " if public else "")
        + f"{'up':>6} {'down':>5} {'MIA':>5} {'TPR1%':>5} {'ε':>5} {'ε_lb':>5} {'rec.':>6} {'front':>5}"
    )
    lines = [head, "-" * len(head)]

    def num(value: float, width: int, digits: int) -> str:
        if value is None or math.isnan(value):
            return f"{'n/a':>{width}}"
        for shown in range(digits, -1, -1):  # fewer digits, then powers of ten: a diverged run keeps the columns
            text = f"{value:>{width}.{shown}f}"
            if len(text) <= width:
                return text
        return f"{value:>{width}.0e}"

    for r in rows:
        front = ("*" if r["pareto"] else "") + ("†" if r["pareto_own"] else "")
        lines.append(
            f"{r['run']:<48} {num(r['loss'], 6, 3)} {num(r['loss_spread'], 5, 3)} {num(r['bleu'], 5, 1)} "
            f"{num(r['own_loss'], 6, 3)} {num(r['gain_loss'], 5, 2)} {num(r['gain_loss_spread'], 4, 2)} "
            f"{num(r['gain_bleu'], 5, 2)} {num(r['gain_own_loss'], 5, 2)} "
            + (
                f"{num(r.get('pgain_loss', math.nan), 5, 2)} {num(r.get('pgain_own_loss', math.nan), 5, 2)} "
                if public
                else ""
            )
            + f"{num(r['upload_vs_fedavg'], 6, 3)} "
            f"{num(r['download_vs_fedavg'], 5, 2)} {num(r['mia_advantage'], 5, 3)} "
            f"{num(r['mia_tpr_1pct'], 5, 3)} {num(r.get('epsilon', math.nan), 5, 2)} "
            f"{num(r.get('epsilon_lb', math.nan), 5, 2)} {num(r['recovered'], 6, 4)} {front:>5}"
        )
    lines.append(
        "loss: mean test loss on the shared test set (± half the seed range); own: on each client's own "
        "held-out "
        "data; gain / gBLEU / g own: gain retained over training alone (FedAvg = 1) on pooled loss, pooled "
        "BLEU, own-data loss; "
        + (
            "pgain / pgown: the same on pooled and own-data loss against the "
            "public-start references (public + local = 0, public + fedavg = 1); "
            if public
            else ""
        )
        + "up / down: bytes per client per round / FedAvg's; MIA: the server's membership "
        "advantage (AUC − 0.5 of its best score, LiRA included); TPR1%: its TPR at 1% FPR; ε: the DP "
        "guarantee the run reports (record level: the largest client's); ε_lb: the attack's empirical lower "
        "bound on ε (Clopper-Pearson, 95%); rec.: weights it recovers "
        "exactly; front: * on the Pareto front of (gain, up, MIA), † with own-data gain"
    )
    return "\n".join(lines)


def format_bytes_table(rows: list[dict[str, Any]]) -> str:
    """Bytes both ways: per run (fine-tuning rows left out: same bytes), the total bytes of the run and the bytes
    to the target (:data:`TARGET_SHARE` of FedAvg's gain), each also against FedAvg's, and the server's time."""
    fedavg = next(r for r in rows if r["run"] == "fedavg")
    head = (
        f"{'run':<44} {'loss':>6} {'gain':>5} {'up':>6} {'down':>6} {'total MB':>9} {'× FedAvg':>8} "
        f"{'to 90% MB':>9} {'× FedAvg':>8} {'seeds':>5} {'server ms/rnd':>13} {'coding ms/rnd':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["run"].endswith(" + fine-tuning") or r["run"] in ("local", "public model"):
            continue
        got = sum(b is not None for b in r["bytes_to_target_per_seed"])
        to_target = (
            f"{r['bytes_to_target'] / 1e6:>9.1f}" if not math.isnan(r["bytes_to_target"]) else f"{'not reached':>9}"
        )
        ratio = r["bytes_to_target"] / fedavg["bytes_to_target"] if fedavg["bytes_to_target"] else math.nan
        shown_ratio = "" if math.isnan(ratio) else f"{ratio:.4f}"
        seeds = f"{got}/{len(r['seeds'])}"
        lines.append(
            f"{r['run']:<44} {r['loss']:>6.3f} {r['gain_loss']:>5.2f} {r['upload_vs_fedavg']:>6.4f} "
            f"{r['download_vs_fedavg']:>6.4f} {r['total_bytes'] / 1e6:>9.1f} "
            f"{r['total_bytes'] / fedavg['total_bytes']:>8.4f} {to_target} "
            f"{shown_ratio:>8} {seeds:>5} "
            f"{r['server_s_per_round'] * 1e3:>13.1f} {r['download_code_s_per_round'] * 1e3:>13.1f}"
        )
    lines.append(
        "gain: retained over training alone on the shared test loss (from-scratch FedAvg = 1); up / down: bytes per "
        "client per round / FedAvg's; total: up + down, all clients, all rounds; to 90%: the total until the mean "
        f"shared-test loss first reaches {TARGET_SHARE:.0%} of FedAvg's final gain (seeds: how many got there; the "
        "mean needs all); server: its timed phases per round (aggregation, coding, checks); coding: the download "
        "coding's share of it"
    )
    return "\n".join(lines)


__all__ = ["METRICS", "TARGET_SHARE", "format_bytes_table", "format_table", "gain_retained", "mark_pareto", "table"]
