"""Payload coding (``federation.payload_bits`` < 32): a layer around any protocol that sends weights or updates,
the way the secure channel wraps the exchange — the protocols themselves are unchanged.

A client codes what it uploads as the difference from what both ends already hold, uniformly quantized to
b bits with stochastic rounding (``core/quantize.py``: QSGD's unbiased quantizer on a per-row or per-tensor
grid; FedPAQ) or, with ``federation.payload_rounding = "nearest"``, to the nearest level (half the squared
error; biased, so only where the feedback below makes up for it), and keeps the coding error for its next
upload (error feedback, EF-SGD):

- **what is coded**: the protocol's payload seen as named float tensors (``coding_view``: Trustformer's one flat
  array of centroids as one k×f matrix per layer; top-k's ``values``; anything else, e.g. top-k's indices,
  travels as it is);
- **the reference** both ends hold: the protocol's own (``payload_reference`` / ``server_payload_reference``:
  Trustformer's reference centroids, the cluster means of the consensus model every party derives from the
  public aggregates), or else the last aggregate (before the first exchange: the identical initial model)
  when it has the payload's layout (FedAvg: the last global model); else nothing (an update, e.g. top-k's, is a
  difference already);
- **the grid**: one per row of a tensor whose rows hold at least 16 values (``coded_arrays.MIN_ROW``;
  ``federation.payload_scale = "row"``), else one per tensor; its offset and step travel as float32 (``grid``),
  the codes packed ``8 / b`` per byte (``codes``): the bytes counted are those of the real message;
- **error feedback** where a payload coordinate means the same thing from round to round
  (``stable_payload_layout``): FedAvg, top-k, Trustformer with ``shared`` memberships. Trustformer's other
  membership modes regroup the rows every exchange, so last round's error would land on other rows: no
  feedback there (measured in ``bench federation``).

The server decodes every payload (reference + dequantized difference) before the protocol's ``check_payload``
and ``aggregate`` see it. Rounding draws come from the run seed (client, round): reproducible. Downloads are
coded by their own layer (``download.py``). Secure aggregation cannot carry coded payloads (each client's grid
is its own; ``config.py`` refuses the combination).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ...core import quantize as q
from ...core.shared import Tensors, derive_seed
from ...errors import UncheckedConfigError
from ...wire import TensorSpec
from ..interface.base import ClientSession, FederatedProtocol, Phases, ServerStart
from .base import InnerCatchUp, InnerServerHooks, ProtocolWrapper
from .coded_arrays import coded_spec, decode, per_row

CODES, GRID = "codes", "grid"  # the coded payload's arrays: packed codes (uint8), each grid's offset and step
RESIDUAL, REFERENCE = "coded/residual/", "coded/reference/"  # client state: error feedback, the last aggregate


class CodedPayload(ProtocolWrapper, InnerServerHooks, InnerCatchUp):
    """``inner`` with its uploads coded to ``bits`` bits (see the module docstring)."""

    state_attrs = ("reference",)  # server: what the next exchange round's payloads are decoded against
    start_attrs = ("initial", "view_spec", "rest_spec")  # server: the initial model and the layout (server_begin)

    def __init__(self, inner: FederatedProtocol, bits: int, scale: str = "row", rounding: str = "stochastic") -> None:
        super().__init__(inner)
        if rounding == "nearest" and not inner.coding().stable_payload_layout():  # refused at load (the spec's check)
            raise UncheckedConfigError(
                "federation.payload_rounding = 'nearest' needs error feedback to make up for its bias, and this "
                "protocol's payload coordinates change meaning every round (no feedback is kept): set "
                "federation.payload_rounding = 'stochastic' (or, for Trustformer, trustformer.memberships = 'shared')"
            )
        self.bits, self.scale, self.rounding = bits, scale, rounding
        self.view_spec: dict[str, tuple[int, ...]] = {}  # server: the coded tensors' shapes, from the configuration
        self.rest_spec: TensorSpec = {}  # server: payload arrays that travel uncoded
        self.initial: Tensors = {}
        self.reference: Tensors = {}  # server: the reference of the next exchange round's payloads, in the view

    # ------------------------------------------------------------------ layout
    def _per_row(self, shape: Sequence[int]) -> bool:
        return per_row(shape, self.scale)

    def _split(self, payload: Tensors, initial: Tensors) -> tuple[Tensors, Tensors]:
        return self.inner.coding().coding_view(payload, initial)

    def _default_reference(
        self, held: Tensors | None, view_shapes: dict[str, tuple[int, ...]], initial: Tensors
    ) -> Tensors:
        """The last aggregate (or the initial model), viewed like the payload, when it has the payload's layout;
        ``initial``: the identical initial model (each half passes its own: the session's, the server's)."""
        if held is None:
            return {}
        try:
            view, _rest = self.inner.coding().coding_view(held, initial)
        except (KeyError, ValueError, RuntimeError):
            return {}
        same = set(view) == set(view_shapes) and all(tuple(view[n].shape) == view_shapes[n] for n in view)
        return view if same else {}

    # ------------------------------------------------------------------ client
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        payload, phases = self.inner.client_payload(session)
        started = time.perf_counter()
        initial = session.initial_tensors()
        view, rest = self._split(payload, initial)
        shapes = {n: tuple(t.shape) for n, t in view.items()}
        reference = self.inner.coding().payload_reference(session)
        if reference is None:
            held = {n[len(REFERENCE) :]: t for n, t in session.protocol_state.items() if n.startswith(REFERENCE)}
            reference = self._default_reference(held or initial, shapes, initial)
        state, feedback = session.protocol_state, self.inner.coding().stable_payload_layout()
        generator = None  # federation.payload_rounding = "nearest"
        if self.rounding == "stochastic":
            generator = torch.Generator().manual_seed(
                derive_seed(self.cfg.seed, "coding", session.client, session.round)
            )
        codes, grid = [], []
        for name, tensor in view.items():
            target = tensor.detach().double() - (reference[name].double() if name in reference else 0.0)
            residual = state.get(RESIDUAL + name) if feedback else None
            coded, residual = q.encode_with_feedback(
                target.float(), residual, self.bits, per_row=self._per_row(tensor.shape), generator=generator
            )
            if feedback:
                state[RESIDUAL + name] = residual
            codes.append(coded.codes)
            grid.append(torch.stack([coded.offset, coded.scale], 1).reshape(-1))
        out = {**rest, CODES: torch.cat(codes), GRID: torch.cat(grid).to(torch.float32)}
        return out, {**phases, "code_s": time.perf_counter() - started}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        phases = self.inner.client_apply(session, aggregate)
        self._hold(session, aggregate)
        return phases

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        phases = self.inner.catching_up().client_start_from(session, model)
        self._hold(session, model)
        return phases

    @staticmethod
    def _hold(session: ClientSession, tensors: Tensors) -> None:
        """Keep what the server sent: the coding layer's default reference of the next upload."""
        for name in [n for n in session.protocol_state if n.startswith(REFERENCE)]:
            del session.protocol_state[name]
        for name, tensor in tensors.items():
            session.protocol_state[REFERENCE + name] = tensor.detach().clone()

    # ------------------------------------------------------------------ server
    def server_begin(self, start: ServerStart) -> None:
        self.initial = {n: t.detach().clone() for n, t in start.initial.items()}
        self.view_spec, self.rest_spec = self._layout(start.initial)
        self._next_reference(0, self._default_reference(self.initial, self.view_spec, self.initial))

    def _layout(self, initial: Tensors) -> tuple[dict[str, tuple[int, ...]], TensorSpec]:
        """The shapes of the coded view's tensors, and the payload arrays that travel uncoded."""
        spec = self.inner.expected_payload(initial)
        zeros = {n: torch.zeros(shape, dtype=getattr(torch, dtype)) for n, (shape, dtype) in spec.items()}
        view, rest = self._split(zeros, initial)
        return {n: tuple(t.shape) for n, t in view.items()}, {n: spec[n] for n in rest}

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        view_spec, rest_spec = self._layout(initial)
        return {**rest_spec, **coded_spec(view_spec, self.bits, self.scale, CODES, GRID)}

    def _next_reference(self, rnd: int, default: Tensors) -> None:
        """After round ``rnd`` (0: before the first): the reference of the next exchange round's payloads (rounds
        r with r % federation.agg_every == 0), derived once, since the protocol's own may cluster rows, and kept with
        the server's state: the protocol's own reference, else ``default`` (the last aggregate in the payload's view,
        or the initial model's)."""
        every = self.cfg.federation.agg_every
        own = self.inner.coding().server_payload_reference((rnd // every + 1) * every)
        self.reference = {n: t.detach().clone() for n, t in (default if own is None else own).items()}

    def decode(self, rnd: int, payload: Tensors) -> Tensors:
        """A client's payload of round ``rnd`` as the protocol sent it: reference + dequantized difference
        (PayloadError if malformed)."""
        view = decode(
            payload[CODES], payload[GRID], self.view_spec, self.reference, self.bits, self.scale, "coded payload"
        )
        return self.inner.coding().coding_unview(view, {n: payload[n] for n in self.rest_spec}, self.initial)

    def check_payload(self, rnd: int, payload: Tensors) -> None:
        self.inner.server().check_payload(rnd, self.decode(rnd, payload))

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        fields = self.inner.server().exchange_done(rnd, delivered)  # first: the protocol's own reference may move
        held = self.reference  # nothing delivered: the clients still hold the last aggregate
        if delivered is not None:  # what the clients hold: the next round's payloads are coded against it
            held = self._default_reference(delivered, self.view_spec, self.initial)
        self._next_reference(rnd, held)
        return fields

    def aggregate(self, rnd, payloads, num_examples):
        return self.inner.aggregate(rnd, [self.decode(rnd, p) for p in payloads], num_examples)


__all__ = ["CODES", "GRID", "CodedPayload"]
