"""Several ``trustformer bench robustness --json`` files of one setting as one (``robustness_bench.merged``), with
the table printed and, with ``--figure``, each backdoor row's success round by round.

Usage: .venv/bin/python scripts/merge_robustness.py OUT.json PART.json [PART.json ...] [--figure FILE.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trustformer_lab.bench.robustness_bench import format_table, merged
from trustformer_lab.bench.robustness_figure import backdoor_figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("parts", nargs="+", type=Path)
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args(argv)
    result = merged([json.loads(p.read_text(encoding="utf-8")) for p in args.parts])
    args.out.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    print(format_table(result["rows"]))
    if args.figure:
        print(f"figure: {backdoor_figure(result['rows'], args.figure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
