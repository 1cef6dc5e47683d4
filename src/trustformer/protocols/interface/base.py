"""The interface every federated protocol implements: :class:`FederatedProtocol`, every hook with its default.

A protocol says what a client sends after local training (``client_payload``), how the server combines
what it received (``aggregate``) and how a client applies what comes back (``client_apply``); every other
hook is an ordinary method of :class:`FederatedProtocol` with a default that does nothing special, grouped below
by what it is for (local training, client selection, catching up, round reports, payload checks, coding). What
one round does on the server is the protocol's ``run_round`` over :class:`RoundMessages` (the runtime's validated,
measured, secure send/receive helper, ``runtime/rounds.py``); the default is :func:`standard_round`. Protocols
import neither a task nor the runtime: they move tensors.

What a protocol holds on the server across rounds it declares in ``state_attrs`` (saved in every checkpoint,
restored on resume) and what it recomputes in ``scratch_attrs`` (``state.py``; an undeclared attribute is refused
when the class is defined). What a protocol is (its name, its config section, what it composes with) is its
:class:`ProtocolSpec` (``spec.py``). Wrapping a protocol (``protocols/wrappers/``: differential privacy, robust
aggregation, payload coding, the attack harness's observer) subclasses
:class:`~trustformer.protocols.wrappers.base.ProtocolWrapper`, which forwards every hook to ``self.inner``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import torch

from ...config import RunConfig
from ...core.shared import LocalStep, Tensors, assign_tensors, derive_seed, trainable_tensors
from ...wire import TensorSpec, spec_of
from .session import ClientSession, Phases
from .spec import ProtocolSpec
from .state import check_declared, load_own_state, own_state


class RoundMessages(Protocol):
    """What a protocol's round sees of the server (implemented by ``runtime.rounds.RoundIO``): the round's facts
    (``rnd``, the connected ``nodes``, ``exchange``: whether it exchanges) and methods that send validated, measured
    messages and keep each client's line of the round."""

    rnd: int
    nodes: list[int]
    exchange: bool

    def client(self, node: int) -> int: ...
    def initial(self) -> Tensors: ...
    def prepare(self, participants: list[int], *, sampled: bool = False) -> list[int]: ...
    def behind(
        self,
        nodes: list[int],
        held: tuple[int, Tensors] | None,
        cheaper: Callable[[int], Tensors | None] | None = None,
    ) -> dict[int, Tensors] | None: ...
    def train(
        self,
        nodes: list[int],
        *,
        payload: bool,
        models: Mapping[int, Tensors] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> dict[int, Tensors]: ...
    def request(
        self, requests: Mapping[int, Mapping[str, Any]], specs: Mapping[int, TensorSpec]
    ) -> dict[int, Tensors]: ...
    def aggregate(self, payloads: dict[int, Tensors]) -> tuple[Tensors, Phases]: ...
    def apply(
        self, nodes: list[int], tensors: Mapping[str, torch.Tensor], phases: Mapping[str, float] | None = None
    ) -> None: ...
    def replied(self) -> dict[int, Mapping[str, Any]]: ...
    def left_out(self) -> list[int]: ...
    def note(self, node: int, **fields: Any) -> None: ...
    def add_fields(self, fields: Mapping[str, Any]) -> None: ...
    def require(self, step: str) -> None: ...
    def event(self, **fields: Any) -> None: ...
    def stop(self, reason: str) -> None: ...


class FederatedProtocol:
    """The core every protocol answers, and every optional hook with its default.

    Required: ``spec`` (its :class:`~trustformer.protocols.interface.spec.ProtocolSpec`), and for a protocol that
    exchanges, ``client_payload``, ``aggregate`` and ``client_apply``. Everything else has a default; ``cfg`` and
    ``name`` come with the object. Server-side attributes kept across rounds are declared in ``state_attrs``,
    those recomputed every round or at start in ``scratch_attrs`` (``state.py``).
    """

    spec: ProtocolSpec  # the class declares it; a wrapper or an instance may refine it (DP: its baseline's)
    state_attrs: ClassVar[tuple[str, ...]] = ()  # kept across rounds: saved in every checkpoint
    scratch_attrs: ClassVar[tuple[str, ...]] = ()  # set within a round, or derived again at every start

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a server attribute set outside ``__init__`` that the class does not declare (``state.py``)."""
        super().__init_subclass__(**kwargs)
        check_declared(cls)

    @property
    def name(self) -> str:
        return self.spec.name

    # ------------------------------------------------------------------ the exchange (required to exchange)
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """What a client sends after local training, and the seconds of each phase it ran."""
        raise NotImplementedError(f"{self.name} exchanges nothing")

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, Phases]:
        """Combine the round's valid payloads; also returns the seconds of each phase."""
        raise NotImplementedError(f"{self.name} aggregates nothing")

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        """Update the client's model from the server's aggregate (or model); returns the seconds of each phase."""
        raise NotImplementedError(f"{self.name} applies nothing")

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """The names/shapes/dtypes every client's payload must have, from the configuration and the identical
        initial model (never from the clients)."""
        return spec_of(initial)

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        """The names/shapes/dtypes a client expects back from the server (None: checked in ``client_apply``)."""
        return spec_of({n: p for n, p in session.model.named_parameters() if p.requires_grad})

    def run_round(self, io: RoundMessages) -> None:
        """The server side of one round, as messages (default: :func:`standard_round`)."""
        standard_round(self, io)

    # ------------------------------------------------------------------ local training (client)
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

    # ------------------------------------------------------------------ client selection (server)
    def server_begin(self, num_clients: int) -> None:
        """Once, before round 1 (and before a resumed run's state is loaded); raising ValueError refuses to
        start (e.g. the privacy budget)."""

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

    # ------------------------------------------------------------------ catching up (a client that missed rounds)
    def catch_up(self) -> tuple[int, Tensors] | None:
        """The global model a client that missed exchanges receives with its next ``train`` message, and the
        round it is from; None: a client left out continues from its own state."""
        return None

    def catch_up_from(self, version: int) -> Tensors | None:
        """A cheaper catch-up for a client whose state is from round ``version`` (the download coding's missed coded
        messages); None: it gets :meth:`catch_up`'s model."""
        return None

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        """Adopt the model a ``train`` message carries before training (a client catching up; Phong's model
        passed from worker to worker). Default: apply it as an aggregate."""
        return self.client_apply(session, model)

    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        """The layouts a catch-up model may have (checked before ``client_start_from``): the trainable tensors."""
        return [spec_of({n: p for n, p in session.model.named_parameters() if p.requires_grad})]

    # ------------------------------------------------------------------ server state (checkpoints)
    def server_state(self) -> dict[str, Any]:
        """What a resumed server needs: the declared ``state_attrs``, under this class's name (a wrapper adds its
        inner protocol's under ``inner``)."""
        return {"class": type(self).__name__, "state": own_state(self)}

    def load_server_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`server_state` on resume (after ``server_begin``)."""
        if state.get("class") != type(self).__name__:
            raise ValueError(f"the checkpoint holds the state of {state.get('class')}, not of {type(self).__name__}")
        load_own_state(self, state["state"])

    def aggregate_delivered(self, delivered: Tensors) -> None:
        """What the clients received instead of what ``aggregate`` returned, when a layer around the protocol
        changed it (download coding sends a coded approximation): keep this, not the exact aggregate, where the
        protocol keeps the aggregate for later rounds."""

    # ------------------------------------------------------------------ round reports (server)
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

    # ------------------------------------------------------------------ payload checks (server)
    def check_payload(self, payload: Tensors) -> None:
        """Raise ``wire.PayloadError`` to drop a payload the generic checks accept."""

    # ------------------------------------------------------------------ how payload coding sees the payload
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


REQUIRED = ("spec", "client_payload", "aggregate", "client_apply")
"""What a protocol that exchanges must define; every other hook has its default above."""


def hooks() -> tuple[str, ...]:
    """Every hook of :class:`FederatedProtocol` (its public methods), in definition order."""
    return tuple(n for n, v in vars(FederatedProtocol).items() if callable(v) and not n.startswith("_"))


def standard_round(protocol: FederatedProtocol, io: RoundMessages) -> None:
    """The participants train (a client that missed exchanges first catches up) and, in exchange rounds, send
    their payloads; the server aggregates the valid ones; the clients apply the aggregate and evaluate
    (Algorithm 1 of the paper, server side)."""
    chosen = protocol.participants(io.rnd, [io.client(n) for n in io.nodes], io.exchange)  # by client id
    if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
        io.stop(protocol.stop_reason())
        return
    participants = io.prepare([n for n in io.nodes if io.client(n) in set(chosen)], sampled=protocol.samples_clients())
    held = protocol.catch_up()
    payloads = io.train(participants, payload=io.exchange, models=io.behind(participants, held, protocol.catch_up_from))
    io.require("train")
    if not io.exchange:
        return
    if not payloads:
        io.event(event="no_participants", reason="no client was sampled for this round")
    else:
        aggregate, phases = io.aggregate(payloads)
        io.apply(list(io.replied()) + (io.left_out() if protocol.spec.informs_left_out else []), aggregate, phases)
    io.add_fields(protocol.exchange_done(io.rnd))


def held_global(session: ClientSession, prefix: str = "global/") -> Tensors:
    """The last global model a client holds in its protocol state under ``prefix`` (before its first
    exchange: the identical initial model)."""
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    if all(prefix + n in session.protocol_state for n in names):
        return {n: session.protocol_state[prefix + n] for n in names}
    initial = session.initial_tensors()
    return {n: initial[n].detach().clone() for n in names}


__all__ = [
    "REQUIRED",
    "ClientSession",
    "FederatedProtocol",
    "LocalStep",
    "Phases",
    "ProtocolSpec",
    "RoundMessages",
    "Tensors",
    "assign_tensors",
    "hooks",
    "held_global",
    "standard_round",
    "trainable_tensors",
]
