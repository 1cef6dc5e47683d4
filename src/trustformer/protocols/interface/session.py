"""A client's view during one message (:class:`ClientSession`), and the phase times a hook reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import RunConfig
from ...core.shared import Tensors

Phases = dict[str, float]
"""Seconds of each phase a hook ran (``*_s``), and other numbers it reports on the client's line."""


@dataclass
class ClientSession:
    """A client's view during one message: its config, identity, model and persistent protocol state."""

    cfg: RunConfig
    client: int
    round: int
    model: torch.nn.Module
    num_examples: int
    initial_tensors: Callable[[], Tensors]  # the identical initial model's trainable tensors
    protocol_state: Tensors = field(default_factory=dict)
    diagnostics: bool = False  # simulation only: a protocol may report extra (non-private) measurements
    # the label smoothing of the task's loss, for a protocol's own local step (None: train.label_smoothing)
    label_smoothing: float | None = None
    grad_clip: float = 0.0  # the L2 bound the task's own step clips gradients to (0: none), for a protocol's step
    # train.payload (protocols that ask for payloads after training, e.g. FedPC): what the server asked for
    request: dict = field(default_factory=dict)

    @property
    def smoothing(self) -> float:
        return self.cfg.train.label_smoothing if self.label_smoothing is None else self.label_smoothing


@dataclass
class Aggregated:
    """What a protocol's ``aggregate`` returns for the round to go on with: the aggregate (``tensors``), the seconds
    of each phase, what it did to single payloads (``events``: ``index``, the payload's position, ``event`` and
    ``reason``; an event without ``index`` is about the aggregate itself and names no client), and ``fields`` added
    to every client's line of the round (e.g. adaptive clipping's bound). A wrapper passes its inner protocol's on
    with ``dataclasses.replace``, adding its own."""

    tensors: Tensors
    phases: Phases = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerStart:
    """What the server half knows before round 1, before any client speaks (``ServerHooks.server_begin``): the
    identical initial model's trainable tensors and the population, the number of clients the run expects."""

    initial: Tensors
    clients: int


@dataclass(frozen=True)
class Selection:
    """Who takes part in a round (``ServerHooks.participants``): the client ids, whether the selection may leave
    clients out (their lines then say ``sampled``), and ``stop``: why the run ends before this round (no clients),
    e.g. a privacy budget spent."""

    clients: list[int]
    sampled: bool = False
    stop: str | None = None


__all__ = ["Aggregated", "ClientSession", "Phases", "Selection", "ServerStart"]
