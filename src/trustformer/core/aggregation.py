"""Server-side aggregation rules as pure functions on tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def weighted_mean(tensors: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """FedAvg (McMahan et al. 2017, Alg. 1): ``W = sum_k (n_k / n) W_k`` for every named tensor.

    The sum is taken in float64 and cast back, so the result does not depend on client order
    beyond float64 rounding. All inputs must have the same names and shapes.
    """
    if not tensors:
        raise ValueError("weighted_mean needs at least one input")
    if len(tensors) != len(weights):
        raise ValueError(f"{len(tensors)} inputs but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0 or any(w < 0 for w in weights):
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    names = list(tensors[0])
    for i, item in enumerate(tensors[1:], start=1):
        if list(item) != names:
            raise ValueError(f"input {i} has tensor names {sorted(item)} instead of {sorted(names)}")
    result: dict[str, torch.Tensor] = {}
    for name in names:
        ref = tensors[0][name]
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for item, w in zip(tensors, weights, strict=True):
            t = item[name]
            if t.shape != ref.shape:
                raise ValueError(f"tensor {name!r}: shape {tuple(t.shape)} != {tuple(ref.shape)}")
            acc += t.detach().to(torch.float64) * (w / total)
        result[name] = acc.to(ref.dtype)
    return result
