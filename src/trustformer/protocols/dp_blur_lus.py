"""DP-BLUR-LUS (Cheng et al. 2022, "Differentially private federated learning with local
regularization and sparsification"): DP-FedAvg whose clients

1. train with the bounded local update regulariser (BLUR) added to the loss,
   R(w) = (λ/2)·max(0, ‖w − W_global‖ − B)² (``privacy.blur_lambda``, ``privacy.blur_bound``;
   B = C by default), which keeps the update small before it is clipped;
2. sparsify the update (LUS): keep the ceil(keep·d) coordinates of Δ with the largest magnitude
   (``privacy.lus_keep``), zero the rest;
3. clip the kept values to ‖·‖ ≤ C and send them as a sparse encoding: ``indices`` (int32),
   ``values`` (float32) and the dimension ``dim``, which is what the bytes count.

The server sums the sparse updates and adds N(0, σ²C²) on the kept coordinates only (the union of
the clients' kept coordinates; ``privacy.lus_noise = "kept"``), so the global update stays sparse
and goes down as (indices, values); ``"dense"`` adds noise on every coordinate and sends a dense
update. With ``"kept"`` the positions of the kept coordinates are released as they are: the
accountant's ε covers the values, not which coordinates were kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..config import RunConfig
from ..core.dp import (
    check_sparse,
    clip_by_global_norm,
    flatten,
    index_dtype,
    keep_count,
    noise_generator,
    sparse_noised_mean,
    top_k_sparsify,
    unflatten,
)
from ..core.local_rules import blur_penalty
from ..wire import PayloadError, TensorSpec
from .base import ClientSession, LocalStep, Tensors
from .dp_fedavg import DPFedAvg

INDICES, VALUES, DIM = "indices", "values", "dim"


class DPBlurLus(DPFedAvg):
    name = "dp-blur-lus"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        p = cfg.privacy
        self.blur_bound = p.blur_bound or p.clip_norm
        self.blur_lambda = p.blur_lambda
        self.keep = p.lus_keep
        self.noise_on = p.lus_noise
        self.dim: int | None = None  # server: the model's dimension, from expected_payload

    # ------------------------------------------------------------------------------ client

    def local_step(self, session: ClientSession) -> LocalStep:
        """BLUR: minimise L(w) + (λ/2)·max(0, ‖w − W_global‖ − B)² with the run's optimizer."""
        base = self.global_tensors(session)
        names = [n for n, p in session.model.named_parameters() if p.requires_grad]
        anchors = [base[n] for n in names]
        smoothing, bound, lam = session.smoothing, self.blur_bound, self.blur_lambda

        def step(model, optimizer, src, tgt):
            params = dict(model.named_parameters())
            optimizer.zero_grad(set_to_none=True)
            loss_sum, n_tokens = model.loss(src, tgt, label_smoothing=smoothing)
            objective = loss_sum / max(n_tokens, 1)
            if lam > 0:
                objective = objective + blur_penalty([params[n] for n in names], anchors, bound, lam)
            objective.backward()
            optimizer.step()
            return loss_sum.detach(), n_tokens  # the reported training loss is the data loss alone

        return step

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        """LUS then clipping: top ceil(keep·d) coordinates of Δ by magnitude, clipped to C, sparse."""
        started = time.perf_counter()
        flat = flatten(self.local_update(session))
        dim = flat.numel()
        indices, values = top_k_sparsify(flat, keep_count(dim, self.keep))
        clipped, kept_norm = clip_by_global_norm({VALUES: values}, self.privacy.clip_norm)
        payload = {
            INDICES: indices.to(index_dtype(dim)),
            VALUES: clipped[VALUES].to(torch.float32),
            DIM: torch.tensor([dim], dtype=torch.int64),
        }
        phases = {"clip_s": time.perf_counter() - started, "kept": float(indices.numel())}
        if session.diagnostics:  # not private: simulation diagnostics only
            phases["update_norm"] = float(flat.double().norm())
            phases["kept_norm"] = kept_norm
        return payload, phases

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return None  # the aggregate's length (the union of kept coordinates) varies: checked in client_apply

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        """W_global[indices] += values (sparse), or W_global += values (dense noise)."""
        started = time.perf_counter()
        base = self.global_tensors(session)
        flat = flatten(base).double()
        dim = flat.numel()
        if set(aggregate) == {INDICES, VALUES}:
            indices, values = aggregate[INDICES], aggregate[VALUES]
            try:
                check_sparse(indices, values, dim, what="aggregate from the server")
            except ValueError as exc:
                raise PayloadError(str(exc)) from None
            flat.index_add_(0, indices.to(torch.int64), values.double())
        elif set(aggregate) == {VALUES} and tuple(aggregate[VALUES].shape) == (dim,):
            flat += aggregate[VALUES].double()
        else:
            raise PayloadError(f"aggregate from the server: unexpected arrays {sorted(aggregate)} "
                               f"(expected {INDICES!r} and {VALUES!r}, or {VALUES!r} of length {dim})")
        self._adopt(session, unflatten(flat, base))
        return {"apply_s": time.perf_counter() - started}

    # ------------------------------------------------------------------------------ server

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """``indices`` and ``values`` of ceil(keep·d) coordinates and ``dim`` = d, the model's dimension."""
        dim = sum(t.numel() for t in initial.values())
        self.dim = dim
        kept = keep_count(dim, self.keep)
        return {INDICES: ((kept,), str(torch.empty(0, dtype=index_dtype(dim)).numpy().dtype)),
                VALUES: ((kept,), "float32"), DIM: ((1,), "int64")}

    def check_payload(self, payload: Tensors) -> None:
        """A client's sparse update is well formed (names, 1-D, increasing indices within dim, the
        model's dim)."""
        if set(payload) != {INDICES, VALUES, DIM}:
            raise PayloadError(f"sparse update: arrays {sorted(payload)}, expected {[DIM, INDICES, VALUES]}")
        dim = payload[DIM]
        if dim.numel() != 1 or dim.dtype != torch.int64 or int(dim[0]) < 1:
            raise PayloadError("sparse update: 'dim' must be one positive int64")
        if self.dim is not None and int(dim[0]) != self.dim:
            raise PayloadError(f"sparse update: dim = {int(dim[0])}, the model has {self.dim} coordinates")
        try:
            check_sparse(payload[INDICES], payload[VALUES], int(dim[0]), what="sparse update")
        except ValueError as exc:
            raise PayloadError(str(exc)) from None

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, dict[str, float]]:
        """Σ clip(sparse Δ_k) + N(0, σ²C²) on the kept coordinates (or all), divided by qN."""
        assert self.ledger is not None, "server_begin was not called"
        started = time.perf_counter()
        dims = {int(p[DIM][0]) for p in payloads}
        if len(dims) != 1:
            raise PayloadError(f"sparse updates of different dimensions {sorted(dims)}")
        dim = dims.pop()
        indices, values = sparse_noised_mean(
            [(p[INDICES], p[VALUES]) for p in payloads], dim, clip_norm=self.privacy.clip_norm,
            noise_multiplier=self.ledger.noise_multiplier, denominator=self.denominator(),
            generator=noise_generator(self.noise_seed()), noise_on=self.noise_on,
        )
        out: Tensors = {VALUES: values} if indices is None else {INDICES: indices.to(index_dtype(dim)),
                                                                VALUES: values}
        return out, {"aggregate_s": time.perf_counter() - started}


__all__ = ["DPBlurLus"]
