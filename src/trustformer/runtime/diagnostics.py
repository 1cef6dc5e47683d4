"""Simulation-only diagnostics that need every client's weights at once (never used for training).

``fedavg_distance`` (SPEC §2): right after an exchange, how far is each client's model from the
true FedAvg of the same round's local models, ‖W_i − W_FedAvg‖ / ‖W_FedAvg‖, where W_FedAvg is the
data-size-weighted mean of the local models before the exchange. Only the in-process runtime turns
this on (node_config ``diagnostics = true``): in a deployment no party holds every model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..core.aggregation import weighted_mean

_local_models: dict[tuple[int, int], dict[int, tuple[dict[str, torch.Tensor], int]]] = {}


def record_local_model(
    run_id: int, round_: int, client: int, tensors: Mapping[str, torch.Tensor], num_examples: int
) -> None:
    """Keep a client's pre-exchange model of this round (drops older rounds of the run)."""
    for key in [k for k in _local_models if k[0] == run_id and k[1] < round_]:
        del _local_models[key]
    _local_models.setdefault((run_id, round_), {})[client] = (dict(tensors), num_examples)


def fedavg_distance(run_id: int, round_: int, tensors: Mapping[str, torch.Tensor]) -> float:
    """‖W − W_FedAvg‖ / ‖W_FedAvg‖ over all trainable tensors, W_FedAvg from this round's local models."""
    entries = list(_local_models.get((run_id, round_), {}).values())
    if not entries:
        raise KeyError(f"no local models recorded for run {run_id} round {round_}")
    mean = weighted_mean([t for t, _ in entries], [float(n) for _, n in entries])
    diff_sq = sum(float((tensors[n].double() - m.double()).pow(2).sum()) for n, m in mean.items())
    norm_sq = sum(float(m.double().pow(2).sum()) for m in mean.values())
    return math.sqrt(diff_sq) / math.sqrt(norm_sq)


def clear(run_id: int) -> None:
    for key in [k for k in _local_models if k[0] == run_id]:
        del _local_models[key]
