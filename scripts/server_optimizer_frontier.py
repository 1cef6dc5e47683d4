"""FedAvg against FedAdam and FedYogi (``federation.server_optimizer``, non-private) on the frontier's setting.

Runs ``local`` (the reference the gain is measured from), ``fedavg``, ``fedadam`` and ``fedyogi`` once each (one seed)
on the setting of ``trustformer bench federation`` (``small``: domain partition, 3 clients × 3000 pairs, 10 rounds;
``tiny``: its smoke form), without its attacks or fine-tuning, and prints one table: the final mean test loss on the
shared test set, the gain retained over training alone, (local − loss) / (local − FedAvg's loss), and the first round
whose mean test loss reaches FedAvg's final one. ``--adam-lr`` / ``--yogi-lr`` take several server learning rates
(a sweep: one row each). The whole frontier setting takes about 4 × 3–6 min on 2 cores; ``--preset``, ``--rounds``
and ``--client-size`` shrink it.

Usage: .venv/bin/python scripts/server_optimizer_frontier.py --out FILE.json [--preset small] [--rounds 10]
       [--client-size 3000] [--seed 0] [--adam-lr 0.1] [--yogi-lr 0.01] [--momentum-lr 1] [--runs DIR]
       [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from trustformer.config import load_config
from trustformer.engine.inprocess import run_in_process
from trustformer_lab.bench.federation_plan import DEFAULT_SETTING, TINY_SETTING

OPTIONS = {"eval.meteor": False, "eval.bertscore": False, "runtime.progress": False, "federation.finetune_epochs": 0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file the table and every run's curve go to")
    parser.add_argument("--preset", default="small", choices=("tiny", "small"))
    parser.add_argument("--rounds", type=int, default=None, help="default: the setting's (small: 10)")
    parser.add_argument("--client-size", type=int, default=None, help="pairs per client (small's setting: 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--adam-lr", default="", help="server learning rates of FedAdam, comma-separated (default: 0.1)"
    )
    parser.add_argument(
        "--yogi-lr", default="", help="server learning rates of FedYogi, comma-separated (default: 0.01)"
    )
    parser.add_argument(
        "--momentum-lr",
        default="",
        help="server learning rates of FedAvgM (momentum 0.9, Flower's default), comma-separated (default: none)",
    )
    parser.add_argument("--runs", default="runs/bench-server-optimizer", help="where the runs' folders go")
    parser.add_argument("--set", action="append", default=[], help="more options, key=value (JSON values)")
    return parser.parse_args()


def rows(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) of every run: local, fedavg, then FedAdam and FedYogi at each server learning rate."""
    out: list[tuple[str, dict[str, Any]]] = [("local", {"federation.strategy": "local"}), ("fedavg", {})]
    for name, given in (("adam", args.adam_lr), ("yogi", args.yogi_lr), ("momentum", args.momentum_lr)):
        rates: list[float | None] = [float(x) for x in given.split(",") if x.strip()] or [None]
        if name == "momentum" and not given.strip():
            continue
        for lr in rates:
            values: dict[str, Any] = {"federation.server_optimizer": name}
            if lr is not None:
                values["federation.server_lr"] = lr
            label = "fedavgm" if name == "momentum" else f"fed{name}"
            out.append((label + (f" lr={lr:g}" if lr is not None else ""), values))
    return out


def setting(args: argparse.Namespace) -> dict[str, Any]:
    """The frontier's setting for the preset, under this script's options and the user's."""
    values: dict[str, Any] = {**(DEFAULT_SETTING if args.preset == "small" else TINY_SETTING), **OPTIONS}
    if args.rounds is not None:
        values["federation.rounds"] = args.rounds
    if args.client_size is not None:
        values["data.client_size"] = args.client_size
    for item in args.set:
        key, _, text = item.partition("=")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return {**values, "seed": args.seed}


def curve(out: Path) -> list[tuple[int, float]]:
    """(round, mean test loss over the clients) after every round."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    by_round: dict[int, list[float]] = {}
    for line in lines:
        if "event" not in line and "test_loss" in line:
            by_round.setdefault(int(line["round"]), []).append(float(line["test_loss"]))
    return [(rnd, sum(v) / len(v)) for rnd, v in sorted(by_round.items())]


def run(label: str, values: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.runs) / label.replace(" ", "_").replace("=", "")
    started = time.perf_counter()
    cfg = load_config(args.preset, None, {**setting(args), **values, "out": str(out)})
    summary = run_in_process(cfg)
    result = {
        "overrides": values,
        "loss": sum(summary["test_loss"]) / len(summary["test_loss"]),
        "curve": curve(out),
        "server_optimizer": summary.get("server_optimizer"),
        "wall_s": time.perf_counter() - started,
    }
    print(f"{label}: loss {result['loss']:.4f} ({result['wall_s']:.0f} s)", flush=True)
    return result


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The side-by-side table (markdown); adds ``gain`` and ``rounds_to_fedavg`` to each row."""
    local, fedavg = results["local"]["loss"], results["fedavg"]["loss"]
    lines = ["| run | final test loss | gain | rounds to FedAvg's final loss |", "|---|---|---|---|"]
    for label, r in results.items():
        if label == "local":
            continue
        r["gain"] = (local - r["loss"]) / (local - fedavg)
        r["rounds_to_fedavg"] = next((rnd for rnd, loss in r["curve"] if loss <= fedavg + 1e-12), None)
        reached = r["rounds_to_fedavg"] if r["rounds_to_fedavg"] is not None else "not reached"
        lines.append(f"| {label} | {r['loss']:.4f} | {r['gain']:.3f} | {reached} |")
    return lines


def main() -> None:
    args = parse_args()
    results = {label: run(label, values, args) for label, values in rows(args)}
    lines = table(results)
    values = setting(args)
    print(f"\nsetting: {args.preset}, {json.dumps({k: v for k, v in values.items() if k not in OPTIONS})}")
    print(f"local (training alone): final test loss {results['local']['loss']:.4f}")
    print("\n".join(lines))
    Path(args.out).write_text(
        json.dumps({"preset": args.preset, "setting": values, "rows": results, "table": lines}, indent=2) + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
