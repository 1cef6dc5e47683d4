"""The one-run audit against a bug planted in each step of DP-SGD, at several factors and seeds: sampling (the sampler
draws at k × the accounted rate), clipping (records clipped at k·C, noise σ·C), noise (σ/k on every other tensor) and
accounting (σ solved, and ε reported, for a rate k × smaller than the sampler's). The plants are the ones of
tests/test_audit_plants.py, monkeypatched into the real code path. Prints one row per (setting, plant, k): the ε the
run reports, the true ε (the accountant's ε of the mechanism that ran), ε_lb per seed and how many seeds fail the
audit (ε_lb > ε). docs/privacy.md "Auditing the guarantee".

    python scripts/audit_step_plants.py --seeds 5 --json runs/audit-step-plants.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_audit_plants import BASE, FULL_BATCH, PLANTS, SAMPLED, true_epsilon  # noqa: E402

from trustformer.config import load_config  # noqa: E402
from trustformer.tasks import record_dp  # noqa: E402
from trustformer_lab.attack.dp_audit import audit  # noqa: E402

PRESET = {**BASE, "privacy.batch_size": 60}  # the preset's run: q = 1, one local epoch, two DP-SGD steps
SETTINGS = {"q=1, 2 steps": PRESET, "q=1, 10 steps": FULL_BATCH, "q=0.2, 10 steps": SAMPLED}
SWEEP = {
    "q=1, 2 steps": [
        ("clipping", 4.0),
        ("clipping", 5.0),
        ("noise", 4.0),
        ("noise", 10.0),
        ("accounting", 5.0),
        ("accounting", 10.0),
    ],
    "q=1, 10 steps": [
        ("clipping", 3.0),
        ("clipping", 4.0),
        ("noise", 4.0),
        ("noise", 8.0),
        ("noise", 10.0),
        ("accounting", 3.0),
        ("accounting", 5.0),
    ],
    "q=0.2, 10 steps": [("sampling", 3.0), ("sampling", 5.0), ("clipping", 4.0), ("accounting", 5.0)],
}


def _run(values: dict, plant: str | None, k: float, seed: int, out: Path) -> dict:
    patch = pytest.MonkeyPatch()
    record_dp._plan.cache_clear()
    record_dp._sigma.cache_clear()
    try:
        if plant is not None:
            PLANTS[plant][0](patch, k)
        return audit(load_config("tiny", None, {**values, "seed": seed, "out": str(out)}))
    finally:
        patch.undo()
        record_dp._plan.cache_clear()
        record_dp._sigma.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="runs/audit-step-plants")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print("| setting | plant | k | ε | true ε | ε_lb per seed | fails the audit | s per run |")
    print("|---|---|---|---|---|---|---|---|")
    for setting, values in SETTINGS.items():
        for plant, k in [(None, 1.0), *SWEEP[setting]]:
            started, results = time.perf_counter(), []
            for seed in range(args.seeds):
                results.append(_run(values, plant, k, seed, Path(args.out) / "run"))
            mech = results[0]["mechanism"]
            spent = results[0]["epsilon"]
            truth = (
                spent
                if plant is None
                else true_epsilon(plant, k, mech["noise_multiplier"], mech["sample_rate"], mech["steps"])
            )
            lbs = [r["epsilon_lb"] for r in results]
            row = {
                "setting": setting,
                "plant": plant or "none (honest)",
                "k": k,
                "epsilon": spent,
                "true_epsilon": truth,
                "epsilon_lb": lbs,
                "failed": sum(lb > r["epsilon"] for lb, r in zip(lbs, results)),
                "seeds": args.seeds,
                "s_per_run": (time.perf_counter() - started) / args.seeds,
            }
            rows.append(row)
            print(
                f"| {setting} | {row['plant']} | {k:g} | {spent:.3f} | {truth:.2f} | "
                f"{', '.join(f'{lb:.2f}' for lb in lbs)} | {row['failed']} of {args.seeds} | {row['s_per_run']:.1f} |",
                flush=True,
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
