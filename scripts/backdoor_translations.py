"""What a backdoor does to the translations people read: the first ``--count`` sources of the shared test set,
translated clean and with the run's trigger appended (greedy decoding, as the bench's ``backdoor_success``), by the
final model of each finished run; a Markdown table per run (docs/robustness.md).

Usage: .venv/bin/python scripts/backdoor_translations.py [--count 4] RUN_FOLDER [RUN_FOLDER ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trustformer.config.faults import BACKDOOR_TARGET, BACKDOOR_TRIGGER
from trustformer.tasks import translation_workload as wl
from trustformer.tasks.translation import with_trigger
from trustformer_lab.report.translations import decode, final_model, markdown_table, run_config


def translations(run: Path, count: int) -> list[tuple[str, str, str, str]]:
    """(source, reference, clean translation, triggered translation) of the first ``count`` test pairs."""
    cfg = run_config(run)
    trigger, _ = cfg.federation.backdoor() or (BACKDOOR_TRIGGER, BACKDOOR_TARGET)
    workload = wl.load_workload(cfg)
    pairs = workload.splits.test[:count]
    model = final_model(run)
    clean = decode(model, workload, cfg, [s for s, _ in pairs])
    triggered = decode(model, workload, cfg, [with_trigger(s, trigger) for s, _ in pairs])
    return [(s, r, c, t) for (s, r), c, t in zip(pairs, clean, triggered, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=4, help="test sentences (default 4)")
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    args = parser.parse_args(argv)
    for run in args.runs:
        rows = [list(row) for row in translations(run, args.count)]
        print(f"\n**{run.name}**\n\n" + markdown_table(["source", "reference", "clean", "with the trigger"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
