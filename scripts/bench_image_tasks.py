#!/usr/bin/env python
"""Centralized (or FedAvg) timing runs of the image tasks; see ``trustformer_lab.bench.image_tasks_bench``.

    python scripts/bench_image_tasks.py --task image --preset small --epochs 6 --threads 1
    python scripts/bench_image_tasks.py --task segmentation --preset small --epochs 30 --threads 1

Runs the code of the checkout this script belongs to (its ``src`` first on the path).
"""

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
if (SRC / "trustformer" / "tasks").is_dir():
    sys.path.insert(0, str(SRC))

from trustformer_lab.bench.image_tasks_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
