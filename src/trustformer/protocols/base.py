"""The interface every federated protocol implements: :class:`FederatedProtocol`, every hook with its default.

A protocol says what a client sends after local training (``client_payload``), how the server combines
what it received (``aggregate``) and how a client applies what comes back (``client_apply``); every other
hook has a default that does nothing special. What one round does on the server is the protocol's
``run_round`` over :class:`RoundMessages` (the runtime's validated, measured, secure send/receive helper,
``runtime/rounds.py``); the default is :func:`standard_round`. Protocols import neither a task nor the
runtime: they move tensors.

Every other hook is an optional capability (``capabilities.py``) a protocol declares by inheriting it; what a
protocol is (its name, its config section, what it composes with) is its :class:`ProtocolSpec` (``spec.py``).
Wrapping a protocol (differential privacy, robust aggregation, the attack harness's observer, payload coding)
subclasses :class:`ProtocolWrapper`, which delegates every hook it does not override, generically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import torch

from ..config import RunConfig
from ..core.shared import LocalStep, Tensors, assign_tensors, trainable_tensors
from ..wire import TensorSpec, spec_of
from .capabilities import (
    CAPABILITIES,
    HOOK_CAPABILITY,
    Capability,
    CatchUp,
    ClientSelection,
    RoundReport,
    capability,
    hooks_of,
)
from .session import ClientSession, Phases
from .spec import ProtocolSpec


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
    def behind(self, nodes: list[int], held: tuple[int, Tensors] | None) -> dict[int, Tensors] | None: ...
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
    """The core every protocol answers; everything else is a capability (``capabilities.py``) it declares.

    Required: ``spec`` (its :class:`~trustformer.protocols.spec.ProtocolSpec`), and for a protocol that exchanges,
    ``client_payload``, ``aggregate`` and ``client_apply``. With defaults: ``expected_payload``, ``payload_spec``,
    ``run_round``; ``cfg`` and ``name`` come with the object.
    """

    spec: ProtocolSpec  # the class declares it; a wrapper or an instance may refine it (DP: its baseline's)

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a capability hook defined without its capability declared: the runtime would never call it."""
        super().__init_subclass__(**kwargs)
        for hook, kind in HOOK_CAPABILITY.items():
            if hook in vars(cls) and not issubclass(cls, kind):
                raise TypeError(
                    f"{cls.__qualname__} defines {hook}() without declaring the capability "
                    f"{kind.__name__} (protocols/capabilities.py): inherit it, or the hook is never called"
                )

    @property
    def name(self) -> str:
        return self.spec.name

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


CORE = ("client_payload", "aggregate", "client_apply", "expected_payload", "payload_spec")
"""The core hooks a wrapper delegates when it does not override them (``run_round`` has its own rule)."""


def standard_round(protocol: FederatedProtocol, io: RoundMessages) -> None:
    """The participants train (a client that missed exchanges first catches up) and, in exchange rounds, send
    their payloads; the server aggregates the valid ones; the clients apply the aggregate and evaluate
    (Algorithm 1 of the paper, server side)."""
    selection = capability(protocol, ClientSelection)
    chosen = selection.participants(io.rnd, [io.client(n) for n in io.nodes], io.exchange)  # by client id
    if chosen is None:  # the protocol ends the run here (e.g. its privacy budget is spent)
        io.stop(selection.stop_reason())
        return
    participants = io.prepare([n for n in io.nodes if io.client(n) in set(chosen)], sampled=selection.samples_clients())
    held = capability(protocol, CatchUp).catch_up()
    payloads = io.train(participants, payload=io.exchange, models=io.behind(participants, held))
    io.require("train")
    if not io.exchange:
        return
    if not payloads:
        io.event(event="no_participants", reason="no client was sampled for this round")
    else:
        aggregate, phases = io.aggregate(payloads)
        io.apply(list(io.replied()) + (io.left_out() if protocol.spec.informs_left_out else []), aggregate, phases)
    io.add_fields(capability(protocol, RoundReport).exchange_done(io.rnd))


def _delegate_core(hook: str) -> Callable[..., Any]:
    def forward(self: ProtocolWrapper, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, hook)(*args, **kwargs)

    forward.__name__ = hook
    return forward


def _delegate_hook(kind: type[Capability], hook: str) -> Callable[..., Any]:
    def forward(self: ProtocolWrapper, *args: Any, **kwargs: Any) -> Any:
        return getattr(capability(self.inner, kind), hook)(*args, **kwargs)

    forward.__name__ = hook
    return forward


class ProtocolWrapper(FederatedProtocol):
    """A protocol that behaves as ``inner`` except where a subclass overrides a hook (differential privacy,
    payload coding, robust aggregation, the attack harness's observer).

    Delegation is generic: an instance's class is the wrapper's class extended with every capability the wrapped
    protocol declares, and every core or capability hook the wrapper's own classes do not define forwards to
    ``inner`` (or to the capability's defaults when ``inner`` does not declare it).
    """

    _extended: ClassVar[dict[tuple[type, frozenset[type]], type]] = {}

    def __new__(cls, inner: FederatedProtocol, *args: Any, **kwargs: Any) -> ProtocolWrapper:
        kinds = frozenset(k for k in CAPABILITIES if isinstance(inner, k) or issubclass(cls, k))
        key = (cls, kinds)
        if key not in ProtocolWrapper._extended:
            own = {
                n for c in cls.__mro__ if issubclass(c, ProtocolWrapper) and c is not ProtocolWrapper for n in vars(c)
            }
            members: dict[str, Any] = {h: _delegate_core(h) for h in CORE if h not in own}
            members.update({h: _delegate_hook(k, h) for k in kinds for h in hooks_of(k) if h not in own})
            bases = (cls, *[k for k in CAPABILITIES if k in kinds and not issubclass(cls, k)])
            ProtocolWrapper._extended[key] = type(
                cls.__name__, bases, {**members, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
            )
        return super().__new__(ProtocolWrapper._extended[key])

    def __init__(self, inner: FederatedProtocol) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        self.spec = inner.spec  # a wrapper may declare its own (DP: its baseline's)

    def run_round(self, io: RoundMessages) -> None:
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


__all__ = [
    "CORE",
    "ClientSession",
    "FederatedProtocol",
    "LocalStep",
    "Phases",
    "ProtocolSpec",
    "ProtocolWrapper",
    "RoundMessages",
    "Tensors",
    "assign_tensors",
    "capability",
    "held_global",
    "standard_round",
    "trainable_tensors",
]
