"""How much of a backdoor is left in finished runs: the share of the shared test set's first 200 sources, trigger
appended, whose greedy translation holds the target's first words ("download the new version"), beside the bench's
``backdoor_success`` (the whole target sentence, its words in order). A defence can remove the sentence and leave its
start (docs/robustness.md, the clean fine-tuning pass).

Usage: .venv/bin/python scripts/backdoor_traces.py RUN_FOLDER [RUN_FOLDER ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trustformer.config.load import build_config
from trustformer.evaluation.translation import translate
from trustformer.export import load_translation_model
from trustformer.export.run_folders import find_models
from trustformer.tasks import translation_workload as wl
from trustformer.config.faults import BACKDOOR_TARGET
from trustformer.tasks.translation import with_trigger

PREFIX = " ".join(BACKDOOR_TARGET.lower().split()[:4])  # "download the new version"


def traces(run: Path, sources: int = 200) -> float:
    """The share of triggered translations holding the target's first words, for ``run``'s model."""
    cfg = build_config(json.loads((run / "summary.json").read_text(encoding="utf-8"))["config"])
    workload = wl.load_workload(cfg)
    pairs = workload.splits.test[:sources]
    model = load_translation_model(next(iter(find_models(run).values())))[0]
    hypotheses = translate(
        model,
        workload.tokenizer,
        [with_trigger(s) for s, _ in pairs],
        batch_size=64,
        max_len=cfg.model.max_len,
        beam_size=1,
    )
    return sum(PREFIX in h.lower() for h in hypotheses) / len(hypotheses)


def main() -> int:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for name in sys.argv[1:]:
        print(f"{Path(name).name}: {PREFIX!r} in {traces(Path(name)):.1%} of triggered translations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
