"""Optional capabilities of a protocol, beyond the core of :class:`~trustformer.protocols.base.FederatedProtocol`.

A protocol declares a capability by inheriting its class, and overrides the hooks it changes; the class gives the
defaults of the others. The runtime asks :func:`capability` for a capability's hooks: the protocol itself when it
declares it, else the defaults. A hook defined without its capability declared would never be called, so
``FederatedProtocol.__init_subclass__`` refuses it at import (and tests/test_architecture.py checks every
registered protocol).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..core.shared import LocalStep, Tensors, derive_seed

if TYPE_CHECKING:
    from ..config import RunConfig
    from .session import ClientSession, Phases


class Capability:
    """Base of every capability class (a marker: the members of its subclasses are hooks)."""

    cfg: RunConfig


class LocalTraining(Capability):
    """The protocol changes the client's local training."""

    def client_optimizer(self, model: torch.nn.Module, client: int) -> torch.optim.Optimizer | None:
        """The client's optimizer instead of the task's (None: the task's; FedPC: its private choice)."""
        return None

    def local_step(self, session: ClientSession) -> LocalStep | None:
        """The step of local training (None: the task's plain step), e.g. SAM or a regularised loss."""
        return None

    def train_options(self, session: ClientSession) -> dict[str, int]:
        """Keyword arguments of the task's ``train_local`` (``epochs``, ``batch_size``; image tasks)."""
        return {}

    def client_trained(self, session: ClientSession, metrics: dict[str, Any]) -> None:
        """After local training: keep what the protocol needs in ``session.protocol_state``; remove from
        ``metrics`` what must not leave the client."""


class ClientSelection(Capability):
    """The protocol chooses each round's participants, or may refuse to start or go on (a privacy budget)."""

    def server_begin(self, num_clients: int) -> None:
        """Once, before round 1; raising ValueError refuses to start (e.g. the privacy budget)."""

    def participants(self, rnd: int, clients: Sequence[int], exchange: bool) -> list[int] | None:
        """The clients that take part in round ``rnd`` (None: stop the run before it, ``stop_reason`` says
        why): every client, or ``federation.clients_per_round`` of them drawn from the run seed and the round."""
        k = self.cfg.federation.clients_per_round
        if not k or k >= len(clients):
            return list(clients)
        return sorted(random.Random(derive_seed(self.cfg.seed, "clients-per-round", rnd)).sample(sorted(clients), k))

    def samples_clients(self) -> bool:
        """Whether ``participants`` may leave clients out (their lines then say ``sampled``)."""
        return bool(self.cfg.federation.clients_per_round)

    def stop_reason(self) -> str:
        return "stopped by the protocol"


class CatchUp(Capability):
    """A client that missed exchanges (client sampling) receives a model with its next ``train`` message."""

    def catch_up(self) -> tuple[int, Tensors] | None:
        """The global model a client that missed exchanges receives with its next ``train`` message, and the
        round it is from; None: a client left out continues from its own state."""
        return None

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        """Adopt the model a ``train`` message carries before training (a client catching up; Phong's model
        passed from worker to worker). Default: apply it as an aggregate."""
        return self.client_apply(session, model)  # type: ignore[attr-defined]


class ServerState(Capability):
    """The server keeps state across rounds that a resumed run needs."""

    def server_state(self) -> dict[str, Any] | None:
        """The server-side state a resumed run needs (JSON values), saved in every round's checkpoint."""
        return None

    def load_server_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`server_state` on resume (after ``server_begin``)."""
        raise ValueError("the protocol keeps no server state, but the checkpoint holds some")


class RoundReport(Capability):
    """The protocol adds fields to the round's lines or to summary.json, or events about single payloads."""

    def aggregate_events(self) -> list[dict[str, Any]]:
        """What the last ``aggregate`` did to single payloads (robust aggregation: an update clipped or left out),
        as events: ``index`` (the payload's position), ``event`` and ``reason``; the round records them."""
        return []

    def exchange_done(self, rnd: int) -> dict[str, float | None]:
        """After every exchange round: fields added to every client's line of the round (e.g. ε spent)."""
        return {}

    def line_fields(self) -> dict[str, Any]:
        """Fields added to every line of every round (e.g. Trustformer's β)."""
        return {}

    def server_summary(self) -> dict[str, Any]:
        """Extra top-level fields of summary.json (e.g. ``privacy``)."""
        return {}


class PayloadCheck(Capability):
    """The server drops payloads that pass the generic checks but not the protocol's own."""

    def check_payload(self, payload: Tensors) -> None:
        """Raise ``wire.PayloadError`` to drop a payload the generic checks accept."""


class CodingView(Capability):
    """How payload coding (``protocols/coding.py``) sees the payload, when not as its float arrays."""

    def coding_view(self, payload: Tensors, initial: Tensors) -> Tensors:
        """The payload's values to code, as named float tensors (default: its float arrays as they are)."""
        return {n: t for n, t in payload.items() if t.is_floating_point()}

    def coded_names(self, payload: Tensors) -> set[str]:
        """The payload arrays :meth:`coding_view` covers (the others travel as they are)."""
        return {n for n, t in payload.items() if t.is_floating_point()}

    def coding_unview(self, view: Tensors, rest: Tensors, initial: Tensors) -> Tensors:
        """Inverse of :meth:`coding_view`: the payload from its decoded values and its uncoded arrays."""
        return {**rest, **view}

    def payload_reference(self, session: ClientSession) -> Tensors | None:
        """Client: what the coded payload is the difference from, in :meth:`coding_view`'s layout (None: the
        coding layer's default, the last aggregate when it has the payload's layout)."""
        return None

    def server_payload_reference(self, rnd: int) -> Tensors | None:
        """Server: the same tensors as :meth:`payload_reference`, for round ``rnd``."""
        return None

    def stable_payload_layout(self) -> bool:
        """Whether a payload coordinate means the same thing every round (then coding errors are fed back)."""
        return True


CAPABILITIES: tuple[type[Capability], ...] = (
    LocalTraining,
    ClientSelection,
    CatchUp,
    ServerState,
    RoundReport,
    PayloadCheck,
    CodingView,
)


def hooks_of(kind: type[Capability]) -> tuple[str, ...]:
    """The hooks a capability class declares."""
    return tuple(n for n, v in vars(kind).items() if callable(v) and not n.startswith("_"))


HOOK_CAPABILITY: dict[str, type[Capability]] = {hook: kind for kind in CAPABILITIES for hook in hooks_of(kind)}

C = TypeVar("C", bound=Capability)
_defaults: dict[type[Capability], type[Any]] = {}


def capability(protocol: Any, kind: type[C]) -> C:
    """``protocol``'s implementation of capability ``kind``: the protocol itself when it declares it, else the
    capability's defaults (any other attribute they use, e.g. ``cfg`` or ``client_apply``, is the protocol's)."""
    if isinstance(protocol, kind):
        return protocol
    if kind not in _defaults:
        _defaults[kind] = type(
            f"Default{kind.__name__}",
            (kind,),
            {
                "__init__": lambda self, target: object.__setattr__(self, "_target", target),
                "__getattr__": lambda self, name: getattr(object.__getattribute__(self, "_target"), name),
            },
        )
    return _defaults[kind](protocol)


__all__ = [
    "CAPABILITIES",
    "HOOK_CAPABILITY",
    "Capability",
    "CatchUp",
    "ClientSelection",
    "CodingView",
    "LocalTraining",
    "PayloadCheck",
    "RoundReport",
    "ServerState",
    "capability",
    "hooks_of",
]
