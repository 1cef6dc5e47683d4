"""Phong & Phuong (2019), "Privacy-preserving deep learning via weight transmission", master–worker
topology: the FedPC paper's sequential baseline.

Each epoch (round) the model visits the workers one after another: the master sends the current model
to a worker in its ``train`` message, the worker trains on its own data from those weights and sends
its model back, which goes on to the next worker. ``phong.order``: ``fixed`` (client order) or
``shuffled`` (a permutation per epoch, from the run seed and the round). Bytes per epoch: V down and V
up per worker, 2VN, as FedAvg. A worker that drops out is skipped: the model it would have trained goes
on to the next worker unchanged. Every worker reports the test loss of the model it produced; after the
last epoch the master sends the final model to every worker (``train.apply``), so that the final
evaluation of every client is that of the one model (these bytes come once, on top of the last epoch's).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import RunConfig
from ..config.checks import check_choice
from ..core.shared import derive_seed
from .interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    Phases,
    RoundMessages,
    Tensors,
    assign_tensors,
    trainable_tensors,
)
from .interface.parts import ServerHooks
from .interface.spec import ProtocolSpec


@dataclass(frozen=True)
class PhongConfig:
    """Phong & Phuong (2019) sequential weight transmission (protocols/phong.py)."""

    order: str = "fixed"  # the order the model visits the workers each epoch: fixed (client order) | shuffled

    def validate(self) -> None:
        check_choice("phong.order", self.order, ("fixed", "shuffled"))


class Phong(FederatedProtocol, ServerHooks):
    # each worker's reply carries the test loss of the model it produced
    spec = ProtocolSpec(
        name="phong",
        factory=lambda cfg: Phong(cfg),
        evaluates_after_train=True,
        estimator=None,
        summary="the model visits the workers one after another (Phong & Phuong 2019)",
        section=PhongConfig,
        refuses={
            "coding": "the model it passes on is the next worker's starting point, not a difference both ends hold",
            "client_sampling": "the model visits every worker in turn; a worker left out would be skipped, not sampled",
            "secure_aggregation": "the model visits one worker at a time; there is no sum of payloads to aggregate",
            "defences": "the model passes from worker to worker; there is no aggregate to bound",
            "agg_every": "it exchanges every epoch",
        },
    )

    state_attrs = ("model", "orders")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.model: Tensors | None = None  # master: the model after the last worker of the last epoch
        self.orders: list[list[int]] = []  # master: the visiting order of every epoch (client ids)

    # ------------------------------------------------------------------------------ worker

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        return trainable_tensors(session.model), {}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        started = time.perf_counter()
        assign_tensors(session.model, aggregate)
        return {"apply_s": time.perf_counter() - started}

    # ------------------------------------------------------------------------------ master

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        """The model after the last worker of the sequence (there is nothing to average)."""
        return Aggregated(dict(payloads[-1]))

    def order(self, rnd: int, clients: list[int]) -> list[int]:
        """The visiting order of epoch ``rnd``: client order, or a seeded permutation per epoch."""
        clients = sorted(clients)
        if self.cfg.section("phong").order == "shuffled":
            random.Random(derive_seed(self.cfg.seed, "phong-order", rnd)).shuffle(clients)
        return clients

    def run_round(self, io: RoundMessages) -> bool:
        """The model visits the workers one after another; the last epoch ends with the final model sent to all."""
        model = self.model if self.model is not None else dict(io.initial())
        nodes = io.prepare(io.nodes)
        by_client = {io.client(n): n for n in nodes}
        order = [by_client[c] for c in self.order(io.rnd, list(by_client))]
        self.orders.append([io.client(n) for n in order])
        for position, node in enumerate(order):
            got = io.train([node], payload=True, models={node: model})
            if node in got:
                model = got[node]
                io.note(node, position=position)
        io.require("train")
        self.model = {n: t.clone() for n, t in model.items()}
        if io.rnd == self.cfg.federation.rounds:  # every client ends with the final model
            io.apply(order, self.model)
        return True

    def server_summary(self) -> dict[str, Any]:
        return {"phong": {"order": self.cfg.section("phong").order, "orders": self.orders}}


SPEC = Phong.spec

__all__ = ["Phong"]
