"""A server optimizer around a protocol (``federation.server_optimizer``; Reddi et al. 2021, "Adaptive Federated
Optimization", Algorithm 2): the round's aggregate becomes a pseudo-gradient Δ_t and the server takes one step of
SGD, momentum (FedAvgM), Adam (FedAdam), Yogi (FedYogi) or Adagrad (FedAdagrad) with it (``core/server_opt.py``).

What the aggregate is decides the rest (the protocol's ``ProtocolSpec.aggregate_kind``):

- **the global model** (FedAvg, FedProx: the mean of the clients' models). The server holds x_t (before the first
  exchange: the identical initial model), takes Δ_t = mean − x_t and returns x_{t+1} = x_t + step, which every client
  adopts. The protocol inside is handed x_{t+1}, not the mean, as what the clients received (``exchange_done``), so
  its catch-up model under client sampling and the defences' last aggregate follow what the clients hold; download
  coding outside tells this layer in turn what the clients decoded, which becomes x_{t+1}.
- **an update of it** (FedAvg of updates, top-k, the DP baselines: the mean update, which every client adds to the
  global model it holds). Δ_t is the aggregate and the server returns the step instead, no model needed; a sparse
  update (``indices``, ``values``) stays sparse under SGD and becomes a dense ``values`` of the model's dimension
  under the others, whose moments cover every coordinate. Under client sampling the server keeps x_t all the same:
  the model a client left out catches up to.
- **neither** (Trustformer's centroids, FedPC's and Phong's models passed around, no exchange): refused when the
  configuration is loaded (``config/sections.py``), and here.

Under differential privacy the optimizer is outside the DP layer (``protocols/__init__.py``): it steps with the noisy
release, which is post-processing and spends no ε; under distributed noise with the mean secure aggregation unmasks,
the sum of the owners' noise shares, while each owner still takes its one plain SGD step (``tasks/record_dp.py``),
linear in its share. The moments and the step count are server state, saved in every checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from ...core.dp import flatten, unflatten
from ...core.server_opt import Moments, ServerOptimizer, server_step
from ...errors import UncheckedConfigError
from ..interface.base import Aggregated, FederatedProtocol, ServerStart, Tensors
from ..interface.parts import newer
from .base import InnerCatchUp, InnerServerHooks, ProtocolWrapper
from .dp import DifferentialPrivacy

INDICES, VALUES = "indices", "values"  # a sparse update's arrays (fedavg_topk.py, dp.py)


class ServerOptimization(ProtocolWrapper, InnerServerHooks, InnerCatchUp):
    """``inner`` whose aggregate the server turns into one step of ``opt`` (see the module's docstring)."""

    # x_t where the server holds it (None: the initial model) and the round it is from; the optimizer's moments
    # (float64) and its step count t
    state_attrs = ("model", "model_round", "first_moment", "second_moment", "steps")
    start_attrs = ("initial", "dim")  # the identical initial model, its dimension (server_begin)

    def __init__(self, inner: FederatedProtocol, opt: ServerOptimizer) -> None:
        super().__init__(inner)
        if inner.spec.aggregate_kind is None:  # refused at load (config/sections.py)
            raise UncheckedConfigError(
                f"federation.server_optimizer = {opt.name!r} needs an aggregate that is the global model or an "
                f"update of it; that of federation.strategy = {inner.spec.name!r} is neither"
            )
        self.opt = opt
        self.kind: str = inner.spec.aggregate_kind
        # a whole-model aggregate steps from x_t; an update's server keeps x_t for the clients client sampling left out
        self.holds_model = self.kind == "model" or bool(inner.cfg.federation.clients_per_round)
        self.model: Tensors | None = None
        self.model_round = 0
        self.first_moment: Tensors | None = None
        self.second_moment: Tensors | None = None
        self.steps = 0
        self.initial: Tensors = {}
        self.dim = 0

    # ------------------------------------------------------------------------------ the step

    def server_begin(self, start: ServerStart) -> None:
        self.initial = {n: t.detach().clone() for n, t in start.initial.items()}
        self.dim = sum(t.numel() for t in start.initial.values())

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        inner = self.inner.aggregate(rnd, payloads, num_examples)
        started = time.perf_counter()
        out = self._model_step(inner.tensors) if self.kind == "model" else self._update_step(inner.tensors)
        return replace(inner, tensors=out, phases={**inner.phases, "server_opt_s": time.perf_counter() - started})

    def held(self) -> Tensors:
        """x_t: the global model the clients hold (before the first exchange, the initial model)."""
        if self.model is not None:
            return self.model
        if not self.initial:
            raise RuntimeError("the server optimizer has no initial model: server_begin was not called")
        return self.initial

    def _step(self, delta: Tensors) -> Tensors:
        """One step of the optimizer with the pseudo-gradient ``delta`` (float64); the moments move on."""
        step, moments = server_step(delta, Moments(self.first_moment, self.second_moment, self.steps), self.opt)
        self.first_moment, self.second_moment, self.steps = moments.first, moments.second, moments.steps
        return step

    def _model_step(self, mean: Tensors) -> Tensors:
        """Δ_t = mean − x_t; x_{t+1} = x_t + step, in the aggregate's dtype (the protocol inside learns that the
        clients hold it from ``exchange_done``)."""
        x = self.held()
        floats = [n for n, t in mean.items() if t.is_floating_point()]
        step = self._step({n: mean[n].double() - x[n].double() for n in floats})
        new = {**mean, **{n: (x[n].double() + step[n]).to(mean[n].dtype) for n in floats}}
        self.model = {n: t.detach().clone() for n, t in new.items()}
        return new

    def _update_step(self, update: Tensors) -> Tensors:
        """Δ_t = the mean update; the step replaces it (dense, or sparse where SGD keeps it sparse)."""
        if set(update) == {INDICES, VALUES} and self.opt.name != "sgd":
            dense = torch.zeros(self.dim, dtype=torch.float64)
            dense[update[INDICES].to(torch.int64)] = update[VALUES].double()
            out = {VALUES: self._step({VALUES: dense})[VALUES].to(update[VALUES].dtype)}
        else:
            floats = {n: t for n, t in update.items() if t.is_floating_point()}
            out = {**update, **{n: s.to(floats[n].dtype) for n, s in self._step(floats).items()}}
        if self.holds_model:
            self.model = applied(self.held(), out)
        return out

    # ------------------------------------------------------------------------------ the server around it

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        if self.kind == "model" and delivered is not None:  # download coding: the clients hold the decoded x_{t+1}
            self.model = {n: t.detach().clone() for n, t in delivered.items()}
        if self.holds_model and self.model is not None:
            self.model_round = rnd
        return self.inner.server().exchange_done(rnd, delivered)

    def catch_up(self, version: int) -> Tensors | None:
        """Update aggregates under client sampling: a client left out catches up to x_t (the protocol's own catch-up
        model would be its mean updates' sum, not the steps'). Whole models: the protocol's, which follows x_t."""
        if self.kind == "update" and self.holds_model and self.model is not None and self.model_round:
            return newer((self.model_round, self.model), version)
        return self.inner.catching_up().catch_up(version)

    def server_summary(self) -> dict[str, Any]:
        return {"server_optimizer": self.summary()}

    def summary(self) -> dict[str, Any]:
        """summary.json["server_optimizer"]: the optimizer, its hyperparameters, its steps, what it stepped with, and
        under DP why it spends nothing."""
        fed = self.cfg.federation
        out: dict[str, Any] = {
            "name": self.opt.name,
            **fed.server_optimizer_settings(),
            "steps": self.steps,
            "pseudo_gradient": "mean model - global model" if self.kind == "model" else "mean update",
        }
        if self.cfg.privacy.unit == "record" or any(isinstance(p, DifferentialPrivacy) for p in chain(self.inner)):
            out["privacy"] = "post-processing of the DP release: no ε charged"
            if self.cfg.privacy.noise == "distributed":
                out["privacy"] += " (the unmasked noisy mean: the owners' steps stay plain SGD, linear in their shares)"
        return out


def applied(model: Tensors, update: Tensors) -> Tensors:
    """``model`` plus ``update`` as a client applies it (``fedavg_updates.py``, ``fedavg_topk.py``): named tensors,
    a sparse ``indices``/``values`` or a dense ``values`` over the flattened model, added in float64."""
    if set(update) <= {INDICES, VALUES}:
        flat = flatten(model).double()
        if INDICES in update:
            flat.index_add_(0, update[INDICES].to(torch.int64), update[VALUES].double())
        else:
            flat += update[VALUES].double()
        return unflatten(flat, model)
    return {n: (t.double() + update[n].double()).to(t.dtype) for n, t in model.items()}


def chain(protocol: FederatedProtocol) -> list[FederatedProtocol]:
    """``protocol`` and every protocol it wraps, outermost first."""
    out = [protocol]
    while isinstance(protocol, ProtocolWrapper):
        protocol = protocol.inner
        out.append(protocol)
    return out


def with_server_optimizer(protocol: FederatedProtocol) -> FederatedProtocol:
    """``protocol`` wrapped in :class:`ServerOptimization`, unless the optimizer is plain SGD at η = 1 (FedAvg's own
    step: the protocol as it is, to the bit)."""
    fed = protocol.cfg.federation
    opt = ServerOptimizer(fed.server_optimizer, **fed.server_optimizer_settings())
    return protocol if opt.identity else ServerOptimization(protocol, opt)


__all__ = ["ServerOptimization", "applied", "with_server_optimizer"]
