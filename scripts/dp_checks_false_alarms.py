"""False alarms of the checks in every DP run (``privacy.checks``, core/dp_checks.py): honest `tiny` record-DP runs
(the operating system's noise and sampling, each its own seed), counted where a check stopped the run, with the
checks' share of the DP-SGD time (each client's ``dpcheck_s`` over its ``train_s``, summed over the run).

    python scripts/dp_checks_false_alarms.py --seeds 40 --json runs/dp-checks-false-alarms.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_dp_checks import PRESET, SAMPLED, run  # noqa: E402

PRIVATE = {"privacy.noise_source": "os"}  # the honest run: the operating system's noise and draws, fresh each run
SETTINGS = {"q=1, 2 steps (the preset)": {**PRESET, **PRIVATE}, "q=0.1, 20 steps": {**SAMPLED, **PRIVATE}}


def _one(values: dict, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = run(Path(out), {**values, "seed": seed})
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    checked = [r for r in rows if "dpcheck_s" in r]
    verdicts = {}
    if "error" not in result:
        for client in result["privacy"]["clients"].values():
            for c in client["checks"]:
                verdicts.setdefault(c["name"], set()).add(c["verdict"])
    return {
        "seed": seed,
        "alarm": result.get("error", ""),
        "check_s": sum(r["dpcheck_s"] for r in checked),
        "train_s": sum(r["train_s"] for r in checked),
        "wall_s": wall,
        "verdicts": {k: sorted(v) for k, v in verdicts.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    table = []
    for setting, values in SETTINGS.items():
        runs = [_one(values, seed) for seed in range(args.seeds)]
        alarms = [r for r in runs if r["alarm"]]
        for r in alarms:
            print(f"{setting} seed {r['seed']}: {r['alarm']}", flush=True)
        share = sum(r["check_s"] for r in runs) / sum(r["train_s"] for r in runs)
        skipped = sorted({n for r in runs for n, v in r["verdicts"].items() if "skipped" in v})
        row = {
            "setting": setting,
            "seeds": args.seeds,
            "false_alarms": len(alarms),
            "checks_share_of_dp_sgd": share,
            "mean_run_s": sum(r["wall_s"] for r in runs) / len(runs),
            "skipped": skipped,
        }
        table.append(row)
        print(
            f"| {setting} | {args.seeds} | {len(alarms)} | {100 * share:.1f} % | {row['mean_run_s']:.2f} | "
            f"{', '.join(skipped) or '-'} |",
            flush=True,
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
