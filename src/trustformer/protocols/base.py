"""The interface every federated protocol implements, and what a protocol's client hooks see.

A protocol is three functions (no inheritance needed): what a client sends after local training,
how the server combines what it received, and how a client applies what comes back. The round
loop, the wire format, validation, measurements and state persistence are shared (``trustformer.app``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..config import RunConfig
from ..wire import TensorSpec

Tensors = dict[str, torch.Tensor]


@dataclass
class ClientSession:
    """A client's view during one message: its config, identity, model and persistent protocol state."""

    cfg: RunConfig
    client: int
    round: int
    model: torch.nn.Module
    num_examples: int
    initial_tensors: Callable[[], "Tensors"]  # the identical initial model's trainable tensors
    protocol_state: Tensors = field(default_factory=dict)
    diagnostics: bool = False  # simulation only: a protocol may report extra (non-private) measurements
    # the label smoothing of the task's loss, for a protocol's own local step (None: train.label_smoothing)
    label_smoothing: float | None = None
    # train.payload (protocols that ask for payloads after training, e.g. FedPC): what the server asked for
    request: dict = field(default_factory=dict)

    @property
    def smoothing(self) -> float:
        return self.cfg.train.label_smoothing if self.label_smoothing is None else self.label_smoothing


class FederatedProtocol(Protocol):
    name: str
    exchanges: bool  # False: clients never exchange anything (local, centralized)

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        """What a client sends after local training, and the seconds of each phase it ran."""
        ...

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        """The names/shapes/dtypes a client expects back from the server."""
        ...

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """Server: the names/shapes/dtypes of the payload every client must send, from the run's
        configuration and the identical initial model's trainable tensors (never from the clients)."""
        ...

    def aggregate(
        self, payloads: Sequence[Tensors], num_examples: Sequence[int]
    ) -> tuple[Tensors, dict[str, float]]:
        """Server: combine the round's valid payloads; also returns the seconds of each phase."""
        ...

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        """Client: update the model from the server's aggregate; returns the seconds of each phase."""
        ...


# Optional hooks, looked up with getattr by the round loop (``trustformer.app``); a protocol
# without them behaves as above. Client side:
#
#   local_step(session) -> LocalStep | None
#       the step of local training (default: Adam on the batch loss), e.g. SAM or a regularised loss.
#   client_optimizer(task, model, client) -> torch.optim.Optimizer
#       the client's optimizer instead of the task's (e.g. FedPC's private hyper-parameters).
#   train_options(session) -> dict
#       keyword arguments of the task's ``train_local`` (``epochs``, ``batch_size``; image tasks).
#   client_trained(session, metrics) -> None
#       after local training: keep what the protocol needs in ``session.protocol_state`` and remove from
#       ``metrics`` what must not leave the client (e.g. FedPC's learning rate and step counts).
#   payload_on_request: bool (attribute)
#       the ``train`` reply carries no payload, only the report (``train_loss``, ``num_examples``); the
#       server then asks for payloads with ``train.payload`` (``session.request`` holds what it asked for).
#   evaluates_after_train: bool (attribute)
#       the ``train`` reply of an exchange round carries a test evaluation (e.g. Phong's sequential round).
#   A ``train`` message may carry a model (Phong): the client adopts it with ``client_apply`` first.
#
# Server side (the protocol object lives for the whole run):
#
#   server_begin(num_clients) -> None
#       once, before round 1; raising ValueError refuses to start (e.g. the privacy budget).
#   server_round(round, nodes) -> list[int] | None
#       at the start of every exchange round: the nodes that take part (client sampling), or None
#       to stop the run before this round (e.g. the privacy budget is spent; ``stop_reason()`` -> str
#       says why). With this hook, the nodes that do not take part still receive the aggregate.
#   check_payload(payload) -> None
#       raise wire.PayloadError to drop a client's payload the generic checks accept.
#   server_round_done(round) -> dict[str, float | None]
#       after every exchange round: fields added to every client's line of that round.
#   server_summary() -> dict
#       extra top-level fields of summary.json (e.g. ``privacy``).
#   run_round(io: runtime.rounds.RoundIO) -> None
#       the whole server side of one round, as messages over the shared helper (FedPC's report → choose
#       → request round, Phong's sequential round); without it the standard round runs (train, aggregate,
#       apply). The helper applies the secure exchange, validation, measurements and drops.
#   server_state() -> dict  /  load_server_state(dict) -> None
#       the server-side state a resumed run needs (JSON values; e.g. the privacy accountant), saved
#       in the round checkpoint after every round and loaded, after server_begin, on resume.

LocalStep = Callable[[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]
"""One local training step on a batch ``(model, optimizer, src, tgt)``: updates the model and returns
the batch loss summed over tokens (detached) and the token count, like ``model.loss``."""


def trainable_tensors(model: torch.nn.Module) -> Tensors:
    """Detached copies of a model's trainable tensors by name (shared tensors once)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def assign_tensors(model: torch.nn.Module, tensors: Tensors) -> None:
    """Overwrite a model's trainable tensors in place (names and shapes must match)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].dtype))


def held_global(session: ClientSession, prefix: str = "global/") -> Tensors:
    """The last global model a client holds in its protocol state under ``prefix`` (before its first
    exchange: the identical initial model)."""
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    if all(prefix + n in session.protocol_state for n in names):
        return {n: session.protocol_state[prefix + n] for n in names}
    initial = session.initial_tensors()
    return {n: initial[n].detach().clone() for n in names}
