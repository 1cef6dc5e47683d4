"""The checks in every DP run (``privacy.checks``, core/dp_checks.py) against a bug planted in each step of DP-SGD,
at factors 2 and 4, on `tiny`: the plants of tests/test_dp_checks.py (and tests/test_audit_plants.py), monkeypatched
into the real code path. Prints one row per (setting, plant, k): the seeds whose run stopped, and the checks the
stopping client named.

    python scripts/dp_checks_plants.py --seeds 3 --json runs/dp-checks-plants.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_dp_checks import PLANTS, PRESET, SAMPLED, run  # noqa: E402

from trustformer.tasks import record_dp  # noqa: E402

SETTINGS = {"q=1, 2 steps (the preset)": PRESET, "q=0.1, 20 steps": SAMPLED}


def _one(values: dict, plant: str, k: float, seed: int) -> list[str]:
    record_dp._plan.cache_clear()
    record_dp._sigma.cache_clear()
    with tempfile.TemporaryDirectory() as out:
        result = run(Path(out), {**values, "seed": seed}, plant, k)
    record_dp._plan.cache_clear()
    record_dp._sigma.cache_clear()
    return sorted(set(re.findall(r"DP check '(\w+)'", result["error"]))) if "error" in result else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--factors", type=float, nargs="+", default=[2.0, 4.0])
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    rows = []
    print("| setting | plant | k | stopped | checks that failed | seconds |")
    print("|---|---|---|---|---|---|")
    for setting, values in SETTINGS.items():
        for plant in PLANTS:
            for k in args.factors:
                started = time.perf_counter()
                seen = [_one(values, plant, k, seed) for seed in range(args.seeds)]
                caught = sum(bool(s) for s in seen)
                names = sorted({n for s in seen for n in s})
                seconds = time.perf_counter() - started
                rows.append(
                    {
                        "setting": setting,
                        "plant": plant,
                        "k": k,
                        "stopped": caught,
                        "seeds": args.seeds,
                        "checks": names,
                    }
                )
                print(
                    f"| {setting} | {plant} | {k:g} | {caught}/{args.seeds} | {', '.join(names) or '-'} | "
                    f"{seconds:.1f} |",
                    flush=True,
                )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
