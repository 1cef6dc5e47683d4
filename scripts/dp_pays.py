"""Where a DP federation pays: ``docs/bench/dp-pays.json`` (issue "The server's optimizer, and DP that pays").

From one public start (the ``small`` preset's model pretrained on the public split plus Debian's UI catalogs,
``train.public_source = "debian-ui"``), on the benchmark's non-IID setting (domain partition, 3 owners), runs:

- ``public + fedavg``: non-private FedAvg of every weight (the reference gain);
- each DP row of ``ROWS`` and ``--row`` (record-level DP-SGD, LoRA r16, the recipe of docs/privacy.md, with or
  without a server optimizer, ``federation.server_optimizer``);

then each owner's free fine-tuning of every final model (``trustformer bench finetune RUN --epochs 1 --rate 0.1``;
no ε: the fine-tuned model never leaves the owner) and, once, of the public start alone (the **control**). Rows are
named as the issue's check reads them: ``public model``, ``control``, ``public + fedavg``, ``public + fedavg +
fine-tuning``, and each DP row's label, without and with ``+ fine-tuning``. Every row has ``loss`` (shared test set,
mean over owners), ``own_loss`` (each owner's held-out pairs, mean), ``bleu`` (shared test set), and DP rows
``epsilon``; ``gain_loss`` / ``gain_own_loss`` are the share of FedAvg's gain over the control,
(control − row) / (control − public + fedavg + fine-tuning).

A row labelled ``LABEL @ GROUP`` belongs to another setting (e.g. ``public + fedavg @ 4884/owner`` with
``data.client_size=0``): its gains are measured from its group's own control and ``public + fedavg``.

Runs are cached in ``--runs`` (a finished run folder is reused; so is its fine-tuning, ``finetune.json`` in it), so
rows can be run by several processes (``--only``) and assembled by a last call. Seeds: ``--seeds 0,1`` (rows carry
the mean and every seed's value).

Usage: .venv/bin/python scripts/dp_pays.py --json docs/bench/dp-pays.json [--runs runs/dp-pays] [--seeds 0]
       [--only LABEL,LABEL] [--no-run] [--preset small] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process
from trustformer_lab.bench import finetune_bench
from trustformer_lab.bench.federation_plan import DEFAULT_SETTING, TINY_SETTING

OPTIONS: dict[str, Any] = {
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.progress": False,
    "runtime.threads": 1,
    "federation.finetune_epochs": 0,  # the free fine-tuning is this script's, the same for every row
    "train.init": "public",
    "train.public_source": "debian-ui",
}
RECIPE: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.delta": 1e-5,
    "model.adapters": "lora",
    "model.lora_rank": 16,
    "model.lora_alpha": 32.0,
}
ROWS: dict[str, dict[str, Any]] = {
    "public + fedavg": {},
    "dp ε=8": {**RECIPE, "privacy.epsilon": 8.0},
    "dp ε=8 + fedadam": {
        **RECIPE,
        "privacy.epsilon": 8.0,
        "federation.server_optimizer": "adam",
        "federation.server_lr": 0.01,
        "federation.server_tau": 1e-3,
    },
    "dp ε=1": {**RECIPE, "privacy.epsilon": 1.0},
}
FINETUNE = {"epochs": 1, "rate": 0.1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="the JSON file the rows go to")
    parser.add_argument("--runs", default="runs/dp-pays", help="where the runs' folders go (reused when finished)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    parser.add_argument("--preset", default="small", choices=("tiny", "small"))
    parser.add_argument("--only", default="", help="comma-separated row labels to run (default: every row)")
    parser.add_argument("--no-run", action="store_true", help="assemble from the finished runs only")
    parser.add_argument("--plot", default="", help="also draw the records-per-owner curve to this PNG")
    parser.add_argument("--row", action="append", default=[], help="another row: 'LABEL: key=value ...' (JSON values)")
    parser.add_argument("--set", action="append", default=[], help="more options for every run, key=value (JSON)")
    return parser.parse_args(argv)


def parse_values(items: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: expected key=value")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return values


def planned_rows(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    rows = dict(ROWS)
    for text in args.row:
        label, sep, rest = text.partition(":")
        if not sep or not label.strip():
            raise SystemExit(f"--row {text!r}: expected 'LABEL: key=value ...'")
        rows[label.strip()] = parse_values(rest.split())
    return rows


def base(label: str) -> str:
    """A row's label without its group (``LABEL @ GROUP``: rows of another setting, e.g. more records per owner,
    compared with that group's own ``public + fedavg`` and control)."""
    return label.split(" @ ")[0]


def group(label: str) -> str:
    return label.split(" @ ", 1)[1] if " @ " in label else ""


def in_group(name: str, label: str) -> str:
    return f"{name} @ {group(label)}" if group(label) else name


def folder(args: argparse.Namespace, label: str, seed: int) -> Path:
    name = label.replace(" ", "_").replace("=", "").replace("+", "plus").replace("ε", "eps").replace("/", "_per_")
    return Path(args.runs) / f"{name}-seed{seed}"


def run_row(args: argparse.Namespace, label: str, values: dict[str, Any], seed: int) -> None:
    """Run the row (unless its folder holds a finished run) and its owners' fine-tuning (unless cached)."""
    out = folder(args, label, seed)
    setting = {**(DEFAULT_SETTING if args.preset == "small" else TINY_SETTING), **OPTIONS}
    if not (out / "summary.json").is_file():
        started = time.perf_counter()
        cfg = load_config(
            args.preset, None, {**setting, **parse_values(args.set), **values, "seed": seed, "out": str(out)}
        )
        run_in_process(cfg)
        print(f"{label} seed {seed}: ran in {time.perf_counter() - started:.0f} s", flush=True)
    tuned = out / "finetune.json"
    if not tuned.is_file():
        control = base(label) == "public + fedavg"  # the public start's fine-tuning, once per seed and group
        rows = finetune_bench.sweep(out, [FINETUNE["epochs"]], [FINETUNE["rate"]], [], public=control)
        tuned.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def measured(args: argparse.Namespace, label: str, seed: int) -> dict[str, dict[str, Any]] | None:
    """The row's measured rows for one seed: its final model, the same fine-tuned, and (``public + fedavg``) the
    public model and the control; None when not finished."""
    out = folder(args, label, seed)
    if not (out / "finetune.json").is_file():
        return None
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    eps = (summary.get("privacy") or {}).get("epsilon") if isinstance(summary.get("privacy"), dict) else None
    found: dict[str, dict[str, Any]] = {}
    for r in json.loads((out / "finetune.json").read_text(encoding="utf-8")):
        name = {
            ("run", 0): label,
            ("run", 1): in_group(f"{base(label)} + fine-tuning", label),
            ("public", 0): in_group("public model", label),
            ("public", 1): in_group("control", label),
        }[(r["start"], min(r["epochs"], 1))]
        found[name] = {
            "records_per_owner": records_per_owner(out),
            "owners": int(summary["clients"]),
            # wall time: the run's (training, exchanges, evaluation), plus the owners' fine-tuning on a fine-tuned row
            "wall_s": None
            if r["start"] == "public" and not r["epochs"]  # the public start, trained once and cached
            else (float(summary["time_s"]["total"]) if r["start"] == "run" else 0.0)
            + (float(r["seconds"]) if r["epochs"] else 0.0),
            "loss": r["test_loss"],
            "own_loss": r["own_loss"],
            "bleu": r["test_bleu"],
            "own_bleu": r["own_bleu"],
            "chrf": r["test_chrf"],
            "own_loss_per_owner": r["own_loss_per_owner"],
            "epsilon": eps if r["start"] == "run" else None,
            "server_optimizer": summary.get("server_optimizer") if r["start"] == "run" else None,
            "run_folder": str(out) if r["start"] == "run" else None,
        }
    return found


def records_per_owner(out: Path) -> float:
    """The mean number of training pairs the run's owners held (their first round's ``num_examples``)."""
    sizes: dict[int, int] = {}
    for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "num_examples" in row and "client" in row:
            sizes.setdefault(int(row["client"]), int(row["num_examples"]))
    return mean(sizes.values()) if sizes else math.nan


def curve(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Item 5's curve, after the free fine-tuning, per group (records per owner): FedAvg's gain over the control and
    each DP row's, in nats of test loss, and the DP row's share of FedAvg's gain where FedAvg gains at all. The
    share is fitted as a + b·ln(records) over those points (least squares), giving the records per owner at which
    it reaches one half (extrapolated beyond the points; None when the fit does not rise)."""
    by_name = {r["run"]: r for r in rows}
    out: dict[str, Any] = {}
    tuned = [r for r in rows if base(r["run"]).endswith(" + fine-tuning") and r.get("epsilon") is not None]
    for label in sorted({base(r["run"]) for r in tuned}):
        points = []
        for r in sorted((r for r in tuned if base(r["run"]) == label), key=lambda r: r["records_per_owner"]):
            control = by_name.get(in_group("control", r["run"]))
            fedavg = by_name.get(in_group("public + fedavg + fine-tuning", r["run"]))
            if not control or not fedavg:
                continue
            fedavg_gain = control["loss"] - fedavg["loss"]
            points.append(
                {
                    "records_per_owner": r["records_per_owner"],
                    "fedavg_gain_nats": fedavg_gain,
                    "gain_nats": control["loss"] - r["loss"],
                    "own_gain_nats": control["own_loss"] - r["own_loss"],
                    "fedavg_own_gain_nats": control["own_loss"] - fedavg["own_loss"],
                    "share": (control["loss"] - r["loss"]) / fedavg_gain if fedavg_gain > 0 else None,
                }
            )
        entry: dict[str, Any] = {"points": points}
        fitted = [p for p in points if p["share"] is not None]
        if len(fitted) >= 2:
            xs, ys = [math.log(p["records_per_owner"]) for p in fitted], [p["share"] for p in fitted]
            mx, my = mean(xs), mean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
            a = my - slope * mx
            half = math.exp((0.5 - a) / slope) if slope > 0 else None
            entry["fit"] = {"share": "a + b ln(records per owner)", "a": a, "b": slope, "records_at_half": half}
        out[label] = entry
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """The curve as a figure: gain over the control (test loss, after fine-tuning) against records per owner, for
    FedAvg and each DP row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    fedavg: dict[float, float] = {}
    for label, entry in result["curve"].items():
        xs = [p["records_per_owner"] for p in entry["points"]]
        if len(xs) < 2:
            continue
        ax.plot(xs, [p["gain_nats"] for p in entry["points"]], "o-", label=label.replace(" + fine-tuning", ""))
        fedavg.update({p["records_per_owner"]: p["fedavg_gain_nats"] for p in entry["points"]})
    xs = sorted(fedavg)
    if not xs:
        print("no row has two points of the curve yet: no figure")
        plt.close(fig)
        return
    ax.plot(xs, [fedavg[x] for x in xs], "s-", color="black", label="public + FedAvg (no DP)")
    ax.plot(xs, [fedavg[x] / 2 for x in xs], ":", color="black", lw=1, label="half of FedAvg's gain")
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("records per owner (3 owners; each point its own public start)")
    ax.set_ylabel("gain over the control, nats (test loss)")
    ax.legend(fontsize=8)
    ax.set_title("Where a DP federation pays (after each owner's free fine-tuning)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def assemble(args: argparse.Namespace, labels: list[str], seeds: list[int]) -> dict[str, Any]:
    per_seed: dict[str, dict[int, dict[str, Any]]] = {}
    for label in labels:
        for seed in seeds:
            for name, row in (measured(args, label, seed) or {}).items():
                per_seed.setdefault(name, {})[seed] = row
    rows: list[dict[str, Any]] = []
    for name, by_seed in per_seed.items():
        first = next(iter(by_seed.values()))
        row: dict[str, Any] = {"run": name, "seeds": sorted(by_seed)}
        for key in ("loss", "own_loss", "bleu", "own_bleu", "chrf"):
            row[key] = mean(r[key] for r in by_seed.values())
            row[f"{key}_per_seed"] = [by_seed[s][key] for s in sorted(by_seed)]
        for key in ("records_per_owner", "owners", "epsilon", "server_optimizer", "own_loss_per_owner", "run_folder"):
            row[key] = first[key]
        walls = [r["wall_s"] for r in by_seed.values() if r.get("wall_s") is not None]
        row["wall_s"] = mean(walls) if walls else None
        rows.append(row)
    by_name = {r["run"]: r for r in rows}
    for r in rows:
        control = by_name.get(in_group("control", r["run"]))
        fedavg = by_name.get(in_group("public + fedavg + fine-tuning", r["run"]))
        for key in ("loss", "own_loss"):
            gain = control[key] - fedavg[key] if control and fedavg else math.nan
            r[f"gain_{key}"] = (control[key] - r[key]) / gain if control and gain else None
    order = ["public model", "control", "public + fedavg", "public + fedavg + fine-tuning"]
    rows.sort(
        key=lambda r: (
            group(r["run"]),
            order.index(base(r["run"])) if base(r["run"]) in order else len(order),
            r["run"],
        )
    )
    return {"rows": rows, "curve": curve(rows)}


def table(rows: list[dict[str, Any]]) -> str:
    def f(x: Any, spec: str) -> str:
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    lines = [
        "| run | ε | test loss | own loss | BLEU | gain (test) | gain (own) | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {f(r['epsilon'], '.2f')} | {r['loss']:.3f} | {r['own_loss']:.3f} | {r['bleu']:.1f} | "
            f"{f(r['gain_loss'], '.2f')} | {f(r['gain_own_loss'], '.2f')} | {','.join(map(str, r['seeds']))} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = planned_rows(args)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - set(rows)
    if unknown:
        raise SystemExit(f"--only {sorted(unknown)}: not rows of this bench ({', '.join(rows)})")
    if not args.no_run:
        for label in only or list(rows):
            for seed in seeds:
                run_row(args, label, rows[label], seed)
    result = assemble(args, list(rows), seeds)
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-run"]  # the runs it read
    result["command"] = "python scripts/dp_pays.py " + " ".join(given)
    result["setting"] = {
        "preset": args.preset,
        **(DEFAULT_SETTING if args.preset == "small" else TINY_SETTING),
        **OPTIONS,
        **parse_values(args.set),
    }
    result["finetune"] = FINETUNE
    result["row_options"] = rows
    print(table(result["rows"]))
    for label, entry in result["curve"].items():
        points = [
            (round(p["records_per_owner"]), round(p["fedavg_gain_nats"], 3), round(p["gain_nats"], 3))
            for p in entry["points"]
        ]
        print(f"{label}: (records per owner, FedAvg's gain, its gain) {points}; fit {entry.get('fit')}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.plot:
        plot(result, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
