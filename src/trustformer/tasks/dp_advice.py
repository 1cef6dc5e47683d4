"""What a data owner is told before a record-level DP translation run: where a DP federation was measured to pay.

The figures are the ε = 8 points of ``docs/bench/dp-pays.json`` ("curve": a public start, 3 owners, 10 rounds,
then each owner's free fine-tuning; a test checks they are the file's). No measured point reaches half of what
FedAvg gains over that fine-tuning, so there is no crossover to quote: a run whose owners hold no more records
than the largest measured point is told what was measured there and what pays instead.
"""

from __future__ import annotations

from ..config import RunConfig

# records per owner -> (the DP federation's gain, FedAvg's gain) in nats of test loss over the owners' free
# fine-tuning of the public model, at record-level ε = 8 (docs/bench/dp-pays.json, "dp ε=8 + fine-tuning")
MEASURED_AT_EPSILON_8 = {1000: (0.0087, -0.2610), 3000: (0.0179, 0.1792), 4584: (0.0162, 0.3973)}
BEST_SHARE_AT_EPSILON_8 = 0.14  # distributed noise banded over 8 rounds, 3,000 records per owner
SECTION = "docs/privacy.md, 'Where a DP federation pays'"


def dp_advice(cfg: RunConfig) -> str | None:
    """The advice for a record-level DP translation run whose owners hold at most the largest measured record count
    (``data.client_size``; 0, a whole shard, counts as within it), None otherwise."""
    if cfg.task != "translation" or cfg.privacy.unit != "record":
        return None
    largest = max(MEASURED_AT_EPSILON_8)
    records = cfg.data.client_size
    if records > largest:
        return None
    gains = [dp for dp, _ in MEASURED_AT_EPSILON_8.values()]
    held = f"{records:,} records per owner" if records else "whole shards per owner"
    return (
        f"record-level DP at privacy.epsilon = {cfg.privacy.epsilon:g} with {held}: measured from a public start "
        f"with 3 owners holding {min(MEASURED_AT_EPSILON_8):,} to {largest:,} records each, a DP federation at "
        f"epsilon = 8 gained {min(gains):.2f}-{max(gains):.2f} nats of test loss over each owner's free fine-tuning "
        f"of the public model, at most {BEST_SHARE_AT_EPSILON_8:g} of what FedAvg gains there, and nothing at "
        f"epsilon = 1 ({SECTION}). At this size, starting from a public model (train.init = 'public') and "
        "fine-tuning it on each owner's data (federation.finetune_epochs) gives most of what the federation would"
    )


__all__ = ["MEASURED_AT_EPSILON_8", "dp_advice"]
