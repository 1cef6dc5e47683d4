"""The white-box record-level audit (``attack/release_audit.py``) against a bug planted in each step of DP-SGD, at
factors 2 and 4, in each setting of tests/dp_plants.py, over several seeds; and the honest runs (false alarms,
tightness). One row per (setting, plant, factor): the ε the run reports, the true ε, ε_lb (mean and range), the
ideal mechanism's ε_lb at the same σ, q, T and canaries (the ceiling), how many seeds the audit fails (ε_lb > ε or a
conformance check), through which check, the steps the conformance names, and what the checks in every DP run
(``privacy.checks``) do with the same plant (one run of the first seed, without canaries).

    python scripts/release_audit_plants.py --seeds 5 --json runs/release-audit-plants.json
    python scripts/release_audit_plants.py --honest 40 --settings "full batch,poisson"
    python scripts/release_audit_plants.py --honest 10 --epsilon 8 --settings "full batch,poisson"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dp_plants import BANDED_ONLY, PLANTS, SETTINGS, STEP, fresh_plans, true_epsilon  # noqa: E402

from trustformer.config import load_config  # noqa: E402
from trustformer_lab.attack.release_audit import audit  # noqa: E402

FACTORS = (2.0, 4.0)


def run_one(values: dict, plant: str | None, k: float, seed: int, out: Path) -> dict:
    """One audit of the setting ``values`` with ``plant`` at factor ``k`` (None: honest)."""
    patch = pytest.MonkeyPatch()
    fresh_plans()
    try:
        if plant is not None:
            PLANTS[plant](patch, k)
        return audit(load_config("tiny", None, {**values, "seed": seed, "out": str(out)}))
    finally:
        patch.undo()
        fresh_plans()


def every_run_checks(values: dict, plant: str | None, k: float, seed: int, out: Path) -> list[str]:
    """The checks in every DP run (``privacy.checks``, core/dp_checks.py) on the same plant, without canaries: the
    checks that stopped the run, or [] if it finished."""
    import re

    from trustformer.core.dp_checks import DPCheckError
    from trustformer.engine.inprocess import run_in_process

    patch = pytest.MonkeyPatch()
    fresh_plans()
    try:
        if plant is not None:
            PLANTS[plant](patch, k)
        cfg = load_config(
            "tiny",
            None,
            {**values, "privacy.checks": True, "privacy.audit_canaries": 0, "seed": seed, "out": str(out)},
        )
        run_in_process(cfg)
        return []
    except DPCheckError as exc:
        return sorted(set(re.findall(r"DP check '(\w+)'", str(exc)))) or ["?"]
    finally:
        patch.undo()
        fresh_plans()


def applies(setting: str, plant: str | None, values: dict) -> bool:
    """A sampling plant cannot draw above q = 1: nothing to plant in a full-batch setting; a plant of banded noise's
    own sampling needs banded noise."""
    if plant in BANDED_ONLY:
        return values.get("privacy.noise_bands", 1) > 1
    return not (plant == "sampling" and values.get("privacy.batch_size") == 60)


def row_of(setting: str, plant: str | None, k: float, results: list[dict], seconds: float, checks: list[str]) -> dict:
    mech = results[0]["mechanism"]
    spent = results[0]["epsilon"]
    bands = int(SETTINGS[setting].get("privacy.noise_bands", 1))
    truth = (
        spent
        if plant is None
        else true_epsilon(plant, k, mech["noise_multiplier"], mech["sample_rate"], mech["steps"], bands=bands)
    )
    lbs = [r["epsilon_lb"] for r in results]
    failed = [r for r in results if r["verdict"] == "fail"]
    by_bound = sum(r["epsilon_lb"] > r["epsilon"] for r in results)
    named = Counter(s for r in results for s in r["conformance"]["failed_steps"])
    return {
        "setting": setting,
        "plant": plant or "none (honest)",
        "k": k,
        "epsilon": spent,
        "true_epsilon": truth,
        "epsilon_lb": lbs,
        "ceiling": sum(r["ceiling"] for r in results) / len(results),
        "mu_hat": [r["mu_hat"] for r in results],
        "mu_accountant": results[0]["mu_accountant"],
        "epsilon_measured": [r["conformance"]["epsilon_measured"] for r in results],
        "failed": len(failed),
        "failed_by_bound": by_bound,
        "failed_by_conformance": sum(r["conformance"]["verdict"] == "fail" for r in results),
        "named": dict(named),
        "right_step": None if plant is None else sum(STEP[plant] in r["conformance"]["failed_steps"] for r in results),
        "seeds": len(results),
        "every_run_checks": checks,
        "s_per_run": seconds / len(results),
        "wall_s": [r["wall_s"] for r in results],
    }


HEADER = (
    "| setting | plant | k | ε | true ε | ε_lb mean (range) | ceiling | fail: bound | fail: conformance | fail: audit "
    "| steps named | every-run checks | s per run |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def render(row: dict) -> str:
    """One row of the table (docs/privacy.md quotes these rows; tests/test_docs.py renders them from the JSON)."""
    lbs = row["epsilon_lb"]
    named = ", ".join(f"{k} {v}" for k, v in sorted(row["named"].items())) or "—"
    truth = "∞" if math.isinf(float(row["true_epsilon"])) else f"{row['true_epsilon']:.2f}"
    checks = row.get("every_run_checks")
    stopped = "—" if checks is None else ("stopped: " + ", ".join(checks) if checks else "passed")
    return (
        f"| {row['setting']} | {row['plant']} | {row['k']:g} | {row['epsilon']:.3f} | {truth} | "
        f"{sum(lbs) / len(lbs):.2f} ({min(lbs):.2f}–{max(lbs):.2f}) | {row['ceiling']:.2f} | "
        f"{row['failed_by_bound']} | {row['failed_by_conformance']} | {row['failed']} of {row['seeds']} | {named} | "
        f"{stopped} | {row['s_per_run']:.1f} |"
    )


HONEST_HEADER = (
    "| setting | ε | honest runs | fail: bound | fail: conformance | fail: audit (95% upper bound) | ε_lb mean (range) "
    "| ceiling | ε_lb / ε | μ̂ mean (range) | μ, accountant |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def render_honest(row: dict) -> str:
    """One row of the honest-runs table: false alarms and tightness."""
    from trustformer_lab.attack.audit import clopper_pearson

    lbs, mus = row["epsilon_lb"], row["mu_hat"]
    upper = clopper_pearson(row["failed"], row["seeds"], 0.95, "upper")
    return (
        f"| {row['setting']} | {row['epsilon']:.3f} | {row['seeds']} | {row['failed_by_bound']} | "
        f"{row['failed_by_conformance']} | {row['failed']} ({upper:.2f}) | "
        f"{sum(lbs) / len(lbs):.2f} ({min(lbs):.2f}–{max(lbs):.2f}) | {row['ceiling']:.2f} | "
        f"{sum(lbs) / len(lbs) / row['epsilon']:.2f} | {sum(mus) / len(mus):.3f} ({min(mus):.3f}–{max(mus):.3f}) | "
        f"{row['mu_accountant']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per planted row")
    parser.add_argument("--honest", type=int, default=0, help="honest runs only, this many seeds per setting")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--plants", default=",".join(PLANTS))
    parser.add_argument("--factors", default="2,4")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", default="runs/release-audit-plants")
    parser.add_argument("--json")
    args = parser.parse_args()
    settings = [s.strip() for s in args.settings.split(",")]
    if args.honest:
        plan = [(s, None, 1.0) for s in settings]
        seeds = args.honest
    else:
        factors = [float(f) for f in args.factors.split(",")]
        plan = [
            (s, p, k) for s in settings for p in args.plants.split(",") for k in factors if applies(s, p, SETTINGS[s])
        ]
        seeds = args.seeds
    total, done, started = len(plan) * seeds, 0, time.perf_counter()
    rows = []
    print(HEADER, flush=True)
    for setting, plant, k in plan:
        values = {**SETTINGS[setting], "privacy.epsilon": args.epsilon}
        row_started, results = time.perf_counter(), []
        for seed in range(args.first_seed, args.first_seed + seeds):
            results.append(run_one(values, plant, k, seed, Path(args.out) / "run"))
            done += 1
            left = (time.perf_counter() - started) / done * (total - done)
            print(f"  {done}/{total} runs, about {left / 60:.0f} min left", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - row_started
        checks = every_run_checks(values, plant, k, args.first_seed, Path(args.out) / "checks")
        row = row_of(setting, plant, k, results, seconds, checks)
        rows.append(row)
        print(render(row), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
