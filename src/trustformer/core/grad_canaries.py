"""The one-run audit's gradient canaries inside DP-SGD (Nasr et al. 2023, "Tight auditing of differentially private
machine learning"): each canary is a record whose gradient is a large spike on one coordinate; an included one is
drawn with the records, clipped by Opacus' own per-record clipping and noised with them (``core/dpsgd.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from .dp_watch import StepChecks

CANARY_FLOATS = 1 << 24  # the per-record rows of canaries clipped at once hold at most this many floats (64 MB)


@dataclass(frozen=True)
class Canaries:
    """Gradient canaries: canary i is a record whose gradient is ``signs[i]`` × ``magnitude`` at flat coordinate
    ``coordinates[i]`` of parameter ``names[i]`` and 0 elsewhere (clipped to C by the records' clipping, so a
    magnitude above C leaves C); ``included[i]`` says whether it is in the data (the audit's coin flip)."""

    names: tuple[str, ...]
    coordinates: tuple[int, ...]
    included: tuple[bool, ...]
    groups: tuple[str, ...] = ()  # the parameter group of each canary (audited apart as well as together)
    signs: tuple[float, ...] = ()  # +1: the canary pushes its coordinate down (descent), -1 up; () = all +1
    kinds: tuple[str, ...] = ()  # the kind of each canary's tensor (layer type and parameter: LayerNorm.bias)
    magnitude: float = 1e3


def set_grad_sample(p: nn.Parameter, rows: torch.Tensor | None) -> None:
    """Set the per-record gradient rows Opacus reads (``p.grad_sample``, an attribute Opacus adds to parameters)."""
    setattr(p, "grad_sample", rows)  # noqa: B010 (an attribute Opacus adds: Parameter does not declare it)


def canary_rows(
    params: Sequence[nn.Parameter], where: dict[int, tuple[int, int]], canaries: Canaries, rows: Sequence[int]
) -> None:
    """Set ``p.grad_sample`` of every parameter the optimizer holds to the per-record gradients of the canaries
    ``rows`` (indices into ``canaries``), as Opacus' hooks set them for records: canary i's row is ``signs[i]`` ×
    ``magnitude`` at its coordinate of its tensor and 0 everywhere else (its norm is the magnitude, which the clipping
    cuts to C). ``where`` maps each canary to (its tensor's position in ``params``, its flat coordinate). A tensor that
    holds none of these canaries gets its rows of zeros as a broadcast view, which takes no memory."""
    hosts: dict[int, list[tuple[int, int, float]]] = {}
    for row, i in enumerate(rows):
        t, flat = where[i]
        hosts.setdefault(t, []).append((row, flat, (canaries.signs[i] if canaries.signs else 1.0) * canaries.magnitude))
    for t, p in enumerate(params):
        if t not in hosts:
            set_grad_sample(p, torch.zeros((), dtype=p.dtype, device=p.device).expand(len(rows), *p.shape))
            continue
        dense = torch.zeros((len(rows), p.numel()), dtype=p.dtype, device=p.device)
        for row, flat, value in hosts[t]:
            dense[row, flat] = value
        set_grad_sample(p, dense.view(len(rows), *p.shape))


def clip_canaries(
    dp_optimizer,
    where: dict[int, tuple[int, int]],
    canaries: Canaries,
    chosen: Sequence[int],
    piece: int,
    checks: StepChecks | None = None,
) -> None:
    """The sampled canaries clipped by Opacus' own per-record clipping (``clip_and_accumulate``) into
    ``p.summed_grad``, as records are. Opacus scales a row by C / max(‖row‖, C), its norm over every tensor, and every
    canary's row is one coordinate of ``magnitude``: so one drawn canary of each tensor (its **probe**) goes through
    ``clip_and_accumulate`` as a record's row (:func:`canary_rows`, in pieces of ``piece`` rows), and each other
    drawn canary of that tensor adds, at its own coordinate, what the probe added at the probe's (times the ratio
    of their signs). A clipping that treats tensors differently still shows, in each tensor's probe; the rows
    through Opacus are at most one per tensor, whatever the number of canaries (a dense row per canary costs
    canaries × the model's size). ``checks`` is told of the rows added without Opacus (its clipping check)."""
    params = list(dp_optimizer.params)
    by_tensor: dict[int, list[int]] = {}
    for i in sorted(chosen, key=lambda i: where[i]):
        by_tensor.setdefault(where[i][0], []).append(i)
    probes = [rows[0] for rows in by_tensor.values()]

    def value_at(i: int) -> float:
        t, flat = where[i]
        summed = getattr(params[t], "summed_grad", None)
        return 0.0 if summed is None else float(summed.reshape(-1)[flat])

    def sign(i: int) -> float:
        return canaries.signs[i] if canaries.signs else 1.0

    before = [value_at(i) for i in probes]
    for start in range(0, len(probes), piece):
        canary_rows(params, where, canaries, probes[start : start + piece])
        dp_optimizer.clip_and_accumulate()
    for probe, was in zip(probes, before, strict=True):
        t, _flat = where[probe]
        rest = by_tensor[t][1:]
        if not rest:
            continue
        clipped = (value_at(probe) - was) * sign(probe)  # what Opacus' clipping left of a canary row of this tensor
        summed = params[t].summed_grad.view(-1)
        flats = torch.tensor([where[i][1] for i in rest], dtype=torch.long, device=summed.device)
        values = torch.tensor([sign(i) * clipped for i in rest], dtype=summed.dtype, device=summed.device)
        summed.index_add_(0, flats, values)
        if checks is not None:
            checks.single_coordinate_rows(t, flats, values, canaries.magnitude)


def canary_plan(
    canaries: Canaries | None, dp_optimizer: Any, params: dict[str, nn.Parameter], physical_batch: int
) -> tuple[list[int], dict[int, tuple[int, int]], int]:
    """The included canaries, each one's tensor (its position among the optimizer's parameters) and coordinate, and
    how many canary rows Opacus' clipping takes at once (it reads every tensor's rows, dense: as many as
    :data:`CANARY_FLOATS` holds)."""
    if canaries is None:
        return [], {}, physical_batch
    planted = [c for c in range(len(canaries.included)) if canaries.included[c]]
    position = {id(p): t for t, p in enumerate(dp_optimizer.params)}
    where = {c: (position[id(params[canaries.names[c]])], canaries.coordinates[c]) for c in planted}
    rows = max(physical_batch, CANARY_FLOATS // max(1, sum(p.numel() for p in params.values())))
    return planted, where, rows


__all__ = ["CANARY_FLOATS", "Canaries", "canary_plan", "canary_rows", "clip_canaries", "set_grad_sample"]
