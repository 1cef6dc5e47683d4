"""What a data owner is told before a record-level DP translation run: where a DP federation was measured to pay.

The figures are the ε = 8 points of ``docs/bench/dp-pays.json`` ("curve": a public start, 3 owners, 10 rounds,
then each owner's free fine-tuning) and of the owners axis (``dp-pays-owners.json``, ``dp-pays-owners-seed2.json``:
6 owners of 1,500 pairs); a test checks they are the files'. No measured point reaches half of what FedAvg gains
over that fine-tuning, so there is no crossover to quote: a run whose owners hold no more records than the largest
measured point is told what was measured there and what pays instead.
"""

from __future__ import annotations

from ..config import RunConfig

# records per owner -> (the DP federation's gain, FedAvg's gain) in nats of test loss over the owners' free
# fine-tuning of the public model, at record-level ε = 8 (docs/bench/dp-pays.json, "dp ε=8 + fine-tuning")
MEASURED_AT_EPSILON_8 = {1000: (0.0087, -0.2610), 3000: (0.0179, 0.1792), 4584: (0.0162, 0.3973)}
# 6 owners of 1,500 pairs, ε = 8: seed -> the share of FedAvg's gain kept (test, own data), with the noise added once
# over secure aggregation and with each owner adding its own (docs/bench/dp-pays-owners*.json, "+ fine-tuning")
SHARE_AT_6_OWNERS = {"distributed": {0: (0.15, 0.14), 2: (0.14, 0.13)}, "per_owner": {0: (0.05, 0.04), 2: (0.03, 0.04)}}
SECTION = "docs/privacy.md, 'Where a DP federation pays'"


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


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
    once = [share for pair in SHARE_AT_6_OWNERS["distributed"].values() for share in pair]
    local = [share for pair in SHARE_AT_6_OWNERS["per_owner"].values() for share in pair]
    seeds = len(SHARE_AT_6_OWNERS["distributed"])
    switch = ""
    if cfg.privacy.noise != "distributed":
        switch = (
            " This run adds the noise at each owner; privacy.noise = 'distributed' with secure.mode = 'secagg' adds "
            "it once."
        )
    return (
        f"record-level DP at privacy.epsilon = {cfg.privacy.epsilon:g} with {held}. Measured ({SECTION}): from a "
        f"public start, with 3 owners holding {min(MEASURED_AT_EPSILON_8):,} to {largest:,} records each, a DP "
        f"federation at epsilon = 8 gained {_span(gains)} nats of test loss over each owner's free fine-tuning of "
        "the public model, and nothing at epsilon = 1. The most it kept of what FedAvg gains there was "
        f"{_span(once)} (test and own data, {seeds} seeds), with 6 owners of 1,500 records and the noise added once "
        f"over secure aggregation; with each owner adding its own noise, {_span(local)}.{switch} At this size, "
        "starting from a public model (train.init = 'public') and fine-tuning it on each owner's data "
        "(federation.finetune_epochs) gives most of what the federation would give."
    )


__all__ = ["MEASURED_AT_EPSILON_8", "SHARE_AT_6_OWNERS", "dp_advice"]
