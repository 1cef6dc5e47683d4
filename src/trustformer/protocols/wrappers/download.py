"""Download coding (``federation.download_bits`` < 32): the global state each client receives after an exchange,
coded as a b-bit difference from what every client already holds, with the server's own error feedback.

The server keeps ``delivered``, the decoded global state every synced client holds (before the first exchange: the
identical initial model, where it has the aggregate's layout). After aggregating it sends
``c_t = Q(w_{t+1} − R_t)`` and both ends set ``delivered = R_t + deq(c_t)`` with the same arithmetic, so every client
holds exactly the server's copy. ``R_t`` is the protocol's shared reference where it has one (Trustformer's
reference centroids, which follow the delivered centroids), else ``delivered`` itself.

The server's error feedback: the aggregate ``w_{t+1}`` is computed from clients that trained from ``delivered``, so
it holds none of the last round's coding error. The server keeps that error, ``e_t = (w_t + e_{t−1}) − delivered_t``
(``residual``), and adds it to the next difference, ``c_t = Q(w_{t+1} + e_t − R_t)``. The exact model
``x_t = delivered_t + e_t`` then follows the uncoded update ``x_{t+1} = x_t + (w_{t+1} − delivered_t)``, and what
the clients hold stays within one round's coding error of it, whatever the number of rounds (EF21-P, Gruntkowska
et al. 2023, Alg. 1; DoubleSqueeze, Tang et al. 2019, Alg. 1). The codec is the upload's (``core/quantize.py``,
per-row grids) with rounding to nearest: the error feedback makes up for its bias, and its squared error is half
the stochastic rounding's (on ``tiny``, 2-bit, 6 rounds: 0.12 from the uncoded model against 0.22; 1.05 with
no residual).

Like the upload's, the feedback needs a coordinate to mean the same thing every round
(``stable_payload_layout``). Where it does not (Trustformer's centroids regroup at every exchange unless
``trustformer.memberships = "shared"``), no residual is kept and the rounding is stochastic and unbiased, seeded
from the run seed and the round.

Layers inside are handed the decoded state as what the clients received (``exchange_done``): the upload coding's
reference, FedAvg's catch-up model, Trustformer's public reference and the defences' last aggregate follow what the
clients hold. A client that missed exchanges (client sampling, a dropout) is caught up with its next ``train``
message, exactly and with its bytes counted: with the coded messages it missed, which it decodes in turn as every
synced client did (:meth:`CodedDownload.missed_messages`), when they are fewer bytes than the delivered state and the
server still keeps them; else with the delivered state in float32.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from ...core import quantize as q
from ...core.shared import Tensors, derive_seed
from ...wire import PayloadError, TensorSpec
from ..interface.base import Aggregated, ClientSession, FederatedProtocol, Phases, ServerStart
from . import coded_arrays
from .base import InnerCatchUp, InnerServerHooks, ProtocolWrapper
from .coded_arrays import per_row

CODES, GRID = "download/codes", "download/grid"  # the coded state's arrays: packed codes (uint8), grids (float32)
HELD = "download/held/"  # client state: the decoded global state it holds
REFRESH = "download/refresh/"  # catch-up tensors that only refresh the held state (the protocol does not catch up)
REPLAY = "download/replay/"  # catch-up: the k-th missed coded message's arrays under REPLAY + "<k>/"


def nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def decode(
    codes: torch.Tensor,
    grid: torch.Tensor,
    shapes: dict[str, tuple[int, ...]],
    reference: Tensors,
    bits: int,
    scale: str,
) -> Tensors:
    """``reference + deq(codes)`` per view tensor, computed the same way on the server and on every client."""
    return coded_arrays.decode(codes, grid, shapes, reference, bits, scale, "coded download")


class CodedDownload(ProtocolWrapper, InnerServerHooks, InnerCatchUp):
    """``inner`` with what it sends down after an exchange coded to ``bits`` bits (see the module docstring)."""

    # server: the decoded global state every synced client holds, the round it is from, the coding error not yet
    # delivered (error feedback), and the latest coded messages (each with the round it applies to and the round
    # it starts from) while they are fewer bytes than it
    state_attrs = ("delivered", "delivered_round", "residual", "recent")
    start_attrs = ("initial",)  # the identical initial model (server_begin)

    def __init__(self, inner: FederatedProtocol, bits: int, scale: str = "row") -> None:
        super().__init__(inner)
        self.bits, self.scale = bits, scale
        self.delivered: Tensors | None = None
        self.delivered_round = 0
        self.residual: Tensors = {}
        self.recent: list[dict] = []
        self.initial: Tensors = {}

    # ------------------------------------------------------------------ layout and reference (both ends)
    def _view(self, state: Tensors, initial: Tensors) -> tuple[Tensors, Tensors]:
        return self.inner.coding().coding_view(state, initial)

    def _shapes(self, spec: TensorSpec, initial: Tensors) -> tuple[dict[str, tuple[int, ...]], Tensors]:
        zeros = {n: torch.zeros(shape, dtype=getattr(torch, dtype)) for n, (shape, dtype) in spec.items()}
        view, rest = self._view(zeros, initial)
        return {n: tuple(t.shape) for n, t in view.items()}, rest

    def _reference(self, shared: Tensors | None, held: Tensors | None, initial: Tensors, shapes) -> Tensors:
        """The protocol's shared reference, else the held state, else the initial model (each viewed like the state,
        where it has its layout), else nothing (the state is coded as it is)."""
        if shared is not None:
            return shared
        for candidate in (held, initial):
            if not candidate:
                continue
            try:
                view, _rest = self.inner.coding().coding_view(candidate, initial)
            except (KeyError, ValueError, RuntimeError):
                continue
            if set(view) == set(shapes) and all(tuple(view[n].shape) == shapes[n] for n in view):
                return view
        return {}

    # ------------------------------------------------------------------ server
    def server_begin(self, start: ServerStart) -> None:
        self.initial = {n: t.detach().clone() for n, t in start.initial.items()}

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        """The layers inside are handed what the clients decoded, not the coded message."""
        return self.inner.server().exchange_done(rnd, self.delivered if delivered is not None else None)

    def server_reference(self, rnd: int, view: Tensors) -> Tensors:
        """What round ``rnd``'s coded difference is taken from (the error-feedback point: the delivered state)."""
        shapes = {n: tuple(t.shape) for n, t in view.items()}
        return self._reference(self.inner.coding().server_payload_reference(rnd), self.delivered, self.initial, shapes)

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        inner = self.inner.aggregate(rnd, payloads, num_examples)
        started = time.perf_counter()
        view, rest = self._view(inner.tensors, self.initial)
        reference = self.server_reference(rnd, view)
        feedback = self.inner.coding().stable_payload_layout()
        exact = self.exact_model(view)  # no residual is kept without feedback
        # round to nearest where the residual makes up for the bias, else unbiased (seeded) stochastic rounding
        generator = None
        if not feedback:
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.seed, "download", rnd))
        codes, grid = [], []
        for name, tensor in exact.items():
            target = tensor - (reference[name].double() if name in reference else 0.0)
            coded = q.quantize(
                target.float(), self.bits, per_row=per_row(tensor.shape, self.scale), generator=generator
            )
            codes.append(coded.codes)
            grid.append(torch.stack([coded.offset, coded.scale], 1).reshape(-1))
        message = {**rest, CODES: torch.cat(codes), GRID: torch.cat(grid).to(torch.float32)}
        shapes = {n: tuple(t.shape) for n, t in view.items()}
        decoded = decode(message[CODES], message[GRID], shapes, reference, self.bits, self.scale)
        self.residual = {n: (exact[n] - decoded[n].double()).float() for n in exact} if feedback else {}
        self._remember(rnd, message)
        self.delivered = self.inner.coding().coding_unview(decoded, rest, self.initial)
        self.delivered_round = rnd
        return replace(
            inner, tensors=message, phases={**inner.phases, "download_code_s": time.perf_counter() - started}
        )

    def exact_model(self, view: Tensors) -> Tensors:
        """``w_{t+1} + e_t`` in float64: this round's aggregate plus the coding error not yet delivered (none on the
        first exchange, or where the layout changed)."""
        residual = self.residual
        if set(residual) != set(view) or any(residual[n].shape != view[n].shape for n in view):
            residual = {}
        return {n: t.detach().double() + (residual[n].double() if residual else 0.0) for n, t in view.items()}

    def _remember(self, rnd: int, message: Tensors) -> None:
        """Keep this round's message for catch-ups while the kept ones weigh less than the delivered state; none
        where the difference is from the protocol's own reference (a client that missed it cannot decode it)."""
        if self.inner.coding().server_payload_reference(rnd) is not None:
            self.recent = []
            return
        self.recent.append({"from": self.delivered_round, "round": rnd, "message": dict(message)})
        full = nbytes(self.delivered) if self.delivered else nbytes(message) * 32 // self.bits
        while self.recent and sum(nbytes(m["message"]) for m in self.recent) >= full:
            self.recent.pop(0)

    def catch_up(self, version: int) -> Tensors | None:
        """For a client whose state is from before the delivered round: the coded messages it missed
        (:meth:`missed_messages`), else the delivered state in float32: as the model to adopt where the protocol
        catches clients up, else only to refresh the state a client holds (the protocol's own state then stays the
        client's)."""
        inner = self.inner.catching_up().catch_up(version)
        if self.delivered is None:
            return inner
        if version >= self.delivered_round:
            return None
        if inner is None:
            return {REFRESH + n: t.clone() for n, t in self.delivered.items()}
        return self.missed_messages(version) or {n: t.clone() for n, t in self.delivered.items()}

    def missed_messages(self, version: int) -> Tensors | None:
        """The coded messages a client whose state is from round ``version`` missed, in order, when the server keeps
        them all and they are fewer bytes than the delivered state; else None."""
        missed = [m for m in self.recent if m["round"] > version]
        if not missed or missed[0]["from"] != version or self.delivered is None:
            return None
        if sum(nbytes(m["message"]) for m in missed) >= nbytes(self.delivered):
            return None
        return {f"{REPLAY}{k}/{n}": t for k, m in enumerate(missed) for n, t in m["message"].items()}

    # ------------------------------------------------------------------ client
    def catch_up_specs(self, session: ClientSession) -> list[TensorSpec]:
        """The protocol's own catch-up model, or the delivered state to refresh (see :meth:`catch_up`), or 1, 2, …
        missed coded messages (as many as may weigh less than the state)."""
        spec = self.inner.payload_spec(session)
        if spec is None:
            return self.inner.catching_up().catch_up_specs(session)
        refresh = {REFRESH + n: s for n, s in spec.items()}
        coded = self.payload_spec(session) or {}
        full = sum(int(torch.tensor(shape).prod()) * 4 for shape, _ in spec.values())
        one = sum(
            int(torch.tensor(shape).prod()) * torch.empty((), dtype=getattr(torch, d)).element_size()
            for shape, d in coded.values()
        )
        replays = [
            {f"{REPLAY}{k}/{n}": s for k in range(count) for n, s in coded.items()}
            for count in range(1, max(1, full // max(one, 1)) + 1)
        ]
        return [*self.inner.catching_up().catch_up_specs(session), refresh, *replays]

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        spec = self.inner.payload_spec(session)
        if spec is None:
            return None
        shapes, rest = self._shapes(spec, session.initial_tensors())
        return {**{n: spec[n] for n in rest}, **coded_arrays.coded_spec(shapes, self.bits, self.scale, CODES, GRID)}

    def _decoded(self, session: ClientSession, message: Tensors) -> Tensors:
        """The global state one coded message gives, decoded against what the client holds; held from now on."""
        spec = self.inner.payload_spec(session)
        if spec is None:
            raise PayloadError("coded download: the protocol gives no layout of what it receives")
        initial = session.initial_tensors()
        shapes, rest_spec = self._shapes(spec, initial)
        state = session.protocol_state
        held = {n[len(HELD) :]: t for n, t in state.items() if n.startswith(HELD)}
        reference = self._reference(self.inner.coding().payload_reference(session), held or None, initial, shapes)
        view = decode(message[CODES], message[GRID], shapes, reference, self.bits, self.scale)
        decoded = self.inner.coding().coding_unview(view, {n: message[n] for n in rest_spec}, initial)
        self._hold(session, decoded)
        return decoded

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        started = time.perf_counter()
        decoded = self._decoded(session, aggregate)
        decode_s = time.perf_counter() - started
        return {**self.inner.client_apply(session, decoded), "download_decode_s": decode_s}

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        if model and all(n.startswith(REPLAY) for n in model):  # the missed coded messages, decoded in turn
            steps: dict[int, Tensors] = {}
            for name, tensor in model.items():
                index, _, inner_name = name[len(REPLAY) :].partition("/")
                steps.setdefault(int(index), {})[inner_name] = tensor
            if sorted(steps) != list(range(len(steps))):
                raise PayloadError(f"coded catch-up: its steps are {sorted(steps)}, not 0..{len(steps) - 1}")
            state: Tensors = {}
            for step in range(len(steps)):
                state = self._decoded(session, steps[step])
            return self.client_start_from(session, state)
        if model and all(n.startswith(REFRESH) for n in model):
            self._hold(session, {n[len(REFRESH) :]: t for n, t in model.items()})
            return {}
        self._hold(session, model)
        return self.inner.catching_up().client_start_from(session, model)

    @staticmethod
    def _hold(session: ClientSession, state: Tensors) -> None:
        for name in [n for n in session.protocol_state if n.startswith(HELD)]:
            del session.protocol_state[name]
        for name, tensor in state.items():
            session.protocol_state[HELD + name] = tensor.detach().clone()


__all__ = ["CODES", "GRID", "REPLAY", "CodedDownload", "decode"]
