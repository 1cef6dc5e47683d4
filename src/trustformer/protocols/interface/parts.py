"""The optional parts of a protocol: what only some protocols need, each a small class with defaults, reached
through one hook of :class:`~trustformer.protocols.interface.base.FederatedProtocol`.

=====================  ==================  ==============================================================
part                   hook                what it is for
=====================  ==================  ==============================================================
:class:`LocalTraining`  ``training()``      the client's local training: its optimizer, step, options
:class:`ServerHooks`    ``server()``        the server around each round: who takes part, which payloads
                                           it accepts, what it reports
:class:`CatchUp`        ``catching_up()``   what a client that missed exchanges receives, and how it
                                           adopts it
:class:`PayloadCoding`  ``coding()``        how payload coding (``wrappers/coding.py``, ``download.py``)
                                           sees the payload
=====================  ==================  ==============================================================

A protocol that needs a part subclasses it beside ``FederatedProtocol`` and overrides the methods that change
(``class FedAvg(FederatedProtocol, ServerHooks, CatchUp)``); the hook then returns the protocol itself, so what a
part's methods keep on the server is the protocol's own attributes, declared in its ``state_attrs`` or
``scratch_attrs`` and checked when the class is defined (``state.py``). A protocol that does not subclass a part
gets its defaults (stateless). A method named like a part's on a class that does not subclass that part is refused
when the class is defined: it would never be called.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ...config import RunConfig
from ...core.shared import LocalStep, Tensors, derive_seed
from ...wire import TensorSpec, spec_of
from .session import ClientSession, Phases, Selection, ServerStart


class LocalTraining:
    """The client's local training (``runtime/client.py``); the defaults are the task's own."""

    def client_optimizer(self, model: torch.nn.Module, client: int) -> torch.optim.Optimizer | None:
        """The client's optimizer instead of the task's (None: the task's; FedPC: its private choice)."""
        return None

    def local_step(self, session: ClientSession) -> LocalStep | None:
        """The step of local training (None: the task's plain step), e.g. SAM or FedProx's regularised loss."""
        return None

    def train_options(self, session: ClientSession) -> dict[str, int]:
        """Keyword arguments of the task's ``train_local`` (``epochs``, ``batch_size``; image tasks)."""
        return {}

    def client_trained(self, session: ClientSession, metrics: dict[str, Any]) -> None:
        """After local training: keep what the protocol needs in ``session.protocol_state``; remove from
        ``metrics`` what must not leave the client."""


class ServerHooks:
    """The server around each round (``runtime/server.py:run_round``, ``runtime/rounds.py``): client
    selection, the protocol's own payload check, and the round's reports. The defaults: every client (or
    ``federation.clients_per_round`` of them, drawn from the run seed), every valid payload, nothing reported."""

    cfg: RunConfig

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    # -- client selection
    def server_begin(self, start: ServerStart) -> None:
        """Once, before round 1 (and before a resumed run's state is loaded): what the server half derives from the
        initial model and the population (:class:`~.session.ServerStart`) it sets here, in attributes declared in
        ``start_attrs`` (``state.py``); raising ValueError refuses to start (e.g. the privacy budget). The runtime
        calls it on every layer, innermost first (``wrappers/base.py: start_server``): a wrapper never forwards it."""

    def participants(self, rnd: int, clients: Sequence[int], exchange: bool) -> Selection:
        """Who takes part in round ``rnd`` (:class:`~.session.Selection`; its ``stop`` ends the run before it):
        every client, or ``federation.clients_per_round`` of them drawn from the run seed and the round."""
        k = self.cfg.federation.clients_per_round
        if not k or k >= len(clients):
            return Selection(list(clients), sampled=bool(k))
        drawn = random.Random(derive_seed(self.cfg.seed, "clients-per-round", rnd)).sample(sorted(clients), k)
        return Selection(sorted(drawn), sampled=True)

    # -- payloads
    def check_payload(self, rnd: int, payload: Tensors) -> None:
        """Raise ``wire.PayloadError`` to drop a payload the generic checks accept."""

    # -- round reports (what ``aggregate`` did to single payloads comes back with its aggregate: ``Aggregated``)
    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        """After every exchange round: keep what later rounds need of it, and return fields added to every client's
        line of the round (e.g. ε spent). ``delivered``: what the clients received, in this protocol's layout: the
        aggregate it returned, or what a layer around it made of it (download coding's decoded approximation, the
        server optimizer's x_{t+1}); None when the round sent no aggregate. A protocol that keeps the aggregate
        for later rounds (a catch-up model, a coding reference) keeps this value, never a copy set aside in
        ``aggregate``."""
        return {}

    def server_summary(self) -> dict[str, Any]:
        """Extra top-level fields of summary.json (e.g. ``privacy``): this layer's own; the runtime merges every
        layer's (``wrappers/base.py: server_summary``)."""
        return {}


class CatchUp:
    """A client that missed exchanges (client sampling, a dropout): what the server sends it with its next ``train``
    message, and how it adopts that model (also Phong's model passed from worker to worker). The defaults: nothing
    to catch up to; a model the client receives is applied as an aggregate."""

    if TYPE_CHECKING:  # the protocol a part belongs to answers this (FederatedProtocol's core hook)

        def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases: ...

    def catch_up(self, version: int) -> Tensors | None:
        """What a client whose state is from round ``version`` (0: the initial model) receives with its next ``train``
        message, to adopt before training; None: it holds the current state, or a client left out continues from its
        own state (the default). :func:`newer` answers it from the protocol's last global model."""
        return None

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        """Adopt the model a ``train`` message carries before training (a client catching up; Phong's model
        passed from worker to worker). Default: apply it as an aggregate."""
        return self.client_apply(session, model)

    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        """The layouts a catch-up model may have (checked before ``client_start_from``): the trainable tensors."""
        return [spec_of({n: p for n, p in session.model.named_parameters() if p.requires_grad})]


class PayloadCoding:
    """How payload coding sees the payload (``wrappers/coding.py`` uploads, ``wrappers/download.py`` downloads);
    the defaults: the payload's float arrays, coded as they are, against the coding layer's own reference."""

    def coding_view(self, payload: Tensors, initial: Tensors) -> tuple[Tensors, Tensors]:
        """The payload's values to code, as named float tensors, and the payload arrays that travel as they are
        (default: its float arrays as they are; the others)."""
        floats = {n: t for n, t in payload.items() if t.is_floating_point()}
        return floats, {n: t for n, t in payload.items() if n not in floats}

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


def newer(held: tuple[int, Tensors] | None, version: int) -> Tensors | None:
    """``held`` = (the round it is from, the global model): the model, for a client whose state is from an earlier
    round ``version``; else None (nothing held, or the client is current)."""
    return held[1] if held is not None and version < held[0] else None


PARTS: tuple[type, ...] = (LocalTraining, ServerHooks, CatchUp, PayloadCoding)
"""Every optional part, in the order of the table above."""


def part_methods(part: type) -> tuple[str, ...]:
    """The methods of ``part`` a protocol may override."""
    return tuple(n for n, v in vars(part).items() if callable(v) and not n.startswith("_"))


def misplaced_part_methods(cls: type) -> list[str]:
    """Methods ``cls`` defines that a part declares but ``cls`` does not subclass (never called: refused)."""
    return [
        f"{name} (a method of {part.__name__})"
        for part in PARTS
        if not issubclass(cls, part)
        for name in part_methods(part)
        if name in vars(cls)
    ]


__all__ = ["PARTS", "CatchUp", "LocalTraining", "PayloadCoding", "ServerHooks", "misplaced_part_methods", "newer"]
