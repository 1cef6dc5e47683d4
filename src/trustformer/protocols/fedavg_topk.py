"""FedAvg of top-k sparsified updates: the cheap compression baseline a centroid exchange must beat.

Client: Δ = W_local − W_global (+ the residual it did not send before, with error feedback, Stich et al.
2018), keeps the ceil(keep·d) coordinates of largest magnitude (``fedavg-topk.keep``) and sends them
as (int32 ``indices``, float32 ``values``): the bytes counted include the indices. Server: the
data-size-weighted mean of the sparse updates (zeros where a client sent nothing), returned sparse on
the union of the kept coordinates. Every client adopts W_global + mean update, as in FedAvg.

The same class, without error feedback and with BLUR's local step, is the sparsified update inside
DP-BLUR-LUS (``dp_blur_lus.py``), whose noised aggregate may come back dense (``values`` of length d).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import RunConfig
from ..config.checks import check_in_range
from ..core.dp import check_sparse, flatten, index_dtype, keep_count, top_k_sparsify, unflatten
from ..wire import PayloadError, TensorSpec
from .interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    LocalStep,
    Phases,
    ServerStart,
    Tensors,
    assign_tensors,
    held_global,
    trainable_tensors,
)
from .interface.parts import CatchUp, LocalTraining, PayloadCoding, ServerHooks, newer
from .interface.spec import ProtocolSpec

INDICES, VALUES = "indices", "values"
GLOBAL, RESIDUAL = "global/", "residual"


@dataclass(frozen=True)
class TopKConfig:
    """FedAvg of top-k updates (protocols/fedavg_topk.py): ``[fedavg-topk]``, ``--set fedavg-topk.keep=0.1``."""

    keep: float = 0.1  # fraction of the update's coordinates each client sends (largest magnitude)
    error_feedback: bool = True  # what a client does not send is added to its next update

    def validate(self) -> None:
        check_in_range("fedavg-topk.keep", self.keep, 0.0, 1.0, lo_open=True)


class FedAvgTopK(FederatedProtocol, LocalTraining, ServerHooks, CatchUp, PayloadCoding):
    spec = ProtocolSpec(
        name="fedavg-topk",
        factory=lambda cfg: FedAvgTopK(cfg),
        payload_is_update=True,
        estimator="update",
        aggregate_kind="update",
        variants=lambda cfg, levels, _memberships: (
            [(f"fedavg-topk keep={b:g}", {"fedavg-topk.keep": b}) for b in levels] if levels else None
        ),
        summary="clients send the largest coordinates of their update (with error feedback)",
        section=TopKConfig,
        renamed={"federation.topk_keep": "keep", "federation.topk_error_feedback": "error_feedback"},
        refuses={
            "nearest_rounding": "the values it sends are other coordinates every round, so no coding error is fed "
            "back on the coordinate it came from",
            "robust_rule": "each client sends the coordinates of its own choosing, so a coordinate-wise rule "
            "would mostly see zeros; keep 'mean' (its updates are still bounded by robust.bound)",
        },
    )
    # server, client sampling: the global model clients left out catch up to, and the round it is from
    state_attrs = ("global_model", "latest_round")
    start_attrs = ("dim",)  # the model's dimension (server_begin)

    def __init__(
        self, cfg: RunConfig, *, keep: float | None = None, error_feedback: bool | None = None, local_step=None
    ) -> None:
        super().__init__(cfg)
        settings = cfg.section("fedavg-topk")
        self.keep = settings.keep if keep is None else keep
        self.error_feedback = settings.error_feedback if error_feedback is None else error_feedback
        self._local_step = local_step  # (session) -> LocalStep | None
        self.dim = 2**31 - 1  # server: the model's dimension, from expected_payload
        # server, client sampling: the global model (the initial one plus every aggregate) and its round
        self.global_model: Tensors | None = None
        self.latest_round = 0

    # ------------------------------------------------------------------------------ client

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return self._local_step(session) if self._local_step is not None else None

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        started = time.perf_counter()
        local, base = trainable_tensors(session.model), held_global(session, GLOBAL)
        update = flatten({n: local[n].double() - base[n].double() for n in base})
        if self.error_feedback and RESIDUAL in session.protocol_state:
            update = update + session.protocol_state[RESIDUAL].to(update)
        indices, values = top_k_sparsify(update, keep_count(update.numel(), self.keep))
        if self.error_feedback:
            residual = update.clone()
            residual[indices] = 0.0
            session.protocol_state[RESIDUAL] = residual.to(torch.float32)
        payload = {INDICES: indices.to(index_dtype(update.numel())), VALUES: values.to(torch.float32)}
        return payload, {"sparsify_s": time.perf_counter() - started, "kept": float(indices.numel())}

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return None  # the union of kept coordinates varies: checked in client_apply

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        """W_global[indices] += values (sparse), or W_global += values (a dense update of length d)."""
        started = time.perf_counter()
        base = held_global(session, GLOBAL)
        flat = flatten(base).double()
        dim = flat.numel()
        if set(aggregate) == {INDICES, VALUES}:
            try:
                check_sparse(aggregate[INDICES], aggregate[VALUES], dim, what="aggregate from the server")
            except ValueError as exc:
                raise PayloadError(str(exc)) from None
            flat.index_add_(0, aggregate[INDICES].to(torch.int64).to(flat.device), aggregate[VALUES].double())
        elif set(aggregate) == {VALUES} and tuple(aggregate[VALUES].shape) == (dim,):
            flat += aggregate[VALUES].double()
        else:
            raise PayloadError(
                f"aggregate from the server: unexpected arrays {sorted(aggregate)} "
                f"(expected {INDICES!r} and {VALUES!r}, or {VALUES!r} of length {dim})"
            )
        new_global = unflatten(flat, base)
        assign_tensors(session.model, new_global)
        for n, t in new_global.items():
            session.protocol_state[GLOBAL + n] = t
        return {"apply_s": time.perf_counter() - started}

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        """A client catching up adopts the global model (its residual stays its own)."""
        started = time.perf_counter()
        assign_tensors(session.model, model)
        for n, t in model.items():
            session.protocol_state[GLOBAL + n] = t.clone()
        return {"apply_s": time.perf_counter() - started}

    # ------------------------------------------------------------------------------ server

    def server_begin(self, start: ServerStart) -> None:
        if self.cfg.federation.clients_per_round and self.global_model is None:
            self.global_model = {n: t.detach().clone() for n, t in start.initial.items()}
        self.dim = sum(t.numel() for t in start.initial.values())

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """``indices`` (int32) and ``values`` (float32) of ceil(keep·d) coordinates, d the model's dimension."""
        dim = sum(t.numel() for t in initial.values())
        index = str(torch.empty(0, dtype=index_dtype(dim)).numpy().dtype)
        return {INDICES: ((keep_count(dim, self.keep),), index), VALUES: ((keep_count(dim, self.keep),), "float32")}

    def check_payload(self, rnd: int, payload: Tensors) -> None:
        """Strictly increasing indices within the model's dimension, one value each."""
        if set(payload) != {INDICES, VALUES}:
            raise PayloadError(f"sparse update: arrays {sorted(payload)}, expected {[INDICES, VALUES]}")
        try:
            check_sparse(payload[INDICES], payload[VALUES], self.dim, what="sparse update")
        except ValueError as exc:
            raise PayloadError(str(exc)) from None

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        """Σ_k (n_k / n)·sparse Δ_k on the union of the kept coordinates."""
        started = time.perf_counter()
        total = float(sum(num_examples))
        union, inverse = torch.unique(
            torch.cat([p[INDICES].to(torch.int64) for p in payloads]), sorted=True, return_inverse=True
        )
        weights = torch.cat(
            [
                torch.full((p[VALUES].numel(),), n / total, dtype=torch.float64)
                for p, n in zip(payloads, num_examples, strict=True)
            ]
        )
        values = torch.zeros(union.numel(), dtype=torch.float64)
        values.index_add_(0, inverse, torch.cat([p[VALUES].double() for p in payloads]) * weights)
        out = {INDICES: union.to(payloads[0][INDICES].dtype), VALUES: values.to(torch.float32)}
        if self.global_model is not None:  # client sampling: keep the global model clients left out catch up to
            flat = flatten(self.global_model).double()
            flat.index_add_(0, union, out[VALUES].double())
            self.global_model = unflatten(flat, self.global_model)
        return Aggregated(out, {"aggregate_s": time.perf_counter() - started})

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        self.latest_round = rnd
        return {}

    def stable_payload_layout(self) -> bool:
        return False  # the values sent are other coordinates every round (their own error feedback covers the rest)

    def catch_up(self, version: int) -> Tensors | None:
        held = (self.latest_round, self.global_model) if self.global_model is not None and self.latest_round else None
        return newer(held, version)


SPEC = FedAvgTopK.spec

__all__ = ["FedAvgTopK", "INDICES", "VALUES"]
