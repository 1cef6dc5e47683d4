"""The one-run audit of client-level DP (dp-fedavg, canary clients; attack/client_dp_audit.py) against a bug planted in
each step of the DP wrapper, at several factors and seeds: clipping (every update clipped at k·C, noise σ·C; k = inf:
not clipped), noise (σ/k on the sum), noise on part of the model (σ/k on every other tensor, or on the decoder; k =
inf: none there), sampling (clients drawn at k × the accounted rate) and accounting (σ solved, and rounds counted, for
the rounds / k). The plants are the ones of tests/test_client_dp_audit.py, monkeypatched into the real code path.
Prints one row per (setting, plant, k): the ε the run reports, the true ε (the accountant's ε of the mechanism that
ran), ε_lb per seed, Andrew et al.'s estimate ε̂ (mean over seeds; an estimate, not a bound) and how many seeds fail
the audit (ε_lb > ε).

    python scripts/client_audit_plants.py --seeds 3 --json runs/client-audit-plants.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_client_dp_audit import LONG, PLANTS, PRESET, SAMPLED, true_epsilon  # noqa: E402

from trustformer.config import load_config  # noqa: E402
from trustformer_lab.attack.client_dp_audit import audit  # noqa: E402

INF = math.inf
SETTINGS = {"q=1, 2 rounds": PRESET, "q=0.2, 10 rounds": SAMPLED, "q=1, 16 rounds": LONG}
SWEEP: dict[str, list[tuple[str | None, float, int]]] = {  # (plant, k, canaries)
    "q=1, 2 rounds": [
        (None, 1.0, 2000),
        ("clipping", 2.0, 2000),
        ("clipping", 4.0, 2000),
        ("clipping", INF, 2000),
        ("noise", 2.0, 2000),
        ("noise", 4.0, 2000),
        ("partial", INF, 2000),
        ("partial", 4.0, 2000),
        ("partial", 4.0, 5000),
        ("decoder", INF, 2000),
        ("decoder", 4.0, 2000),
    ],
    "q=0.2, 10 rounds": [(None, 1.0, 2000), ("sampling", 2.0, 2000), ("sampling", 5.0, 2000)],
    "q=1, 16 rounds": [(None, 1.0, 2000), ("accounting", 2.0, 2000), ("accounting", 16.0, 2000)],
}


def _run(values: dict, plant: str | None, k: float, canaries: int, seed: int, out: Path) -> dict:
    patch = pytest.MonkeyPatch()
    try:
        if plant is not None:
            PLANTS[plant](patch, k)
        return audit(load_config("tiny", None, {**values, "seed": seed, "out": str(out)}), canaries)
    finally:
        patch.undo()


def _row(setting: str, plant: str | None, k: float, canaries: int, seeds: int, out: Path) -> dict:
    values = SETTINGS[setting]
    started = time.perf_counter()
    results = [_run(values, plant, k, canaries, seed, out) for seed in range(seeds)]
    mech, spent = results[0]["mechanism"], results[0]["epsilon"]
    rounds = values.get("federation.rounds", 2)
    truth = spent if plant is None else true_epsilon(plant, k, mech["noise_multiplier"], mech["sampling_rate"], rounds)
    lbs = [r["epsilon_lb"] for r in results]
    return {
        "setting": setting,
        "plant": plant or "none (honest)",
        "k": k,
        "canaries": canaries,
        "epsilon": spent,
        "true_epsilon": truth,
        "epsilon_lb": lbs,
        "epsilon_estimate_mean": sum(r["epsilon_estimate"] for r in results) / seeds,
        "failed": sum(r["epsilon_lb"] > r["epsilon"] for r in results),
        "seeds": seeds,
        "s_per_run": (time.perf_counter() - started) / seeds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/client-audit-plants")
    parser.add_argument("--only", help="comma-separated plants to run (honest rows always run)")
    parser.add_argument("--settings", help=f"semicolon-separated settings to run (default all: {'; '.join(SETTINGS)})")
    parser.add_argument("--json")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    settings = [s.strip() for s in args.settings.split(";")] if args.settings else list(SETTINGS)
    rows = []
    print("| setting | plant | k | canaries | ε | true ε | ε_lb per seed | ε̂ mean | fails the audit | s per run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting, sweep in SWEEP.items():
        if setting not in settings:
            continue
        for plant, k, canaries in sweep:
            if only is not None and plant is not None and plant not in only:
                continue
            row = _row(setting, plant, k, canaries, args.seeds, Path(args.out) / "run")
            rows.append(row)
            print(
                f"| {setting} | {row['plant']} | {k:g} | {canaries} | {row['epsilon']:.3f} | "
                f"{row['true_epsilon']:.2f} | {', '.join(f'{lb:.2f}' for lb in row['epsilon_lb'])} | "
                f"{row['epsilon_estimate_mean']:.2f} | {row['failed']} of {args.seeds} | {row['s_per_run']:.1f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
