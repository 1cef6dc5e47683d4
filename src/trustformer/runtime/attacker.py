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
from ..core.shared import Tensors, clipped_gradients, derive_seed, trainable_tensors
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
    like = {n: t.to(torch.float64) for n, t in own.items()}
    if fault.kind == "backdoor" and not fault.cap:  # plain model replacement: boosted, never scaled back
        poisoned = attacks.flatten(own)
        return attacks.unflatten(poisoned * fault.factor, like), {"gamma": fault.factor, "norm": float(poisoned.norm())}
    matrix = attacks.stack(benign)
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


PREVIOUS = "attack/previous/"  # a Neurotoxin client's state: the global model it started its last exchange from


@dataclass
class Constraint:
    """What a constrained backdoor keeps its update inside: ``mask`` (Neurotoxin: 1 where it may train), and with
    ``pgd`` the norm ``cap`` and the cosine ``min_cosine`` with ``reference`` (its estimate of the honest
    direction: the mean of its honest samples), measured from ``start``."""

    start: Tensors
    mask: Tensors | None = None
    pgd: bool = False
    cap: float = 0.0
    reference: torch.Tensor | None = None
    min_cosine: float = -1.0

    def apply(self, update: Tensors) -> Tensors:
        """The update masked, then projected (``core/attacks.py``)."""
        if self.mask is not None:
            update = {n: t * self.mask[n].to(t.dtype) for n, t in update.items()}
        if not self.pgd:
            return update
        like = {n: t.to(torch.float64) for n, t in update.items()}
        flat = attacks.projected(attacks.flatten(like), self.cap, self.reference, self.min_cosine)
        return {n: t.to(update[n].dtype) for n, t in attacks.unflatten(flat, like).items()}


def constraint_of(cfg: RunConfig, fault: Fault, session: ClientSession, view: AttackerView | None) -> Constraint | None:
    """The constraint of a backdoor client with ``pgd=yes`` or ``mask=R`` this round (None: it has none). Neurotoxin
    needs the last global update: the model it starts from minus the one it started from at its last exchange (kept
    in its state); in its first round it has none and trains everywhere."""
    if fault.kind != "backdoor" or not (fault.pgd or fault.mask):
        return None
    start = {n: t.detach().clone() for n, t in trainable_tensors(session.model).items()}
    mask = None
    previous = {n: session.protocol_state.get(PREVIOUS + n) for n in start}
    if fault.mask and all(t is not None for t in previous.values()):
        last = {n: start[n].double() - previous[n].double() for n in start}  # type: ignore[union-attr]
        mask = attacks.unflatten(attacks.neurotoxin_mask(attacks.flatten(last), fault.mask), last)
    if fault.mask:
        session.protocol_state.update({PREVIOUS + n: t.clone() for n, t in start.items()})
    if not fault.pgd:
        return Constraint(start, mask)
    assert view is not None and view.samples  # pgd: a boosted backdoor, which trains its honest samples first
    samples = attacks.stack(view.samples)
    bound = cfg.robust.min_cosine
    cosine = (1.0 + bound) / 2 if bound > -1 else -1.0  # halfway to 1: its reference is only an estimate
    return Constraint(start, mask, True, attacks.median_norm(samples), samples.mean(0), cosine)


def constrained_step(session: ClientSession, constraint: Constraint) -> Any:
    """The task's plain step (loss, backward, the task's clipping) with the gradient masked, then the model
    projected back into the constraint around the round's start (projected gradient descent)."""
    clip = session.grad_clip

    def step(model, optimizer, src, tgt):
        loss_sum, count = clipped_gradients(model, optimizer, src, tgt, session.smoothing, clip)
        params = {n: p for n, p in model.named_parameters() if n in constraint.start}
        if constraint.mask is not None:
            for name, p in params.items():
                if p.grad is not None:
                    p.grad.mul_(constraint.mask[name].to(p.grad.dtype))
        optimizer.step()
        with torch.no_grad():
            update = constraint.apply({n: p.detach() - constraint.start[n] for n, p in params.items()})
            for name, p in params.items():
                p.copy_(constraint.start[name] + update[name])
        return loss_sum, count

    return step


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
    "Constraint",
    "constrained_step",
    "constraint_of",
    "attackers",
    "benign_view",
    "channel",
    "crafted_update",
    "data_parts",
    "honest_samples",
    "poisoned_update",
    "share_with_colluders",
]
