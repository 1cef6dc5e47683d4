"""FedPC (Tran et al.; seed paper 001, Section 3): a master holding the global model P^t, N workers with
private hyper-parameters, a goodness-chosen pilot and ternary vectors packed four per byte.

One epoch t (the round; Algorithm 1 on the master, Algorithm 2 on the workers), as messages of the
shared round helper (``runtime/rounds.py``):

1. ``train``: every worker trains from P^{t−1} (held since the last ``train.apply``; t = 1: the identical
   initial model P^0) with its private hyper-parameters and reports only its cost C_k^t (its mean training
   loss over the epoch) and its dataset size S_k.
2. The master scores goodness (Eq. 1): G_k = S_k / C_k^t at t = 1, S_k·(C_k^{t−1} − C_k^t) after, and
   picks the pilot k* = argmax G_k (a worker without a cost of the previous epoch ranks last).
3. ``train.payload``: the pilot sends its model Q_{k*}^t; every other worker its ternary vector T_k^t
   (Eq. 4 at t = 1: sign(Q − P^0) beyond α_k, the worker's current learning rate; Eq. 5 after: from the
   last two global models and β_k, which the master sends), packed 2 bits per value (``core/ternary.py``).
4. The master updates (Eq. 3, p_k = S_k / S over the workers that reported this epoch):
   t = 1: P^t = Q* − α_0 Σ_{k≠k*} p_k T_k;  t > 1: P^t = Q* − Σ_{k≠k*} p_k β_k T_k (P^{t−1} − P^{t−2}).
   ``fedpc.sign = "flipped"`` adds the sums instead (the paper's sign pushes a parameter that "keeps
   moving in the same direction", T = +1, back against its last change; both are measured, docs/protocols.md).
5. ``train.apply``: every worker of the epoch receives P^t (the download Eq. 8 counts) and evaluates.

Communication per epoch: V·N down (P^t to every worker), V up from the pilot, V/16 from each other worker
(float32 models), plus the small cost records and requests: Eq. 8, D = V(N+1) + V(N−1)/16.

Dropouts: a worker missing at step 1 takes no part in the epoch (it still receives P^t). A worker that
reported but does not answer step 3 is dropped from the epoch: a missing ternary vector counts as zeros
(its S_k stays in S); a missing pilot makes the master ask the next best worker that replied for its model
instead (its ternary vector is discarded; events ``pilot_replaced``); when no worker can send one, the
master keeps P^{t−1} (event ``no_pilot``).

Private hyper-parameters (``fedpc.*`` choices, drawn with the worker's own seed, never sent): learning
rate, batch size, local epochs and optimizer; the learning rate decays with the worker's training steps
(the task's ``lr_decay``). The worker's train reply drops ``lr``, ``steps``, ``examples`` and the rates that
reveal its batch size. Secure aggregation cannot carry FedPC (the pilot's model is not a sum);
``secure.mode = "tee"`` seals every message and runs Eq. 3 in the (emulated) enclave.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..config import ConfigError, RunConfig
from ..config.checks import check_at_least, check_choice, check_in_range
from ..core import ternary
from ..core.dp import flatten, unflatten
from ..core.shared import derive_seed
from ..wire import PayloadError, TensorSpec, spec_of
from .interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    RoundMessages,
    ServerStart,
    Tensors,
    assign_tensors,
    held_global,
    trainable_tensors,
)
from .interface.parts import LocalTraining, ServerHooks
from .interface.spec import ProtocolSpec

log = logging.getLogger(__name__)

GLOBAL, PREVIOUS = "global/", "previous/"  # worker state: P^{t-1} and P^{t-2}
LR = "fedpc/lr"  # worker state: its learning rate after its last training (α_k of Eq. 4)
TERNARY = "ternary"  # the payload name of a packed ternary vector
PAPER_BATCH_SIZES = {"image-classification": (128, 64, 32), "segmentation": (16, 8, 4)}  # Section 5.1
PRIVATE_METRICS = ("lr", "steps", "examples", "examples_per_s", "tokens_per_s")  # what would reveal them


@dataclass(frozen=True)
class FedPCConfig:
    """FedPC (protocols/fedpc.py): the master's settings, and the choices each worker draws its private
    hyper-parameters from (seeded per worker, never sent). An empty choice list means the paper's (batch
    sizes: 128/64/32 for image classification, 16/8/4 for segmentation) or the task's own (learning rate,
    optimizer: the task section's ``lr`` and ``optimizer``)."""

    sign: str = "paper"  # Eq. 3 as printed ("paper": Q* − Σ…) | "flipped" (Q* + Σ…)
    master_lr: float = 0.01  # α_0 of Eq. 3 at t = 1
    beta: float = 0.2  # β_k of Eq. 5 and 3, which the master sets (the same for every worker)
    batch_sizes: tuple[int, ...] = ()  # () = the paper's choices for the task
    lrs: tuple[float, ...] = ()  # () = the task's learning rate (the paper: 0.01 for all, decayed by steps)
    local_epochs: tuple[int, ...] = (1,)  # choices of a worker's local epochs per round
    optimizers: tuple[str, ...] = ()  # sgd (momentum) | adam; () = the task's optimizer

    def validate(self) -> None:
        check_choice("fedpc.sign", self.sign, ("paper", "flipped"))
        check_at_least("fedpc.master_lr", self.master_lr, 0.0)
        check_in_range("fedpc.beta", self.beta, 0.0, 1.0, lo_open=True, hi_open=True)
        for name, values, low in (
            ("fedpc.batch_sizes", self.batch_sizes, 1),
            ("fedpc.local_epochs", self.local_epochs, 1),
        ):
            if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
                raise ConfigError(f"{name} = {list(values)!r} must be integers >= {low}")
        if not self.local_epochs:
            raise ConfigError("fedpc.local_epochs must name at least one choice")
        if any(not v > 0 for v in self.lrs):
            raise ConfigError(f"fedpc.lrs = {list(self.lrs)!r} must be learning rates > 0")
        for value in self.optimizers:
            check_choice("fedpc.optimizers", value, ("sgd", "adam"))


def private_hyperparameters(cfg: RunConfig, client: int) -> dict[str, Any]:
    """Worker ``client``'s private choices, from the ``fedpc`` choice lists (empty: the paper's batch sizes,
    the task's learning rate and optimizer), drawn with the worker's own seed."""
    task = cfg.image if cfg.task == "image-classification" else cfg.segmentation
    p = cfg.section("fedpc")
    rng = random.Random(derive_seed(cfg.seed, "fedpc-private", client))
    return {
        "lr": rng.choice(p.lrs or (task.lr,)),
        "batch_size": rng.choice(p.batch_sizes or PAPER_BATCH_SIZES[cfg.task]),
        "local_epochs": rng.choice(p.local_epochs),
        "optimizer": rng.choice(p.optimizers or (task.optimizer,)),
    }


class FedPC(FederatedProtocol, LocalTraining, ServerHooks):
    # train reports the cost only; the payloads come with train.payload
    spec = ProtocolSpec(
        name="fedpc",
        factory=lambda cfg: FedPC(cfg),
        payload_message="train.payload",
        estimator=None,
        tasks=("image-classification", "segmentation"),
        section=FedPCConfig,
        summary="a pilot worker's model and the others' 2-bit ternary vectors (Eq. 3)",
        refuses={
            "coding": "its ternary vectors are 2 bits already and the pilot's model is the master's next model",
            "client_sampling": "the master's update (Eq. 3) weighs every worker's report of the epoch",
            "secure_aggregation": "secure aggregation reveals only the sum of the payloads, and FedPC's master "
            "needs the pilot worker's own model (Eq. 3), which is not a sum",
            "defences": "the master follows the pilot's model and takes ternary vectors, not a mean of updates",
            "model_poisoning": "its payloads are the pilot's model and ternary vectors, which the model-poisoning "
            "faults do not cover",
            "agg_every": "it exchanges every epoch",
            "other_tasks": "it needs an image task: its workers' private hyper-parameters are FedPC's "
            "image-model choices",
        },
    )

    # master: updates done, P^{t-1} and P^{t-2}, each worker's last cost, every epoch's pilot
    state_attrs = ("epoch", "last", "before", "costs", "pilots")
    start_attrs = ("dim", "model_spec")  # the initial model's layout and parameter count (server_begin)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.p = cfg.section("fedpc")
        self.sign = 1.0 if self.p.sign == "paper" else -1.0
        # master
        self.dim = 0  # M: the model's parameter count
        self.model_spec: TensorSpec = {}
        self.epoch = 0  # FedPC updates done (t − 1 during epoch t)
        self.last: Tensors | None = None  # P^{t-1}
        self.before: Tensors | None = None  # P^{t-2}
        self.costs: dict[int, float] = {}  # client -> C_k of its last reported epoch
        self.pilots: list[int | None] = []  # the pilot client of every epoch

    # ------------------------------------------------------------------------------ worker

    def client_optimizer(self, model: torch.nn.Module, client: int) -> torch.optim.Optimizer:
        """The worker's private optimizer: momentum SGD or Adam (the task section's momentum and weight decay)."""
        hp = private_hyperparameters(self.cfg, client)
        section = self.cfg.image if self.cfg.task == "image-classification" else self.cfg.segmentation
        params = [p for p in model.parameters() if p.requires_grad]
        if hp["optimizer"] == "sgd":
            return torch.optim.SGD(params, lr=hp["lr"], momentum=section.momentum, weight_decay=section.weight_decay)
        return torch.optim.Adam(params, lr=hp["lr"], weight_decay=section.weight_decay)

    def train_options(self, session: ClientSession) -> dict[str, int]:
        hp = private_hyperparameters(self.cfg, session.client)
        return {"epochs": hp["local_epochs"], "batch_size": hp["batch_size"]}

    def client_trained(self, session: ClientSession, metrics: dict[str, Any]) -> None:
        """Keep the learning rate (α_k of Eq. 4); the report carries the cost and size only."""
        session.protocol_state[LR] = torch.tensor([float(metrics.get("lr", 0.0))], dtype=torch.float64)
        for key in PRIVATE_METRICS:
            metrics.pop(key, None)

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        """What the master asked for: ``want = "model"`` (the pilot) or the packed ternary vector."""
        started = time.perf_counter()
        if session.request.get("want") == "model":
            return trainable_tensors(session.model), {}
        local = trainable_tensors(session.model)
        last = held_global(session, GLOBAL)
        if int(session.request.get("epoch", 1)) <= 1:  # Eq. 4: against P^0 with α_k = the worker's lr
            alpha = float(session.protocol_state[LR][0]) if LR in session.protocol_state else 0.0
            values = ternary.ternary_initial(flatten(local), flatten(last), alpha)
        else:  # Eq. 5: from P^{t-1} and P^{t-2}
            before = self._previous(session)
            values = ternary.ternary_evolution(
                flatten(local), flatten(last), flatten(before), float(session.request.get("beta", self.p.beta))
            )
        return {TERNARY: ternary.pack(values)}, {"ternary_s": time.perf_counter() - started}

    @staticmethod
    def _previous(session: ClientSession) -> Tensors:
        names = [n for n, p in session.model.named_parameters() if p.requires_grad]
        if all(PREVIOUS + n in session.protocol_state for n in names):
            return {n: session.protocol_state[PREVIOUS + n] for n in names}
        initial = session.initial_tensors()
        return {n: initial[n].detach().clone() for n in names}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        """Adopt P^t; keep P^{t-1} as the model before it (Eq. 5 needs both)."""
        started = time.perf_counter()
        last = held_global(session, GLOBAL)
        for n, t in last.items():
            session.protocol_state[PREVIOUS + n] = t
        assign_tensors(session.model, aggregate)
        for n, t in trainable_tensors(session.model).items():
            session.protocol_state[GLOBAL + n] = t
        return {"apply_s": time.perf_counter() - started}

    # ------------------------------------------------------------------------------ master

    def server_begin(self, start: ServerStart) -> None:
        self.model_spec = self.expected_payload(start.initial)
        self.dim = sum(t.numel() for t in start.initial.values())

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """The pilot's payload: the whole model (the ternary vectors' spec: :meth:`ternary_spec`)."""
        return spec_of(initial)

    def ternary_spec(self) -> TensorSpec:
        return {TERNARY: ((ternary.packed_length(self.dim),), "uint8")}

    def check_payload(self, rnd: int, payload: Tensors) -> None:
        """A ternary vector decodes strictly (no unused code, zero padding, exactly M values)."""
        if TERNARY in payload:
            if set(payload) != {TERNARY}:
                raise PayloadError(f"ternary payload: arrays {sorted(payload)}, expected [{TERNARY!r}]")
            ternary.unpack(payload[TERNARY], self.dim)

    def goodness(self, client: int, size: int, cost: float) -> float | None:
        """Eq. 1: S_k / C_k at the first epoch, S_k (C_k^{t-1} − C_k^t) after (None: no previous cost)."""
        if self.epoch == 0:
            return size / cost if cost > 0 else math.inf
        previous = self.costs.get(client)
        return None if previous is None else size * (previous - cost)

    def run_round(self, io: RoundMessages) -> bool:
        """Report → choose the pilot → request model and ternary vectors → Eq. 3 → every worker adopts P^t."""
        if self.last is None:
            self.last = {n: t.clone() for n, t in io.initial().items()}
        nodes = io.prepare(io.nodes)
        io.train(nodes, payload=False)
        io.require("train")
        reports = {n: (int(row["num_examples"]), float(row["train_loss"])) for n, row in io.replied().items()}
        scores = {n: self.goodness(io.client(n), size, cost) for n, (size, cost) in reports.items()}
        order = sorted(reports, key=lambda n: (scores[n] is None, -(scores[n] or 0.0), io.client(n)))
        for n, (_size, cost) in reports.items():
            self.costs[io.client(n)] = cost
            io.note(n, goodness=scores[n])
        pilot: int | None = order[0]
        want = {
            n: ({"want": "model"} if n == pilot else {"want": TERNARY, "epoch": self.epoch + 1, "beta": self.p.beta})
            for n in order
        }
        specs = {n: (self.model_spec if n == pilot else self.ternary_spec()) for n in order}
        payloads = io.request(want, specs)
        if pilot not in payloads:
            pilot = None
            for candidate in [n for n in order if n in payloads]:
                io.event(
                    event="pilot_replaced",
                    client=io.client(candidate),
                    reason=f"the pilot (client {io.client(order[0])}) sent no valid model: the next best "
                    f"worker, client {io.client(candidate)}, is asked for its model instead",
                )
                got = io.request({candidate: {"want": "model", "retry": True}}, {candidate: self.model_spec})
                payloads.pop(candidate)
                if candidate in got:
                    payloads[candidate] = got[candidate]
                    pilot = candidate
                    break
            if pilot is None:
                io.event(event="no_pilot", reason="no worker sent its model: the master keeps P^{t-1}")
        for n, payload in payloads.items():
            io.note(n, pilot=n == pilot)
            if TERNARY in payload:
                io.note(n, **ternary.shares(ternary.unpack(payload[TERNARY], self.dim)))
        # the ternary vectors of the pilot's rivals and the pilot's model (in client order: a fixed sum order)
        ordered = {n: payloads[n] for n in sorted(payloads, key=io.client)}
        if ordered:
            model, phases = io.aggregate(ordered)
        else:
            model, phases = dict(self.last), {}
        self.before, self.last = self.last, {n: t.clone() for n, t in model.items()}
        self.epoch += 1
        io.require("payload")
        self.pilots.append(io.client(pilot) if pilot is not None else None)
        io.add_fields({"pilot_client": self.pilots[-1] if pilot is not None else -1})
        io.apply(list(io.nodes), model, phases)
        log.info(
            "round %d: FedPC pilot client %s (goodness %s)",
            io.rnd,
            self.pilots[-1],
            {io.client(n): None if scores[n] is None else round(cast(float, scores[n]), 4) for n in order},
        )
        return True

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        """Eq. 3 from the pilot's model and the others' ternary vectors (p_k = S_k / S, S over the payloads
        aggregated, the pilot's included: a worker whose vector did not arrive leaves the others' weights whole);
        ``run_round`` keeps the result as the master's P^t."""
        started = time.perf_counter()
        assert self.last is not None and self.dim, "run_round sets the master's model first"
        pilot = [p for p in payloads if TERNARY not in p]
        if len(pilot) > 1:
            raise PayloadError("more than one full model in one FedPC update")
        base = flatten(pilot[0]).double() if pilot else flatten(self.last).double()
        total = float(sum(num_examples))
        vote = torch.zeros_like(base)
        for payload, size in zip(payloads, num_examples, strict=True):
            if TERNARY in payload:
                vote += (size / total) * ternary.unpack(payload[TERNARY], self.dim).double()
        if pilot:
            if self.epoch == 0:
                step = self.p.master_lr * vote
            else:
                step = self.p.beta * vote * (flatten(self.last).double() - flatten(cast(Tensors, self.before)).double())
            base = base - self.sign * step
        return Aggregated(unflatten(base.to(torch.float32), self.last), {"aggregate_s": time.perf_counter() - started})

    def server_summary(self) -> dict[str, Any]:
        return {
            "fedpc": {
                "pilots": self.pilots,
                "sign": self.p.sign,
                "master_lr": self.p.master_lr,
                "beta": self.p.beta,
                "private_hyperparameters": "drawn by each worker, never sent (fedpc.* choices)",
            }
        }


SPEC = FedPC.spec

__all__ = ["FedPC", "PAPER_BATCH_SIZES", "private_hyperparameters"]
