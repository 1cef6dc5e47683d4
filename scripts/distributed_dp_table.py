"""Per-owner against distributed noise at the same ε, whole runs (docs/privacy.md "Distributed noise").

For each ε and each ``privacy.noise``, under secure aggregation: one run scored by the membership attack (LiRA
among its scores; the server's best advantage, AUC − ½, and the ROC's ε_lb), and one audit run with gradient
canaries (the one-run ε_lb). Prints a markdown table and writes the rows as JSON.

    python scripts/distributed_dp_table.py --preset tiny --set federation.rounds=20 --json docs/bench/distributed-dp.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from trustformer.config import load_config
from trustformer_lab.attack.dp_audit import audit
from trustformer_lab.attack.membership import run_membership

BASE: dict[str, Any] = {
    "privacy.unit": "record",
    "privacy.delta": 1e-5,
    "secure.mode": "secagg",
    "data.own_test_size": 20,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.checkpoint": False,
}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def row(preset: str, values: dict[str, Any], out: Path, candidates: int, references: int) -> dict[str, Any]:
    started = time.perf_counter()
    cfg = load_config(preset, None, {**values, "out": str(out / "run")})
    attacked = run_membership(cfg, candidates=candidates, reference_models=references)
    summary = json.loads((out / "run" / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    secagg = [m["secagg_server_s"] + m.get("secagg_s", 0.0) for m in metrics if "secagg_server_s" in m]
    audited = audit(load_config(preset, None, {**values, "privacy.audit_canaries": 5000, "out": str(out / "audit")}))
    lira = (attacked.get("server") or {}).get("lira") or {}
    return {
        "epsilon_target": values["privacy.epsilon"],
        "noise": values["privacy.noise"],
        "epsilon": summary["privacy"]["epsilon"],
        "epsilon_server_and_one_owner": summary["privacy"].get("epsilon_server_and_one_owner"),
        "test_loss": statistics.mean(summary["test_loss"]),
        "bleu": statistics.mean(summary["bleu"]),
        "advantage": (attacked.get("advantage") or {}).get("auc_minus_half"),
        "advantage_score": (attacked.get("advantage") or {}).get("score"),
        "lira_advantage": lira["auc_mean"] - 0.5 if "auc_mean" in lira else None,
        "epsilon_lb_roc": (attacked.get("audit") or {}).get("epsilon_lb"),
        "epsilon_lb_one_run": audited["epsilon_lb"],
        "up_bytes_per_client_per_round": summary["bytes"]["up_per_client_per_round"],
        "down_bytes_per_client_per_round": summary["bytes"]["down_per_client_per_round"],
        "secagg_s_per_round": statistics.mean(secagg) if secagg else None,
        "wall_s": time.perf_counter() - started,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ε | noise | test loss | BLEU | best MIA adv. | LiRA adv. | ε_lb (ROC) | ε_lb (one run) | ε server+1 owner "
        "| up B/client/round | down B/client/round | secagg s/round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['epsilon']:.2f} | {r['noise']} | {r['test_loss']:.3f} | {r['bleu']:.2f} | {r['advantage']:.3f} | "
            f"{r['lira_advantage'] if r['lira_advantage'] is None else round(r['lira_advantage'], 3)} | "
            f"{r['epsilon_lb_roc']:.3f} | {r['epsilon_lb_one_run']:.3f} | "
            f"{r['epsilon_server_and_one_owner'] or r['epsilon']:.2f} | {r['up_bytes_per_client_per_round']:,.0f} | "
            f"{r['down_bytes_per_client_per_round']:,.0f} | {r['secagg_s_per_round']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--epsilons", default="1,8")
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--reference-models", type=int, default=2)
    parser.add_argument("--out", default="runs/distributed-dp")
    parser.add_argument("--json")
    args = parser.parse_args()
    extra = {k: _value(v) for k, _, v in (item.partition("=") for item in args.set)}
    rows = []
    for eps in [float(e) for e in args.epsilons.split(",")]:
        for noise in ("local", "distributed"):
            values = {**BASE, **extra, "privacy.epsilon": eps, "privacy.noise": noise}
            rows.append(
                row(args.preset, values, Path(args.out) / f"eps{eps:g}-{noise}", args.candidates, args.reference_models)
            )
            print(table(rows[-1:]), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
