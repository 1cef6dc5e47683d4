"""The interface every federated protocol implements: :class:`FederatedProtocol`, its ten hooks with their defaults.

A protocol says what a client sends after local training (``client_payload``), how the server combines
what it received (``aggregate``) and how a client applies what comes back (``client_apply``); the layouts of
both (``expected_payload``, ``payload_spec``) have defaults. The server's round is the runtime's
(``runtime/server.py:run_round``: select, train, aggregate, apply, record, checkpoint, top to bottom); a protocol with a
round of its own (FedPC, Phong) overrides one method, ``run_round``, over :class:`RoundMessages` (the runtime's
validated, measured, secure send/receive helper, ``runtime/rounds.py``). Protocols import neither a task nor the
runtime: they move tensors.

What only some protocols need is an optional part (``parts.py``), each reached through one hook: local training
(``training()``: :class:`LocalTraining`), the server around each round (``server()``: :class:`ServerHooks`, client
selection, payload check, round reports), catching up (``catching_up()``: :class:`CatchUp`) and how payload coding
sees the payload (``coding()``: :class:`PayloadCoding`). A protocol subclasses the parts it needs and overrides
their methods; the hook then returns the protocol itself.

What a protocol holds on the server across rounds it declares in ``state_attrs`` (saved in every checkpoint,
restored on resume: ``state.server_state``), what it derives once before round 1 in ``start_attrs``, and what it
uses within a round in ``scratch_attrs`` (``state.py``; an undeclared attribute is refused when the class is
defined). What a protocol is (its name, its config section, what
it composes with) is its :class:`ProtocolSpec` (``spec.py``). Wrapping a protocol (``protocols/wrappers/``:
differential privacy, robust aggregation, payload coding, the attack harness's observer) subclasses
:class:`~trustformer.protocols.wrappers.base.ProtocolWrapper`, which forwards the core hooks to ``self.inner`` and
reaches the inner protocol's parts where the wrapper does not subclass a part itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from ...config import RunConfig
from ...core.shared import LocalStep, Tensors, assign_tensors, trainable_tensors
from ...wire import TensorSpec, spec_of
from .parts import CatchUp, LocalTraining, PayloadCoding, ServerHooks, misplaced_part_methods
from .session import Aggregated, ClientSession, Phases, Selection, ServerStart
from .spec import ProtocolSpec
from .state import check_client_half, check_declared

P = TypeVar("P")


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
    def behind(self, nodes: list[int], catch_up: Callable[[int], Tensors | None]) -> dict[int, Tensors]: ...
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
    """The core every protocol answers, and one hook per optional part (``parts.py``).

    Required: ``spec`` (its :class:`~trustformer.protocols.interface.spec.ProtocolSpec`), and for a protocol that
    exchanges, ``client_payload``, ``aggregate`` and ``client_apply``. Everything else has a default; ``cfg`` and
    ``name`` come with the object. Server-side attributes kept across rounds are declared in ``state_attrs``,
    those derived once before round 1 (``server_begin``) in ``start_attrs``, those used within a round in
    ``scratch_attrs``, an outside object handed in at construction in ``hook_attrs`` (``state.py``); that includes
    what the methods of a part the protocol subclasses set.
    """

    spec: ProtocolSpec  # the class declares it; a wrapper or an instance may refine it (DP: its baseline's)
    state_attrs: ClassVar[tuple[str, ...]] = ()  # kept across rounds: saved in every checkpoint
    start_attrs: ClassVar[tuple[str, ...]] = ()  # derived once in server_begin from the initial model, the population
    scratch_attrs: ClassVar[tuple[str, ...]] = ()  # set within a round, or built at its first use
    hook_attrs: ClassVar[tuple[str, ...]] = ()  # an observer or audit hook handed in at construction (__init__ only)

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    @property
    def name(self) -> str:
        return self.spec.name

    # ------------------------------------------------------------------ the exchange (required to exchange)
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """What a client sends after local training, and the seconds of each phase it ran."""
        raise NotImplementedError(f"{self.name} exchanges nothing")

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        """Combine the round's valid payloads: the aggregate, the seconds of each phase, and what the round records of
        it (:class:`~.session.Aggregated`)."""
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

    def run_round(self, io: RoundMessages) -> bool:
        """A round of the protocol's own, as messages over ``io`` (FedPC, Phong); returns whether it ran one. The
        default runs nothing and returns False: the runtime's standard round runs (``runtime/server.py:run_round``).
        The runtime calls it on the innermost protocol; wrappers act on such a round through ``io.aggregate``."""
        return False

    # ------------------------------------------------------------------ the optional parts (``parts.py``)
    def training(self) -> LocalTraining:
        """The client's local training (optimizer, step, options, what it keeps): the protocol itself where it
        subclasses :class:`LocalTraining`, else the task's own."""
        return self._part(LocalTraining, lambda _protocol: LocalTraining())

    def server(self) -> ServerHooks:
        """The server around each round (client selection, the protocol's payload check, the round's reports): the
        protocol itself where it subclasses :class:`ServerHooks`, else the defaults."""
        return self._part(ServerHooks, lambda protocol: ServerHooks(protocol.cfg))

    def catching_up(self) -> CatchUp:
        """What a client that missed exchanges receives and how it adopts a model sent with ``train``: the protocol
        itself where it subclasses :class:`CatchUp`, else nothing to catch up to (a model is applied as an
        aggregate)."""
        return self._part(CatchUp, AppliedAsAggregate)

    def coding(self) -> PayloadCoding:
        """How payload coding sees the payload: the protocol itself where it subclasses :class:`PayloadCoding`,
        else its float arrays as they are."""
        return self._part(PayloadCoding, lambda _protocol: PayloadCoding())

    def _part(self, kind: type[P], default: Callable[[FederatedProtocol], P]) -> P:
        """``self`` where its class subclasses the part ``kind``, else ``default(self)`` (a wrapper: its inner
        protocol's part, see ``ProtocolWrapper._part``)."""
        return self if isinstance(self, kind) else default(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a server attribute set outside ``__init__`` that the class does not declare (``state.py``), and a
        method of an optional part on a class that does not subclass that part (``parts.py``)."""
        super().__init_subclass__(**kwargs)
        check_declared(cls)
        check_client_half(cls)
        misplaced = misplaced_part_methods(cls)
        if misplaced:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(misplaced)} without subclassing that part, so it would never "
                "be called: add the part to the class's bases (protocols/interface/parts.py)"
            )


class AppliedAsAggregate(CatchUp):
    """The default catch-up of a protocol that does not subclass :class:`CatchUp`: nothing to catch up to, and a
    model sent with ``train`` is applied with the protocol's ``client_apply``."""

    def __init__(self, protocol: FederatedProtocol) -> None:
        self.protocol = protocol

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        return self.protocol.client_apply(session, model)


REQUIRED = ("spec", "client_payload", "aggregate", "client_apply")
"""What a protocol that exchanges must define; every other hook has its default above, every part its defaults."""


def hooks() -> tuple[str, ...]:
    """Every hook of :class:`FederatedProtocol` (its public methods), in definition order; the methods of the
    optional parts are their own (``parts.PARTS``)."""
    return tuple(n for n, v in vars(FederatedProtocol).items() if callable(v) and not n.startswith("_"))


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
    "Aggregated",
    "AppliedAsAggregate",
    "CatchUp",
    "ClientSession",
    "FederatedProtocol",
    "LocalStep",
    "LocalTraining",
    "PayloadCoding",
    "Phases",
    "ProtocolSpec",
    "RoundMessages",
    "Selection",
    "ServerHooks",
    "ServerStart",
    "Tensors",
    "assign_tensors",
    "hooks",
    "held_global",
    "trainable_tensors",
]
