"""The first ``--count`` sources of the shared test set as each finished run's final model translates them, beside
the reference, (``--public``) the public model the first run started from and (``--control K``) that model after
owner K's free fine-tuning (the control of ``scripts/dp_pays.py``: 1 epoch at 0.1x the rate): one Markdown table, a
column per run (greedy decoding). The runs must share their test set (the same data settings and seed).

Usage: .venv/bin/python scripts/translations.py [--count 5] [--public] [--control K] [--name RUN=LABEL ...]
       RUN_FOLDER [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trustformer.tasks import translation_workload as wl
from trustformer_lab.report.translations import (
    decode,
    final_model,
    markdown_table,
    owner_fine_tuned,
    public_start,
    run_config,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5, help="test sentences (default 5)")
    parser.add_argument("--public", action="store_true", help="add the public model the first run started from")
    parser.add_argument("--control", type=int, default=None, help="add the public model after owner K's fine-tuning")
    parser.add_argument("--name", action="append", default=[], help="RUN_FOLDER_NAME=column label")
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    args = parser.parse_args(argv)
    labels = dict(n.split("=", 1) for n in args.name)
    cfg = run_config(args.runs[0])
    workload = wl.load_workload(cfg)
    pairs = workload.splits.test[: args.count]
    sources = [s for s, _ in pairs]
    columns = [("reference", [r for _, r in pairs])]
    if args.public or args.control is not None:
        start = public_start(args.runs[0], workload)
        if args.public:
            columns.append(("public model", decode(start, workload, cfg, sources)))
        if args.control is not None:
            tuned = owner_fine_tuned(start, args.runs[0], args.control)
            columns.append((f"control (owner {args.control})", decode(tuned, workload, cfg, sources)))
    for run in args.runs:
        if run_config(run).data != cfg.data:
            parser.error(f"{run}: its data settings differ from {args.runs[0]}'s, so its test set may too")
        columns.append((labels.get(run.name, run.name), decode(final_model(run), workload, cfg, sources)))
    header = ["source"] + [name for name, _ in columns]
    rows = [[source] + [texts[i] for _, texts in columns] for i, source in enumerate(sources)]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
