"""What eats the DP gain: FedAvg's gain over the control, split into what the adapters, the DP recipe's few large
steps, the clipping and the noise each cost (docs/privacy.md "What eats the DP gain"), from the rows of
``scripts/dp_pays.py`` (each with the owners' free fine-tuning).

The rows, each a step from FedAvg of every weight to the ε = 8 recipe: ``lora r16`` (FedAvg of the LoRA adapters),
``dp ε=8 σ=0 unclipped`` (the recipe's batches, steps and rates, no clipping, no noise), ``dp ε=8 σ=0`` (clipping,
no noise), ``dp ε=8``; beside them ``fedavg at dp steps`` (every weight, at the recipe's number of steps). Each
cost is the drop in the share of FedAvg's gain from one row to the next, on the test set and on the owners' own
data; they add up to the whole gap by construction, and every row is measured.

    python scripts/dp_pays_diagnosis.py docs/bench/dp-pays-diagnosis-seed0.json [more seeds' JSON ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

CHAIN = [
    ("adapters", "public + fedavg", "lora r16"),
    ("few large steps", "lora r16", "dp ε=8 σ=0 unclipped"),
    ("clipping", "dp ε=8 σ=0 unclipped", "dp ε=8 σ=0"),
    ("noise", "dp ε=8 σ=0", "dp ε=8"),
]
SIDE = [("steps alone (every weight at the recipe's steps)", "public + fedavg", "fedavg at dp steps")]


def shares(path: Path) -> dict[str, tuple[float, float]]:
    """Each row's share of FedAvg's gain over the control, (test, own), with fine-tuning."""
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    out = {}
    for r in rows:
        if r["run"].endswith(" + fine-tuning"):
            out[r["run"].removesuffix(" + fine-tuning")] = (r["gain_loss"], r["gain_own_loss"])
    return out


def table(files: list[Path]) -> str:
    per_seed = [shares(f) for f in files]
    lines = [
        "| cost of | from | to | share of FedAvg's gain lost, test (per seed) | own data (per seed) |",
        "|---|---|---|---|---|",
    ]
    for what, before, after in CHAIN + SIDE:
        if not all(before in s and after in s for s in per_seed):
            lines.append(f"| {what} | {before} | {after} | not run | not run |")
            continue
        test = [s[before][0] - s[after][0] for s in per_seed]
        own = [s[before][1] - s[after][1] for s in per_seed]
        cell = lambda v: f"{mean(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})"  # noqa: E731
        lines.append(f"| {what} | {before} | {after} | {cell(test)} | {cell(own)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    print(table([Path(a) for a in argv]))


if __name__ == "__main__":
    main(sys.argv[1:])
