"""The interface every federated protocol implements: :class:`FederatedProtocol`, every hook with its default.

A protocol says what a client sends after local training (``client_payload``), how the server combines
what it received (``aggregate``) and how a client applies what comes back (``client_apply``); every other
hook has a default that does nothing special. What one round does on the server is the protocol's
``run_round`` over :class:`RoundMessages` (the runtime's validated, measured, secure send/receive helper,
``runtime/rounds.py``); the default is :func:`standard_round`. Protocols import neither a task nor the
runtime: they move tensors.

Wrapping a protocol (differential privacy, the attack harness's observer, payload coding) subclasses
:class:`ProtocolWrapper`, which delegates every hook to the wrapped protocol.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from ..config import RunConfig
from ..core.shared import LocalStep, Tensors, assign_tensors, derive_seed, trainable_tensors
from ..wire import TensorSpec, spec_of

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
    # train.payload (protocols that ask for payloads after training, e.g. FedPC): what the server asked for
    request: dict = field(default_factory=dict)

    @property
    def smoothing(self) -> float:
        return self.cfg.train.label_smoothing if self.label_smoothing is None else self.label_smoothing


class RoundMessages(Protocol):
    """What a protocol's round sees of the server (implemented by ``runtime.rounds.RoundIO``): messages to
    clients, validated replies, the round's lines (``rows``: node → metrics) and ``fields`` added to them."""

    rnd: int
    nodes: list[int]
    exchange: bool
    rows: dict[int, dict[str, Any]]
    fields: dict[str, Any]
    sampled: list[int] | None
    needed: int
    synced: dict[int, int]  # client -> the round of the last aggregate it applied (client sampling)

    def client(self, node: int) -> int: ...
    def initial(self) -> Tensors: ...
    def prepare(self, participants: list[int]) -> list[int]: ...
    def train(self, nodes: list[int], *, payload: bool, models: Mapping[int, Tensors] | None = None,
              config: Mapping[str, Any] | None = None) -> dict[int, Tensors]: ...
    def request(self, requests: Mapping[int, Mapping[str, Any]], specs: Mapping[int, TensorSpec]
                ) -> dict[int, Tensors]: ...
    def aggregate(self, payloads: dict[int, Tensors]) -> tuple[Tensors, Phases]: ...
    def apply(self, nodes: list[int], tensors: Mapping[str, torch.Tensor], phases: Mapping[str, float] | None = None
              ) -> None: ...
    def require(self, valid: int, step: str) -> None: ...
    def event(self, **fields: Any) -> None: ...
    def stop(self, reason: str) -> None: ...


class FederatedProtocol:
    """Base class of every protocol. Subclasses set ``name`` and override what they change.

    Class attributes:
      ``exchanges``: False for the protocols that never exchange anything (local, centralized);
      ``payload_on_request``: the ``train`` reply carries only a report; the server asks for payloads with
      ``train.payload`` (``session.request`` holds what it asked for; FedPC);
      ``evaluates_after_train``: the ``train`` reply of an exchange round carries a test evaluation (Phong);
      ``mean_weighting``: ``"examples"`` or ``"uniform"`` when the aggregate is that mean of the payloads, which
      secure aggregation can compute without seeing them; None otherwise;
      ``informs_left_out``: clients a round leaves out still receive its aggregate (the DP baselines' Poisson
      sampling); otherwise a client left out catches up when it is next drawn (:meth:`catch_up`);
      ``payload_is_update``: the payload's float values are an update, centered on 0 (top-k), not a model or
      centroids (the robust bound centers those on the round's median).
    """

    name: ClassVar[str] = ""
    exchanges: ClassVar[bool] = True
    payload_on_request: ClassVar[bool] = False
    evaluates_after_train: ClassVar[bool] = False
    mean_weighting: ClassVar[str | None] = None
    informs_left_out: ClassVar[bool] = False
    payload_is_update: ClassVar[bool] = False  # the payload is an update (a difference from the global model)

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    # ------------------------------------------------------------------ client
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

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """What a client sends after local training, and the seconds of each phase it ran."""
        raise NotImplementedError(f"{self.name} exchanges nothing")

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        """The names/shapes/dtypes a client expects back from the server (None: checked in ``client_apply``)."""
        return spec_of({n: p for n, p in session.model.named_parameters() if p.requires_grad})

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        """Update the client's model from the server's aggregate (or model); returns the seconds of each phase."""
        raise NotImplementedError(f"{self.name} applies nothing")

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        """Adopt the model a ``train`` message carries before training (a client catching up on the exchanges
        it missed, :meth:`catch_up`; Phong's model passed from worker to worker)."""
        return self.client_apply(session, model)

    # ------------------------------------------------------------------ server
    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """The names/shapes/dtypes every client's payload must have, from the configuration and the identical
        initial model (never from the clients)."""
        return spec_of(initial)

    def check_payload(self, payload: Tensors) -> None:
        """Raise ``wire.PayloadError`` to drop a payload the generic checks accept."""

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

    def catch_up(self) -> tuple[int, Tensors] | None:
        """The global model a client that missed exchanges (client sampling) receives with its next ``train``
        message, and the round it is from; None: a client left out continues from its own state."""
        return None

    def stop_reason(self) -> str:
        return "stopped by the protocol"

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, Phases]:
        """Combine the round's valid payloads; also returns the seconds of each phase."""
        raise NotImplementedError(f"{self.name} aggregates nothing")

    def aggregate_events(self) -> list[dict[str, Any]]:
        """What the last :meth:`aggregate` did to single payloads (robust aggregation: an update clipped or left
        out), as events: ``index`` (the payload's position), ``event`` and ``reason``; the round records them."""
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

    def server_state(self) -> dict[str, Any] | None:
        """The server-side state a resumed run needs (JSON values), saved in every round's checkpoint."""
        return None

    def load_server_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`server_state` on resume (after ``server_begin``)."""
        raise ValueError(f"{self.name} keeps no server state, but the checkpoint holds some")

    def run_round(self, io: RoundMessages) -> None:
        """The server side of one round, as messages (default: :func:`standard_round`)."""
        standard_round(self, io)

    # ------------------------------------------------------------------ payload coding (protocols/coding.py)
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


def standard_round(protocol: FederatedProtocol, io: RoundMessages) -> None:
    """The participants train (a client that missed exchanges first catches up) and, in exchange rounds, send
    their payloads; the server aggregates the valid ones; the clients apply the aggregate and evaluate
    (Algorithm 1 of the paper, server side)."""
    chosen = protocol.participants(io.rnd, [io.client(n) for n in io.nodes], io.exchange)  # by client id
    if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
        io.stop(protocol.stop_reason())
        return
    participants = [n for n in io.nodes if io.client(n) in set(chosen)]
    io.needed = min(io.needed, len(participants))
    participants = io.prepare(participants)
    if protocol.samples_clients():
        io.sampled = participants
    held = protocol.catch_up()
    behind = {n: held[1] for n in participants if io.synced.get(io.client(n), 0) < held[0]} if held else None
    payloads = io.train(participants, payload=io.exchange, models=behind)
    if not io.exchange:
        io.require(len(io.rows), "train")
        return
    for node in [n for n in io.rows if n not in payloads]:
        io.rows.pop(node)
    io.require(len(io.rows), "train")
    if not io.rows:
        io.event(event="no_participants", reason="no client was sampled for this round")
    else:
        aggregate, phases = io.aggregate(payloads)
        others = [n for n in io.nodes if n not in io.rows] if protocol.informs_left_out else []
        io.apply(list(io.rows) + others, aggregate, phases)
        io.require(len(io.rows), "apply")
        io.synced.update({io.client(n): io.rnd for n in io.rows})
    io.fields = protocol.exchange_done(io.rnd)


class ProtocolWrapper(FederatedProtocol):
    """A protocol that behaves as ``inner`` except where a subclass overrides a hook (differential privacy,
    payload coding, the attack harness's observer). Every hook is delegated explicitly."""

    def __init__(self, inner: FederatedProtocol) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.exchanges = inner.exchanges  # type: ignore[misc]
        self.payload_on_request = inner.payload_on_request  # type: ignore[misc]
        self.evaluates_after_train = inner.evaluates_after_train  # type: ignore[misc]
        self.mean_weighting = inner.mean_weighting  # type: ignore[misc]
        self.informs_left_out = inner.informs_left_out  # type: ignore[misc]
        self.payload_is_update = inner.payload_is_update  # type: ignore[misc]

    def client_optimizer(self, model, client):
        return self.inner.client_optimizer(model, client)

    def local_step(self, session):
        return self.inner.local_step(session)

    def train_options(self, session):
        return self.inner.train_options(session)

    def client_trained(self, session, metrics):
        self.inner.client_trained(session, metrics)

    def client_payload(self, session):
        return self.inner.client_payload(session)

    def payload_spec(self, session):
        return self.inner.payload_spec(session)

    def client_apply(self, session, aggregate):
        return self.inner.client_apply(session, aggregate)

    def client_start_from(self, session, model):
        return self.inner.client_start_from(session, model)

    def expected_payload(self, initial):
        return self.inner.expected_payload(initial)

    def check_payload(self, payload):
        self.inner.check_payload(payload)

    def server_begin(self, num_clients):
        self.inner.server_begin(num_clients)

    def participants(self, rnd, clients, exchange):
        return self.inner.participants(rnd, clients, exchange)

    def samples_clients(self):
        return self.inner.samples_clients()

    def catch_up(self):
        return self.inner.catch_up()

    def stop_reason(self):
        return self.inner.stop_reason()

    def aggregate(self, payloads, num_examples):
        return self.inner.aggregate(payloads, num_examples)

    def aggregate_events(self):
        return self.inner.aggregate_events()

    def exchange_done(self, rnd):
        return self.inner.exchange_done(rnd)

    def line_fields(self):
        return self.inner.line_fields()

    def server_summary(self):
        return self.inner.server_summary()

    def server_state(self):
        return self.inner.server_state()

    def load_server_state(self, state):
        self.inner.load_server_state(state)

    def coding_view(self, payload, initial):
        return self.inner.coding_view(payload, initial)

    def coded_names(self, payload):
        return self.inner.coded_names(payload)

    def coding_unview(self, view, rest, initial):
        return self.inner.coding_unview(view, rest, initial)

    def payload_reference(self, session):
        return self.inner.payload_reference(session)

    def server_payload_reference(self, rnd):
        return self.inner.server_payload_reference(rnd)

    def stable_payload_layout(self):
        return self.inner.stable_payload_layout()

    def run_round(self, io):
        # the standard round calls the outermost wrapper's hooks; a protocol-declared round calls io.aggregate,
        # which goes through the server's protocol object (the outermost wrapper) too
        inner = self.inner
        while isinstance(inner, ProtocolWrapper):
            inner = inner.inner
        if type(inner).run_round is FederatedProtocol.run_round:
            standard_round(self, io)
        else:
            inner.run_round(io)


def held_global(session: ClientSession, prefix: str = "global/") -> Tensors:
    """The last global model a client holds in its protocol state under ``prefix`` (before its first
    exchange: the identical initial model)."""
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    if all(prefix + n in session.protocol_state for n in names):
        return {n: session.protocol_state[prefix + n] for n in names}
    initial = session.initial_tensors()
    return {n: initial[n].detach().clone() for n in names}


__all__ = ["ClientSession", "FederatedProtocol", "LocalStep", "Phases", "ProtocolWrapper", "RoundMessages",
           "Tensors", "assign_tensors", "held_global", "standard_round", "trainable_tensors"]
