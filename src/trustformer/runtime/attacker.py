"""A malicious client's view of the round and the update it crafts from it (``federation.faults``; the tensor
maths are in ``core/attacks.py``, docs/robustness.md "Attacks that stay inside the defences").

What an attacker sees, and nothing else:

- its own honest update: what it trained on its shard this round (a backdoor client: on its clean pairs);
- honest updates on ``parts`` disjoint parts of its own (clean) data, each part repeated ``parts`` times so that
  it takes as many optimizer steps as a full update, from the same model and optimizer state (the ALIE and
  Min-Max papers estimate the benign statistics from the attackers' own benign updates);
- with ``collude=yes``, the honest updates its colluders published this round, through an out-of-band channel:
  the folder ``<out>/colluders/run-<run id>/round-<R>/`` that only the colluding clients write and read (one
  file per colluder). The server never reads it. In a deployment the colluders share such a folder themselves;
  on the in-process engine, clients train one after another, so a colluder sees those that trained before it.

It never sees another honest client's update or the server's state: its estimate of the norm the server's bound
accepts (a boosted backdoor's) is the median norm of these samples.
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..config.faults import Fault
from ..core import attacks
from ..core.shared import Tensors, derive_seed, trainable_tensors
from ..protocols.interface.base import ClientSession

log = logging.getLogger(__name__)


@dataclass
class AttackerView:
    """The model a poisoning client starts the round from, and the honest updates it trained on parts of its data."""

    start: Tensors
    samples: list[Tensors] = field(default_factory=list)


def data_parts(shard: Any, parts: int, seed: int) -> list[Any]:
    """``shard`` cut into ``parts`` disjoint parts (seeded), each repeated ``parts`` times: a list of examples
    (translation) or a data set with ``subset(indices)`` (image tasks)."""
    order = list(range(len(shard)))
    random.Random(seed).shuffle(order)
    chunks = [sorted(order[k::parts]) for k in range(parts)]
    if any(not chunk for chunk in chunks):
        raise ValueError(f"federation.faults: parts={parts} exceeds the client's {len(shard)} examples")
    if isinstance(shard, list):
        return [[shard[i] for i in chunk] * parts for chunk in chunks]
    return [shard.subset(chunk * parts) for chunk in chunks]


def honest_samples(env: Any, session: ClientSession, optimizer: torch.optim.Optimizer, fault: Fault) -> list[Tensors]:
    """The updates of honest training on each part of the client's clean data (``data_parts``), each from the
    round's starting model and a copy of the optimizer's state, with the protocol's own local step."""
    cfg: RunConfig = env.cfg
    clean = env.task.shard(env.client) if fault.kind == "backdoor" else env.shard
    start = trainable_tensors(session.model)
    training = env.protocol.training()
    samples = []
    seed = derive_seed(cfg.seed, "attack-parts", env.client, session.round)
    for k, part in enumerate(data_parts(clean, fault.parts, seed)):
        model = copy.deepcopy(session.model)
        part_optimizer = training.client_optimizer(model, env.client) or env.task.new_optimizer(model)
        part_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        env.task.train_local(
            model,
            part_optimizer,
            part,
            seed=derive_seed(cfg.seed, "attack-part", env.client, session.round, k),
            client=env.client,
            step=training.local_step(session),
            **training.train_options(session),
        )
        trained = trainable_tensors(model)
        samples.append({n: trained[n].detach().cpu() - start[n].detach().cpu() for n in start})
    return samples


def channel(cfg: RunConfig, run_id: int, rnd: int) -> Path:
    """The colluders' out-of-band folder of a round (never read by the server)."""
    return Path(cfg.out) / "colluders" / f"run-{run_id}" / f"round-{rnd}"


def share_with_colluders(cfg: RunConfig, run_id: int, rnd: int, client: int, samples: list[Tensors]) -> list[Tensors]:
    """Publish this colluder's honest updates of the round, and return those the other colluders published so
    far (their files, in client order)."""
    folder = channel(cfg, run_id, rnd)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".client-{client}.pt.tmp"
    torch.save([{n: t.detach().cpu() for n, t in s.items()} for s in samples], tmp)
    tmp.replace(folder / f"client-{client}.pt")
    seen: list[Tensors] = []
    for path in sorted(folder.glob("client-*.pt"), key=lambda p: int(p.stem.split("-")[1])):
        if path.stem != f"client-{client}":
            seen.extend(torch.load(path, weights_only=True))
    return seen


def attackers(cfg: RunConfig, kind: str) -> int:
    """f: the clients of the fault plan that carry ``kind`` (the attackers know how many they are)."""
    return len({f.client for f in cfg.federation.fault_plan() if f.poisons and f.kind == kind})


def crafted_update(
    cfg: RunConfig, fault: Fault, own: Tensors, benign: list[Tensors]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The update a crafting client sends (``core/attacks.py``), from its ``own`` update this round (honest for
    the stealthy kinds, trained on poisoned pairs for a boosted backdoor) and the ``benign`` updates it sees;
    also what the crafting found (logged)."""
    matrix = attacks.stack(benign)
    like = {n: t.to(torch.float64) for n, t in own.items()}
    if fault.kind == "alie":
        n = cfg.federation.clients_per_round or cfg.federation.clients
        z = fault.alie_z if fault.alie_z is not None else attacks.alie_z(n, attackers(cfg, "alie"))
        return attacks.unflatten(attacks.alie(matrix, z), like), {"z": z}
    if fault.kind in ("min_max", "min_sum"):
        crafted = (attacks.min_max if fault.kind == "min_max" else attacks.min_sum)(matrix, fault.perturb)
        info = {"gamma": crafted.gamma, "threshold": crafted.threshold, "reached": crafted.reached}
        return attacks.unflatten(crafted.update, like), info
    cap = attacks.median_norm(matrix)
    poisoned = attacks.flatten(own)
    update = attacks.norm_matched(poisoned, fault.factor, cap)
    info = {"norm_cap": cap, "poisoned_norm": float(poisoned.norm()), "gamma": float(update.norm() / poisoned.norm())}
    return attacks.unflatten(update, like), info


def benign_view(own: Tensors, fault: Fault, view: AttackerView) -> list[Tensors]:
    """The honest updates a crafting client knows of its own: its update this round (not for a backdoor, whose
    own update is poisoned) and those on parts of its data."""
    return ([] if fault.kind == "backdoor" else [own]) + view.samples


def poisoned_update(
    cfg: RunConfig, fault: Fault, client: int, rnd: int, run_id: int, own: Tensors, view: AttackerView
) -> Tensors:
    """The update a crafting client sends in round ``rnd`` (its colluders' honest updates added when it colludes)."""
    benign = benign_view(own, fault, view)
    if fault.collude:
        benign = benign + share_with_colluders(cfg, run_id, rnd, client, benign)
    update, info = crafted_update(cfg, fault, own, benign)
    log.info(
        "client %s · round %d · %s from %d honest updates: %s",
        client,
        rnd,
        fault.kind,
        len(benign),
        ", ".join(f"{k} {v:.4g}" for k, v in info.items()),
    )
    return update


__all__ = [
    "AttackerView",
    "attackers",
    "benign_view",
    "channel",
    "crafted_update",
    "data_parts",
    "honest_samples",
    "poisoned_update",
    "share_with_colluders",
]
