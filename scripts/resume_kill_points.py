"""Resume at a later kill point, before and after the store kept the snapshot a client that sat out a round needs:
tiny runs of 4 rounds killed at client 1's ``train.apply`` of round 3, resumed with ``runtime.resume``; prints the
largest difference in final test loss from the uninterrupted run, with the store as it was (only the previous
round's snapshots kept) and as it is. Usage: .venv/bin/python scripts/resume_kill_points.py"""

import logging
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
logging.disable(logging.WARNING)
warnings.simplefilter("ignore")

from compositions import BASE  # noqa: E402
from test_resume_matrix import KillPoint, killed_and_resumed  # noqa: E402

from trustformer.config import load_config  # noqa: E402
from trustformer.engine.inprocess import run_in_process  # noqa: E402
from trustformer.runtime import store  # noqa: E402

DP = {"privacy.unit": "record", "privacy.epsilon": 8.0, "privacy.delta": 1e-5, "privacy.batch_size": 16}
ROWS = {
    "FedAvg, 2 of 3 sampled": {},
    "FedAvg, 2 of 3, download_bits = 2": {"federation.download_bits": 2},
    "FedAvg payload_bits = 2, 2 of 3": {"federation.payload_bits": 2},
    "top-k, 2 of 3": {"federation.strategy": "fedavg-topk"},
    "record-level DP (seeded noise), 2 of 3": DP,
}
KILL = KillPoint(3, "train.apply", 1)
current = store._kept


def previous_round_only(points, saved):
    return [p for p in points if p <= saved and p[0] >= saved[0] - 1]


print(f"killed at {KILL} of 4; largest |resumed - uninterrupted| final test loss")
print(f"{'composition':42s} {'store as it was':>16s} {'store now':>10s}")
for label, extra in ROWS.items():
    overrides = {**BASE, "federation.rounds": 4, "federation.clients_per_round": 2, **extra}
    folder = Path(tempfile.mkdtemp())
    full = run_in_process(load_config("tiny", None, {**overrides, "out": str(folder / "full")}))
    gaps = []
    for kept, name in ((previous_round_only, "was"), (current, "now")):
        store._kept = kept
        resumed = killed_and_resumed(folder / name, overrides, KILL)
        gaps.append(max(abs(a - b) for a, b in zip(resumed["test_loss"], full["test_loss"])))
    store._kept = current
    print(f"{label:42s} {gaps[0]:16.4f} {gaps[1]:10.4f}")
