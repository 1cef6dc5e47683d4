"""The record-level audit's gradient canaries in a DP run (``privacy.audit_canaries``): where they sit, which
client and which step of banded noise may draw them, and where an audit run logs each DP-SGD step's release
(``core/release_log.py``), which ``attack/release_audit.py`` and ``attack/dp_audit.py`` read."""

from __future__ import annotations

import bisect
import itertools
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..core.grad_canaries import Canaries
from ..core.release_log import ReleaseLog
from ..core.shared import derive_seed
from ..data.batching import pad_sequences

AUDITED_CLIENT = 0  # privacy.audit_canaries: the client whose data holds the canaries


def parameter_group(name: str) -> str:
    """The audit's parameter group of a tensor: its name with layer indices starred, so that one group holds the
    same tensor of every layer (``decoder.layers.*.ffn.fc1.bias``)."""
    return re.sub(r"\.\d+\.", ".*.", name)


def _gradient_moments(
    model: torch.nn.Module, reference: list, batch: int = 4
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(mean, mean square) per coordinate of each trainable tensor's gradient over batches of ``reference`` pairs
    (public data, not any client's): which way real records push each coordinate, and how much they move it."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    squares = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    net: Any = model  # the translation model (config.pad_id, pair_losses)
    pad_id = net.config.pad_id
    was_training = model.training
    model.eval()
    batches = [reference[i : i + batch] for i in range(0, len(reference), batch)]
    for chunk in batches:
        src = pad_sequences([s for s, _ in chunk], pad_id)
        tgt = pad_sequences([g for _, g in chunk], pad_id)
        grads = torch.autograd.grad(net.pair_losses(src, tgt).mean(), list(params.values()), allow_unused=True)
        for (n, _p), g in zip(params.items(), grads, strict=True):
            if g is not None:
                sums[n] += g.double()
                squares[n] += g.double() ** 2
    model.train(was_training)
    count = max(len(batches), 1)
    return (
        {n: (v / count).flatten() for n, v in sums.items()},
        {n: (v / count).flatten() for n, v in squares.items()},
    )


def _allocate(total: int, capacity: dict[str, int]) -> dict[str, int]:
    """``total`` canaries spread evenly over the groups, none holding more than its coordinates."""
    counts = dict.fromkeys(capacity, 0)
    left = total
    while left > 0:
        open_groups = [g for g in capacity if counts[g] < capacity[g]]
        if not open_groups:
            break
        each = max(1, left // len(open_groups))
        for g in open_groups:
            take = min(each, capacity[g] - counts[g], left)
            counts[g] += take
            left -= take
            if not left:
                break
    return counts


def audit_canaries(cfg: RunConfig, model: torch.nn.Module, reference: list) -> Canaries | None:
    """The gradient canaries of an audit run (``privacy.audit_canaries`` = m), where real records do not hide them:
    spread evenly over every parameter group (:func:`parameter_group`), so noise missing from any one group shows,
    and within a group on the coordinates the ``reference`` pairs (public data) move least (Dirac canaries at
    low-variance coordinates, Nasr et al. 2023). Each canary pushes its coordinate **against** the way the
    reference pairs push it, so that what real records do to it (which an adaptive optimizer such as Adam turns into
    steps of the full learning rate) cannot pass for the canary. ``model`` is the run's initial model; the placement,
    directions and a fair coin per canary derive from it and the run seed, so the auditor recomputes them."""
    m = cfg.privacy.audit_canaries
    if not m:
        return None
    means, moments = _gradient_moments(model, reference)
    groups: dict[str, list[str]] = {}
    for name in moments:
        groups.setdefault(parameter_group(name), []).append(name)
    rng = random.Random(derive_seed(cfg.seed, "audit-canaries"))
    counts = _allocate(m, {g: sum(moments[n].numel() for n in names) for g, names in groups.items()})
    located: list[tuple[str, int, str]] = []
    for group, names in groups.items():
        values = torch.cat([moments[n] for n in names])
        starts = list(itertools.accumulate([0] + [moments[n].numel() for n in names]))
        order = torch.randperm(len(values), generator=torch.Generator().manual_seed(rng.randrange(2**62)))
        quiet = order[torch.sort(values[order], stable=True).indices[: counts[group]]]  # ties: seeded order
        for f in quiet.tolist():
            t = bisect.bisect_right(starts, f) - 1
            located.append((names[t], f - starts[t], group))
    included = tuple(rng.random() < 0.5 for _ in located)
    kinds = parameter_kinds(model)
    # the gradient's sign is the direction of descent's opposite: a canary whose gradient has the data's mean
    # gradient's opposite sign moves its coordinate against the data (a zero mean: pushed down)
    return Canaries(
        names=tuple(n for n, _, _ in located),
        coordinates=tuple(c for _, c, _ in located),
        included=included,
        groups=tuple(g for _, _, g in located),
        signs=tuple(-1.0 if float(means[n][c]) > 0 else 1.0 for n, c, _ in located),
        kinds=tuple(kinds[n] for n, _, _ in located),
    )


def parameter_kinds(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter's kind, its layer type and name (``LayerNorm.bias``): a second grouping for the audit, where
    a bug in one layer type's per-record gradients would show across every tensor of that kind."""
    return {
        f"{module_name}.{name}" if module_name else name: f"{type(module).__name__}.{name}"
        for module_name, module in model.named_modules()
        for name, _ in module.named_parameters(recurse=False)
    }


def canaries_of_client(cfg: RunConfig, canaries: Canaries | None, client: int | None) -> Canaries | None:
    """The audit's canaries as ``client`` trains with them: all of them in the audited client. Under distributed noise
    every other owner holds them too, every coin "out" (it draws and adds nothing, and steps as without them), so
    that its DP-SGD logs its share of the release at their coordinates: the release the audit reads is the secure
    sum of every owner's share (``attack/release_audit.py``)."""
    if canaries is None or client == AUDITED_CLIENT:
        return canaries
    if cfg.privacy.noise == "distributed":
        return replace(canaries, included=(False,) * len(canaries.included))
    return None


def canaries_of_group(canaries: Canaries | None, group: int, bands: int) -> Canaries | None:
    """The audit's canaries take every step a record takes: under b-min-sep sampling canary c belongs to group
    c mod b, and a round of another group cannot draw it."""
    if canaries is None:
        return None
    included = tuple(inc and c % bands == group for c, inc in enumerate(canaries.included))
    return replace(canaries, included=included)


RELEASE_FOLDER = "audit-release"  # an audit run's release log (core/release_log.py), in the run's folder


def release_folder(cfg: RunConfig, client: int | None = None) -> Path:
    """Where a client's DP-SGD calls log their releases (``attack/release_audit.py`` reads them); without
    ``client``, the folder of every client's."""
    root = Path(cfg.out) / RELEASE_FOLDER
    return root if client is None else root / f"client-{client}"


def save_release(cfg: RunConfig, log: ReleaseLog | None, client: int | None) -> None:
    """Write one DP-SGD call's release log, named by its first step (a resumed round rewrites its own file)."""
    if log is not None:
        log.save(release_folder(cfg, AUDITED_CLIENT if client is None else client) / f"steps-{log.first_step:06d}.npz")


__all__ = [
    "AUDITED_CLIENT",
    "audit_canaries",
    "canaries_of_client",
    "canaries_of_group",
    "parameter_group",
    "parameter_kinds",
    "release_folder",
    "save_release",
]
