"""SCAFFOLD against FedAvg on a non-IID split: the rounds each takes to reach FedAvg's final test loss
(``docs/bench/scaffold.json``; issue "Two halves", SCAFFOLD as the proof).

Both runs share every option and the seed; only ``federation.strategy`` differs. The table has each round's test
loss (mean over the owners), the first round at which each run is at or below FedAvg's final loss, and the ratio of
those rounds. The benchmark can fail: a SCAFFOLD whose corrections do nothing, or hurt, needs as many rounds as
FedAvg or never gets there, and the table says so.

    python scripts/scaffold_bench.py --json docs/bench/scaffold.json [--runs runs/scaffold] [--seed 0]
        [--preset small] [--set data.client_size=1000 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import mean
from typing import Any

from trustformer.config import load_config, parse_override
from trustformer.engine.inprocess import run_in_process

SETTING: dict[str, Any] = {
    "data.partition": "domain",  # each owner's pairs from its own domains: the drift SCAFFOLD corrects
    "data.client_size": 1000,
    "data.own_test_size": 100,
    "federation.clients": 3,
    "federation.rounds": 10,
    "federation.finetune_epochs": 0,
    "eval.meteor": False,
    "eval.bertscore": False,
    "runtime.progress": False,
    "runtime.threads": 1,
}
STRATEGIES = ("fedavg", "scaffold")


def per_round_loss(out: Path) -> list[float]:
    """The mean test loss over the owners of each round, in round order."""
    rows: dict[int, list[float]] = {}
    for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "test_loss" in row and "round" in row and "client" in row:
            rows.setdefault(int(row["round"]), []).append(float(row["test_loss"]))
    return [mean(rows[r]) for r in sorted(rows)]


def first_round_at(losses: list[float], target: float) -> int | None:
    return next((i + 1 for i, loss in enumerate(losses) if loss <= target + 1e-12), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--runs", default="runs/scaffold")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    setting = {**SETTING, **dict(parse_override(s) for s in args.set), "seed": args.seed}
    runs: dict[str, dict[str, Any]] = {}
    for strategy in STRATEGIES:
        out = Path(args.runs) / f"{strategy}-seed{args.seed}"
        if not (out / "summary.json").exists():
            started = time.perf_counter()
            run_in_process(
                load_config(args.preset, None, {**setting, "federation.strategy": strategy, "out": str(out)})
            )
            print(f"{strategy}: ran in {time.perf_counter() - started:.0f} s", flush=True)
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        runs[strategy] = {"losses": per_round_loss(out), "time_s": summary.get("time_s"), "bytes": summary.get("bytes")}
    target = runs["fedavg"]["losses"][-1]
    for run in runs.values():
        run["rounds_to_fedavg_final"] = first_round_at(run["losses"], target)
    fedavg_rounds = runs["fedavg"]["rounds_to_fedavg_final"]
    scaffold_rounds = runs["scaffold"]["rounds_to_fedavg_final"]
    result = {
        "command": f"python scripts/scaffold_bench.py --json {args.json} --seed {args.seed}"
        + (f" --preset {args.preset}" if args.preset != "small" else "")
        + "".join(f" --set {s}" for s in args.set),
        "preset": args.preset,
        "setting": setting,
        "fedavg_final_loss": target,
        "runs": runs,
        "rounds_ratio": scaffold_rounds / fedavg_rounds if scaffold_rounds else None,
    }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print("| round | " + " | ".join(STRATEGIES) + " |\n|---|" + "---|" * len(STRATEGIES))
    for i in range(len(runs["fedavg"]["losses"])):
        print(f"| {i + 1} | " + " | ".join(f"{runs[s]['losses'][i]:.4f}" for s in STRATEGIES) + " |")
    reached = lambda r: f"round {r}" if r else "never"  # noqa: E731
    ratio = f" ({result['rounds_ratio']:.2f}× FedAvg's rounds)" if scaffold_rounds else ""
    print(
        f"FedAvg's final loss {target:.4f}: FedAvg at {reached(fedavg_rounds)}, "
        f"SCAFFOLD at {reached(scaffold_rounds)}{ratio}"
    )


if __name__ == "__main__":
    main()
