"""Server-side defences against a malicious client (docs/robustness.md), as a wrapper around a protocol's
``aggregate``: the way Flower adds DP around a strategy.

1. **Update bound** (``robust.bound``). Each payload's deviation from a center is clipped to a bound
   (Sun et al. 2019, "Can you really backdoor federated learning?"). The center is the round's coordinate-wise
   median payload, which needs no state and is robust to a minority; a protocol whose payloads are updates
   already (``payload_is_update``: top-k) is centered on 0. The bound is ``robust.bound_factor`` × the median of
   the round's deviation norms (``median``), or ``robust.bound_norm`` (``fixed``). Every clipped update is an
   event (``clipped``) with its norm and the bound.
2. **Aggregation rule** (``robust.aggregator``): the protocol's own (weighted) mean of the bounded payloads, or
   the coordinate-wise median, trimmed mean, Krum or MultiKrum of them (``core/robust.py``, mirroring Flower's
   functions). Trustformer's payloads are its centroids, aligned cluster by cluster across clients, so each
   rule works per aligned centroid. Updates Krum leaves out are events (``excluded``).

3. **Defences on updates** (``robust.aggregator`` = ``fltrust``, ``flame``, ``clip_noise``; ``core/defences.py``).
   Where each payload is a whole model (FedAvg, coded or sampled), the server holds the model the round started
   from, so each update is the payload minus it. FLTrust (Cao et al. 2021) needs the server's own update on root
   data: a :data:`RootTraining` callable the runtime hands in (``runtime/root_training.py``: the task trains a
   copy of the global model on ``robust.root_size`` pairs of the public split), so this module imports no task.
   Clients FLTrust gives no trust are ``refused``, those it trusts less than half the round's median
   ``downweighted``; FLAME's outliers are ``excluded`` and the updates it clips ``clipped``; clip_noise's
   clipped updates ``clipped``. Their noise is seeded from the run seed and the aggregation's count (state).
4. **Clean fine-tuning** (``robust.root_finetune`` epochs). Where each payload is a whole model, after the rule
   (whichever, ``mean`` included) the server trains the aggregate on FLTrust's root data, with the same
   :data:`RootTraining` and an optimizer state of its own, and the round's result is that model: one round-level
   event (``root_finetuned``, the norm of what the pass changed) and the phase ``root_finetune_s``.

Payloads that the bound leaves alone reach the protocol's own ``aggregate`` unchanged, so an honest round whose
updates are all within the bound gives exactly the numbers of an undefended one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import torch

from ...config import UPDATE_RULES, RunConfig
from ...core.attacks import flatten, stack, unflatten
from ...core.defences import DefenceResult, clip_and_noise, flame, fltrust, median_of, rlr_step, robust_learning_rate
from ...core.robust import (
    clip_to_bound,
    coordinate_median,
    cosines_to_median,
    deviation_norms,
    median_bound,
    multikrum_mean,
    trimmed_mean,
)
from ...core.shared import derive_seed
from ...errors import UncheckedConfigError
from ...wire import FederationError, TensorSpec, spec_of
from ..interface.base import (
    Aggregated,
    ClientSession,
    FederatedProtocol,
    Phases,
    ServerStart,
    Tensors,
    held_global,
)
from ..interface.parts import newer
from .base import InnerCatchUp, InnerServerHooks, ProtocolWrapper

log = logging.getLogger(__name__)
SIGN, GLOBAL = "rlr/sign/", "rlr/global/"  # payload under secagg: the update's signs; client state: its start

RootTraining = Callable[[Tensors, "dict[str, Any] | None", int], "tuple[Tensors, dict[str, Any]]"]
"""FLTrust's server update: (the global model, the root optimizer's state or None, a seed) -> (that model trained on
the root data, the optimizer's new state). The runtime builds it from the task (``runtime/root_training.py``)."""
_root_training: list[Callable[[RunConfig], RootTraining]] = []  # what the runtime provided (provide_root_training)


def provide_root_training(factory: Callable[[RunConfig], RootTraining]) -> None:
    """The runtime hands the defences the task's training on root data (``runtime/root_training.py``): FLTrust
    calls ``factory(cfg)`` once, on the server, when its first round aggregates."""
    _root_training[:] = [factory]


@dataclass
class _Report:
    """What one aggregation did to single payloads (``events``, each naming its payload's ``index`` in the round's
    list) and where each payload it kept sat in that list (``positions``)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)


class RobustAggregation(ProtocolWrapper, InnerServerHooks, InnerCatchUp):
    """``inner`` with its payloads bounded and (optionally) a robust aggregation rule instead of its mean."""

    # whole-model payloads: the model the round's clients started from (the last aggregate; before it, the initial
    # model), so a resumed run checks directions as the uninterrupted one; the aggregations done (the seed of the
    # defences' noise and of FLTrust's root training), FLTrust's root optimizer state and the fine-tuning pass's
    state_attrs = ("_start", "_start_round", "_aggregations", "_root_optimizer", "_finetune_optimizer")
    start_attrs = ("_root_update", "_finetune_training")  # the trainings on root data (server_begin)

    def __init__(
        self, inner: FederatedProtocol, bound: str, aggregator: str, root_training: RootTraining | None = None
    ) -> None:
        super().__init__(inner)
        self.bound, self.aggregator = bound, aggregator
        self._given_root_update = root_training  # FLTrust's root training when the caller brings its own
        self._root_update: RootTraining | None = None  # FLTrust's, built in server_begin
        self._aggregations = 0
        self._root_optimizer: dict[str, Any] | None = None
        self._finetune_training: RootTraining | None = None  # robust.root_finetune's, built in server_begin
        self._finetune_optimizer: dict[str, Any] | None = None
        self.settings = inner.cfg.robust
        cfg = inner.cfg
        self.rlr_threshold = self.settings.rlr_threshold_for(cfg.federation.clients_per_round or cfg.federation.clients)
        # rlr under secure aggregation: each client sends its update's signs beside its payload (summed unseen)
        self.signs_sent = aggregator == "rlr" and cfg.secure.mode in ("secagg", "tee+secagg")
        self._start_round = 0  # the round whose aggregate _start is (0: the initial model)
        self._start: Tensors | None = None  # whole-model payloads: the model the round's clients started from

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        started = time.perf_counter()
        report = _Report()
        payloads, report.positions = self._bounded(list(payloads), report)
        num_examples = [num_examples[i] for i in report.positions]
        self._aggregations += 1
        inner = Aggregated({})
        if self.aggregator == "mean":
            inner = self.inner.aggregate(rnd, payloads, num_examples)
            aggregate, phases = inner.tensors, inner.phases
        elif self.aggregator in UPDATE_RULES:
            aggregate, phases = self._update_rule(payloads, num_examples, report)
        else:
            aggregate, phases = self._robust_rule(payloads, num_examples, report), {}
        if self.settings.root_finetune:
            started_pass = time.perf_counter()
            aggregate = self._fine_tuned(aggregate, report)
            phases = {**phases, "root_finetune_s": time.perf_counter() - started_pass}
        return Aggregated(
            aggregate,
            {**phases, "robust_s": time.perf_counter() - started},
            [*report.events, *inner.events],
            inner.fields,
        )

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        if delivered is not None and self._start is not None and set(delivered) == set(self._start):
            # whole models: the next round starts from what the clients received
            self._start = {n: t.detach().clone() for n, t in delivered.items()}
            self._start_round = rnd
        return self.inner.server().exchange_done(rnd, delivered)

    def catch_up(self, version: int) -> Tensors | None:
        """Client sampling under a robust rule: the protocol's own mean did not make the global model, this wrapper
        did; a client left out catches up to the last aggregate (whole-model payloads)."""
        if self.aggregator != "mean" and self.cfg.federation.clients_per_round and self._start_round:
            assert self._start is not None
            return newer((self._start_round, self._start), version)
        return self.inner.catching_up().catch_up(version)

    def _bounded(self, payloads: list[Tensors], report: _Report) -> tuple[list[Tensors], list[int]]:
        """The payloads to aggregate (clipped where their deviation exceeds the bound) and their positions in
        the round's list (a refused payload has none)."""
        if self.bound == "none" or not payloads:
            return payloads, list(range(len(payloads)))
        values = [{n: t for n, t in p.items() if t.is_floating_point()} for p in payloads]
        center = (
            {n: torch.zeros_like(t) for n, t in values[0].items()}
            if self.spec.payload_is_update
            else coordinate_median(values)
        )
        norms = deviation_norms(values, center)
        cosines = self._cosines(payloads)
        log.debug(
            "deviation norms / their median: %s; cosines to the median update: %s",
            [round(x / max(median_bound(norms, 1.0), 1e-30), 3) for x in norms],
            [round(c, 3) for c in cosines] if cosines is not None else None,
        )
        refuse = float("inf")
        if self.bound == "fixed":
            limit = self.settings.bound_norm
        else:
            limit = median_bound(norms, self.settings.bound_factor)
            if self.settings.refuse_factor:
                refuse = median_bound(norms, self.settings.refuse_factor)
        out, kept = [], []
        for i, (payload, norm) in enumerate(zip(payloads, norms, strict=True)):
            if cosines is not None and cosines[i] < self.settings.min_cosine:
                report.events.append(
                    {
                        "index": i,
                        "event": "refused",
                        "norm": norm,
                        "bound": limit,
                        "cosine": cosines[i],
                        "reason": f"update points away from the round's median update (cosine "
                        f"{cosines[i]:.3f} < robust.min_cosine = {self.settings.min_cosine}): "
                        "left out of the aggregate",
                    }
                )
                continue
            if norm > refuse:
                report.events.append(
                    {
                        "index": i,
                        "event": "refused",
                        "norm": norm,
                        "bound": limit,
                        "reason": f"update norm {norm:.4g} above robust.refuse_factor x the round's "
                        f"median ({refuse:.4g}): left out of the aggregate",
                    }
                )
                continue
            kept.append(i)
            if norm <= limit:
                out.append(payload)
                continue
            report.events.append(
                {
                    "index": i,
                    "event": "clipped",
                    "norm": norm,
                    "bound": limit,
                    "reason": f"update norm {norm:.4g} above the bound {limit:.4g} "
                    f"(robust.bound = {self.bound!r}): scaled down to it",
                }
            )
            out.append({**payload, **clip_to_bound(values[i], center, norm, limit)})
        if not kept:  # nothing to aggregate: the settings refuse what an honest majority sends
            raise FederationError(
                f"the update bound refused all {len(payloads)} updates of the round (cosines with the median update "
                f"{[round(c, 3) for c in cosines] if cosines is not None else 'not measured'}, robust.min_cosine = "
                f"{self.settings.min_cosine}; norms / their median "
                f"{[round(n / max(median_bound(norms, 1.0), 1e-30), 2) for n in norms]}, robust.refuse_factor = "
                f"{self.settings.refuse_factor}): lower robust.min_cosine or raise robust.refuse_factor"
            )
        return out, kept

    def _cosines(self, payloads: list[Tensors]) -> list[float] | None:
        """Where each payload is a whole model and the server holds the model the round started from (the last
        aggregate; before it, the initial model), each update's cosine with the round's median update."""
        start = self._start
        if (
            self.settings.min_cosine <= -1.0
            or start is None
            or len(payloads) < 3
            or any(set(p) != set(start) for p in payloads)
        ):
            return None
        return cosines_to_median(
            [{n: p[n].to(torch.float64) - start[n].to(torch.float64) for n in start} for p in payloads]
        )

    def _robust_rule(self, payloads: list[Tensors], num_examples: Sequence[int], report: _Report) -> Tensors:
        if self.aggregator == "median":
            return coordinate_median(payloads)
        if self.aggregator == "trimmed_mean":
            return trimmed_mean(payloads, self.settings.trim_fraction)
        f = self.settings.byzantine
        keep = 1 if self.aggregator == "krum" else (self.settings.multikrum_keep or len(payloads) - f)
        aggregate, chosen = multikrum_mean(payloads, [float(n) for n in num_examples], f, min(keep, len(payloads)))
        for i in sorted(set(range(len(payloads))) - set(chosen)):
            report.events.append(
                {
                    "index": report.positions[i],
                    "event": "excluded",
                    "reason": f"left out by robust.aggregator = {self.aggregator!r} (one of the "
                    f"{len(payloads) - len(chosen)} updates farthest from the others)",
                }
            )
        return aggregate

    # ------------------------------------------------------------------ defences on whole-model updates
    def _update_rule(
        self, payloads: list[Tensors], num_examples: Sequence[int], report: _Report
    ) -> tuple[Tensors, Phases]:
        """FLTrust, FLAME or clip_noise on the updates (payload minus the round's starting model): the starting
        model plus the rule's aggregate update."""
        start = self._start
        if self.signs_sent and start is not None and len(payloads) == 1:  # rlr under secure aggregation: the sums
            return self._rlr_from_sums(payloads[0], start, report), {}
        if start is None or any(set(p) != set(start) for p in payloads):  # refused at load (composition.py)
            raise UncheckedConfigError(
                f"robust.aggregator = {self.aggregator!r} needs whole-model payloads (the server forms each update "
                f"from the model the round started from); federation.strategy = {self.cfg.federation.strategy!r} "
                "sends others"
            )
        updates = stack([{n: p[n].to(torch.float64) - start[n].to(torch.float64) for n in start} for p in payloads])
        phases: Phases = {}
        if self.aggregator == "fltrust":
            started = time.perf_counter()
            result = fltrust(updates, self._server_update(start))
            phases["root_train_s"] = time.perf_counter() - started
        elif self.aggregator == "rlr":
            result = robust_learning_rate(updates, [float(n) for n in num_examples], self.rlr_threshold)
            share = result.info["reversed_share"]
            assert isinstance(share, float)
            report.events.append(self._rlr_event(share, "each update's signs"))
        else:
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.seed, "robust-noise", self._aggregations))
            settings = self.settings
            result = (
                flame(updates, settings.noise_factor, generator)
                if self.aggregator == "flame"
                else clip_and_noise(
                    updates, [float(n) for n in num_examples], settings.clip_norm, settings.noise_factor, generator
                )
            )
        self._record_rule(result, report)
        delta = unflatten(result.update, {n: t.to(torch.float64) for n, t in start.items()})
        return {n: (start[n].to(torch.float64) + delta[n]).to(start[n].dtype) for n in start}, phases

    def _rlr_from_sums(self, mean: Tensors, start: Tensors, report: _Report) -> Tensors:
        """RLR from what secure aggregation gives: the mean payload (models) and beside it the mean of the clients'
        sign vectors (``rlr/sign/``, weighted as the payloads are), whose agreement in clients is m × that mean."""
        clients = self.cfg.federation.clients_per_round or self.cfg.federation.clients
        out, reversed_count, total = {}, 0, 0
        for name, x in start.items():
            update = mean[name].double() - x.double()
            agreement = clients * mean[SIGN + name].double()
            step = rlr_step(update, agreement, self.rlr_threshold)
            reversed_count += int((agreement.abs() < self.rlr_threshold).sum())
            total += agreement.numel()
            out[name] = (x.double() + step).to(x.dtype)
        report.events.append(self._rlr_event(reversed_count / max(total, 1), "the securely summed signs"))
        return out

    def _rlr_event(self, share: float, source: str) -> dict[str, Any]:
        """The round's event of the robust learning rate (about the aggregate: no client named)."""
        reason = (
            f"robust learning rate: {share:.1%} of the coordinates reversed, where fewer than "
            f"{self.rlr_threshold:g} clients agree on the sign ({source})"
        )
        return {"event": "rlr_reversed", "reversed_share": share, "reason": reason}

    # ------------------------------------------------------------------ rlr's signs, sent by each client (secagg)
    def server_begin(self, start: ServerStart) -> None:
        if self._start is None:  # the model every client starts round 1 from
            self._start = {n: t.detach().clone() for n, t in start.initial.items()}
        self._root_update, self._finetune_training = self._root_trainings()

    def _root_trainings(self) -> tuple[RootTraining | None, RootTraining | None]:
        """FLTrust's training on the root data and ``robust.root_finetune``'s, where this run uses them and the
        runtime provided them (:func:`provide_root_training`; without it, the first use says so)."""
        factory = _root_training[0] if _root_training else None
        fltrust = self._given_root_update
        if fltrust is None and factory is not None and self.aggregator == "fltrust":
            fltrust = factory(self.cfg)
        finetune = None
        if factory is not None and self.settings.root_finetune:  # its recipe for robust.root_finetune epochs
            finetune = factory(
                replace(self.cfg, train=replace(self.cfg.train, local_epochs=self.settings.root_finetune))
            )
        return fltrust, finetune

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        spec = self.inner.expected_payload(initial)
        if self.signs_sent:
            spec = {**spec, **spec_of({SIGN + n: t.float() for n, t in initial.items() if t.is_floating_point()})}
        return spec

    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """Under secure aggregation with rlr: the payload and beside it sign(payload − the global model the client
        started from), which the server sees only summed."""
        payload, phases = self.inner.client_payload(session)
        if self.signs_sent:
            start = held_global(session, GLOBAL)
            payload = {
                **payload,
                **{
                    SIGN + n: torch.sign(payload[n].double() - start[n].double()).float()
                    for n in start
                    if payload[n].is_floating_point()
                },
            }
        return payload, phases

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        phases = self.inner.client_apply(session, aggregate)
        self._hold_global(session)
        return phases

    def client_start_from(self, session: ClientSession, model: Tensors) -> Phases:
        phases = self.inner.catching_up().client_start_from(session, model)
        self._hold_global(session)
        return phases

    def _hold_global(self, session: ClientSession) -> None:
        if self.signs_sent:  # the model this client's next update is measured from
            for name, p in session.model.named_parameters():
                if p.requires_grad:
                    session.protocol_state[GLOBAL + name] = p.detach().clone()

    def _server_update(self, start: Tensors) -> torch.Tensor:
        """FLTrust's g_0: the global model trained on the root data, minus the global model (flattened)."""
        if self._root_update is None:
            raise RuntimeError(
                "robust.aggregator = 'fltrust' needs the server's training on root data, which the runtime "
                "provides (runtime/root_training.py); this process had none when the server began"
            )
        seed = derive_seed(self.cfg.seed, "fltrust-root", self._aggregations)
        trained, self._root_optimizer = self._root_update(start, self._root_optimizer, seed)
        return flatten({n: trained[n].to(torch.float64) - start[n].to(torch.float64) for n in start})

    # ------------------------------------------------------------------ clean fine-tuning on root data
    def _fine_tuned(self, aggregate: Tensors, report: _Report) -> Tensors:
        """``aggregate`` trained for ``robust.root_finetune`` epochs on the root data (its own optimizer state, seeded
        by the aggregation's count); the protocol inside learns that the clients hold it (its catch-up model)."""
        epochs = self.settings.root_finetune
        if self._finetune_training is None:
            raise RuntimeError(
                f"robust.root_finetune = {epochs} needs the server's training on root data, which the runtime "
                "provides (runtime/root_training.py); this process had none when the server began"
            )
        seed = derive_seed(self.cfg.seed, "root-finetune", self._aggregations)
        trained, self._finetune_optimizer = self._finetune_training(aggregate, self._finetune_optimizer, seed)
        if set(trained) != set(aggregate):  # refused at load (composition.py, the protocol's check)
            raise UncheckedConfigError(
                f"robust.root_finetune = {epochs} needs an aggregate that is a whole model; "
                f"federation.strategy = {self.cfg.federation.strategy!r} returns others"
            )
        tuned = {n: trained[n].to(aggregate[n].dtype) for n in aggregate}
        moved = float(flatten({n: tuned[n].double() - aggregate[n].double() for n in aggregate}).norm())
        report.events.append(
            {
                "event": "root_finetuned",
                "epochs": epochs,
                "update_norm": moved,
                "reason": f"the aggregate trained for robust.root_finetune = {epochs} epoch(s) on the root data "
                f"(robust.root_size = {self.settings.root_size} pairs): moved by {moved:.4g}",
            }
        )
        return tuned  # the protocol inside learns that the clients hold it from exchange_done

    def _record_rule(self, result: DefenceResult, report: _Report) -> None:
        """An event for every client the rule refused, left out, down-weighted or clipped."""
        name = self.aggregator
        trust = result.info.get("trust")
        median_trust = median_of([t for t in trust if t > 0]) if isinstance(trust, list) and any(trust) else 0.0
        for i, (weight, scale, kept) in enumerate(zip(result.weights, result.scales, result.kept, strict=True)):
            event: dict[str, Any] = {"index": report.positions[i], "weight": weight, "scale": scale}
            if isinstance(trust, list):
                event["trust"] = trust[i]
            if not kept:
                event.update(
                    {
                        "event": "refused",
                        "reason": "trust 0 (its update points away from the server's update on "
                        "root data): left out by robust.aggregator = 'fltrust'",
                    }
                    if name == "fltrust"
                    else {
                        "event": "excluded",
                        "reason": "outside the majority cluster of the updates' cosine "
                        "distances (HDBSCAN): left out by robust.aggregator = 'flame'",
                    }
                )
            elif isinstance(trust, list) and trust[i] < 0.5 * median_trust:
                event.update(
                    {
                        "event": "downweighted",
                        "reason": f"trust {trust[i]:.3f} below half the round's median "
                        f"({median_trust:.3f}): weight {weight:.3f} in robust.aggregator = 'fltrust'",
                    }
                )
            elif scale < 1.0 and name != "fltrust":
                event.update(
                    {
                        "event": "clipped",
                        "reason": f"update norm above the bound {result.info['bound']:.4g} "
                        f"(robust.aggregator = {name!r}): scaled by {scale:.3f}",
                    }
                )
            else:
                continue
            report.events.append(event)


_in_force = lru_cache(maxsize=16)(lambda robust, fed, mode: robust.active(fed, mode))  # per configuration


def with_defences(protocol: FederatedProtocol, root_training: RootTraining | None = None) -> FederatedProtocol:
    """``protocol`` wrapped in :class:`RobustAggregation` when ``robust.*`` puts a defence in force. ``root_training``:
    FLTrust's server update (default: the one the runtime provided, :func:`provide_root_training`). What the defences
    refuse (a rule on whole-model updates, or the fine-tuning pass, where payloads are not whole models) is refused
    once, when the configuration loads (``config/composition.py``)."""
    cfg = protocol.cfg
    bound, aggregator = _in_force(cfg.robust, cfg.federation, cfg.secure.mode)
    if bound == "none" and aggregator == "mean" and not cfg.robust.root_finetune:
        return protocol
    return RobustAggregation(protocol, bound, aggregator, root_training)


__all__ = ["UPDATE_RULES", "RobustAggregation", "RootTraining", "provide_root_training", "with_defences"]
