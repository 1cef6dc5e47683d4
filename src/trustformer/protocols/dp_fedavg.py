"""DP-FedAvg (McMahan et al. 2018, Algorithm 1): user-level differential privacy on FedAvg.

Client: Δ = W_local − W_global (the model after local training minus the last global model, which
every client holds: round 1 the identical initial model), clipped to ‖Δ‖ ≤ C, sent to the server.
Server: (Σ_k Δ_k + N(0, σ²C² I)) / (qN), with q the client sampling rate and N the number of
clients (the fixed-denominator estimator); every client adds it to W_global and continues from the
new global model. σ is given (``privacy.noise_multiplier``) or solved from the target (ε, δ) for
the planned number of exchange rounds; an RDP accountant reports the ε spent after every round and
enforces the budget (``privacy.on_exceed``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence

from ..config import RunConfig
from ..core.accounting import PrivacyBudgetError, PrivacyLedger, solve_noise_multiplier
from ..core.dp import clip_by_global_norm, noise_generator, noised_mean
from ..wire import TensorSpec, spec_of
from ..workload import derive_seed
from .base import ClientSession, LocalStep, Tensors, assign_tensors, trainable_tensors

log = logging.getLogger(__name__)

GLOBAL = "global/"  # protocol_state key prefix of the last global model


class DPFedAvg:
    name = "dp-fedavg"
    exchanges = True

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.privacy = cfg.privacy
        self.ledger: PrivacyLedger | None = None  # server side, from server_begin
        self.population = 0
        self._round = 0

    # ------------------------------------------------------------------------------ client

    def global_tensors(self, session: ClientSession) -> Tensors:
        """The last global model this client holds (round 1: the identical initial model)."""
        names = [n for n, p in session.model.named_parameters() if p.requires_grad]
        if all(GLOBAL + n in session.protocol_state for n in names):
            return {n: session.protocol_state[GLOBAL + n] for n in names}
        initial = session.initial_tensors()
        return {n: initial[n].detach().clone() for n in names}

    def local_update(self, session: ClientSession) -> Tensors:
        """Δ = W_local − W_global for every trainable tensor."""
        local = trainable_tensors(session.model)
        base = self.global_tensors(session)
        return {n: local[n] - base[n].to(local[n].dtype) for n in local}

    def local_step(self, session: ClientSession) -> LocalStep | None:
        return None  # plain local training (Adam)

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        """Alg. 1 UserUpdate: Δ clipped to ‖Δ‖ ≤ C."""
        started = time.perf_counter()
        clipped, norm = clip_by_global_norm(self.local_update(session), self.privacy.clip_norm)
        phases = {"clip_s": time.perf_counter() - started}
        if session.diagnostics:  # the unclipped norm is not private: simulation diagnostics only
            phases["update_norm"] = norm
        return clipped, phases

    def payload_spec(self, session: ClientSession) -> TensorSpec | None:
        return spec_of(dict(session.model.named_parameters()))

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        """W_global ← W_global + noised mean update; the client continues from the new global model."""
        started = time.perf_counter()
        base = self.global_tensors(session)
        new_global = {n: (base[n].double() + aggregate[n].double()).to(base[n].dtype) for n in base}
        self._adopt(session, new_global)
        return {"apply_s": time.perf_counter() - started}

    def _adopt(self, session: ClientSession, new_global: Tensors) -> None:
        assign_tensors(session.model, new_global)
        for n, t in new_global.items():
            session.protocol_state[GLOBAL + n] = t

    # ------------------------------------------------------------------------------ server

    def planned_releases(self) -> int:
        """Exchange rounds of the run: every round r with r % agg_every == 0."""
        fed = self.cfg.federation
        return fed.rounds // fed.agg_every

    def server_begin(self, num_clients: int) -> None:
        """Fix σ (given, or solved for the planned rounds) and check the budget before round 1."""
        p = self.privacy
        self.population = num_clients
        planned = self.planned_releases()
        solved = p.noise_multiplier < 0
        sigma = (solve_noise_multiplier(p.epsilon, p.delta, p.sampling_rate, planned) if solved
                 else p.noise_multiplier)
        self.ledger = PrivacyLedger(noise_multiplier=sigma, sampling_rate=p.sampling_rate, delta=p.delta,
                                    target_epsilon=p.epsilon, clip_norm=p.clip_norm, planned_releases=planned,
                                    solved=solved)
        planned_eps = self.ledger.planned_epsilon()
        log.info("%s: sigma %.4f (%s), C %.3g, q %.3g, %d exchange round(s) -> epsilon %.4f at delta %g "
                 "(target %g)", self.name, sigma, "solved" if solved else "given", p.clip_norm, p.sampling_rate,
                 planned, planned_eps, p.delta, p.epsilon)
        if planned_eps > p.epsilon and p.on_exceed == "refuse":
            raise PrivacyBudgetError(
                f"the {planned} planned exchange round(s) with noise multiplier {sigma:g} "
                f"(sampling rate {p.sampling_rate:g}) spend epsilon = {planned_eps:.4g} at delta = {p.delta:g}, "
                f"more than privacy.epsilon = {p.epsilon:g}; lower federation.rounds, raise "
                "privacy.noise_multiplier (or set it to -1 to solve it), or set privacy.on_exceed = "
                "'stop' or 'continue'"
            )

    def server_round(self, rnd: int, nodes: Sequence[int]) -> list[int] | None:
        """Poisson client sampling with rate q (seeded from the run seed and round); None when the
        next release would exceed the target ε and ``on_exceed = 'stop'``."""
        assert self.ledger is not None, "server_begin was not called"
        self._round = rnd
        p = self.privacy
        if p.on_exceed == "stop" and self.ledger.epsilon_with(1) > p.epsilon:
            return None
        if p.sampling_rate >= 1.0:
            return list(nodes)
        rng = random.Random(derive_seed(self.cfg.seed, "client-sampling", rnd))
        return [n for n in sorted(nodes) if rng.random() < p.sampling_rate]

    def stop_reason(self) -> str:
        assert self.ledger is not None
        return (f"privacy budget: one more exchange round would spend epsilon = "
                f"{self.ledger.epsilon_with(1):.4g} > privacy.epsilon = {self.privacy.epsilon:g}")

    def denominator(self) -> float:
        """qN: the expected number of participants (McMahan et al. 2018, estimator f_f)."""
        return self.privacy.sampling_rate * self.population

    def noise_seed(self) -> int:
        return derive_seed(self.cfg.seed, "dp-noise", self._round)

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, dict[str, float]]:
        """Alg. 1 server: (Σ clip(Δ_k) + N(0, σ²C² I)) / (qN)."""
        assert self.ledger is not None, "server_begin was not called"
        started = time.perf_counter()
        mean = noised_mean(payloads, clip_norm=self.privacy.clip_norm,
                           noise_multiplier=self.ledger.noise_multiplier, denominator=self.denominator(),
                           generator=noise_generator(self.noise_seed()))
        return mean, {"aggregate_s": time.perf_counter() - started}

    def server_round_done(self, rnd: int) -> dict[str, float | None]:
        """Compose this round's release; the ε spent so far goes on every line of the round."""
        assert self.ledger is not None
        eps = self.ledger.record_release()
        log.info("round %d: epsilon spent %.4f at delta %g", rnd, eps, self.privacy.delta)
        return {"epsilon": eps if math.isfinite(eps) else None}

    def server_summary(self) -> dict[str, object]:
        assert self.ledger is not None
        return {"privacy": self.ledger.summary()}

    def server_state(self) -> dict[str, object]:
        """What a resumed server needs: the accountant's releases, ε after each, the population N."""
        assert self.ledger is not None, "server_begin was not called"
        return {"releases": self.ledger.releases, "population": self.population,
                "epsilons": [e if math.isfinite(e) else None for e in self.ledger.epsilons]}

    def load_server_state(self, state: dict[str, object]) -> None:
        """Restore :meth:`server_state` (after ``server_begin``, which fixes σ from the configuration)."""
        assert self.ledger is not None, "server_begin was not called"
        self.ledger.releases = int(state["releases"])  # type: ignore[arg-type]
        self.ledger.epsilons = [math.inf if e is None else float(e) for e in state["epsilons"]]  # type: ignore[union-attr]
        self.population = int(state["population"])  # type: ignore[arg-type]


__all__ = ["DPFedAvg", "GLOBAL"]
