#!/usr/bin/env python
"""Centralized (or FedAvg) timing runs of the image tasks; see ``trustformer.tasks.bench``.

    python scripts/bench_image_tasks.py --task image --preset small --epochs 6 --threads 1
    python scripts/bench_image_tasks.py --task segmentation --preset small --epochs 30 --threads 1
"""

import sys
from pathlib import Path

try:
    from trustformer.tasks.bench import main
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from trustformer.tasks.bench import main

if __name__ == "__main__":
    sys.exit(main())
