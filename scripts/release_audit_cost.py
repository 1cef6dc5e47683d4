"""What the release audit and the checks in every DP run cost, side by side in one process, per setting of
tests/dp_plants.py: the same run without canaries and without checks (plain), with the checks in every run
(``privacy.checks``), and the release audit (canaries, the log, then the bound and the conformance). Each figure is the
median of ``--repeats`` runs, seeds alike; run it on an idle machine.

    python scripts/release_audit_cost.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dp_plants import SETTINGS, fresh_plans  # noqa: E402

from trustformer.config import load_config  # noqa: E402
from trustformer.engine.inprocess import run_in_process  # noqa: E402
from trustformer_lab.attack.release_audit import audit  # noqa: E402


def _timed(run) -> float:
    fresh_plans()
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", default="full batch,poisson,distributed")
    parser.add_argument("--out", default="runs/release-audit-cost")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="on top of the setting")
    args = parser.parse_args()
    print(f"preset {args.preset}", " ".join(args.set))
    print("| setting | plain run s | with every-run checks s | checks / plain | audit s | audit / plain |")
    print("|---|---|---|---|---|---|")
    for setting in [s.strip() for s in args.settings.split(",")]:
        extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
        values = {**SETTINGS[setting], **extra, "out": str(Path(args.out) / "run")}
        plain_cfg = load_config(args.preset, None, {**values, "privacy.audit_canaries": 0, "privacy.checks": False})
        checked_cfg = load_config(args.preset, None, {**values, "privacy.audit_canaries": 0, "privacy.checks": True})
        audit_cfg = load_config(args.preset, None, {**values, "privacy.checks": True})
        _timed(lambda: run_in_process(plain_cfg))  # warm: the data, the tokenizer, the public start
        plain, checked, audited = [], [], []
        for _ in range(args.repeats):
            plain.append(_timed(lambda: run_in_process(plain_cfg)))
            checked.append(_timed(lambda: run_in_process(checked_cfg)))
            audited.append(_timed(lambda: audit(audit_cfg)))
        p, c, a = (statistics.median(v) for v in (plain, checked, audited))
        print(f"| {setting} | {p:.2f} | {c:.2f} | {c / p:.3f} | {a:.2f} | {a / p:.2f} |", flush=True)


if __name__ == "__main__":
    main()
