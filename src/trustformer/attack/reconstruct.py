"""`trustformer attack reconstruct`: what an honest-but-curious server learns, measured.

The command runs a federation in this process (the real round loop ``trustformer.app.run_federation``
on the in-process runtime, real Flower messages, the configured ``secure.mode``) and plays the server
that follows the protocol but tries to learn each client's model. From what the server holds — the
payloads it receives, the aggregates it sends, the run configuration and the public initial model (and
the memberships, wherever it can derive them) — it builds its best estimate of every client's
**locally trained model**: the client's trainable tensors right after local training, at the moment
the client builds its payload. The true model is captured by an observer of the protocol objects
(``protocols.observe``), kept by this harness only, never sent.

Per exchange round and client it reports, over all trainable weights:

- ``relative_error`` = ‖estimate − true‖ / ‖true‖ (L2);
- ``recovered_fraction`` = the fraction of weights whose estimate is within 1e-6 (absolute) of the truth.

The headline figures (``relative_error_mean``, ``recovered_fraction_mean``) are the means over the
clients at the **last exchange round**; every exchange round is in ``rounds`` of the JSON.
``initial_error_mean`` is the error of estimating every client by the public initial model (what
the server knows without receiving anything): an estimator that ignored the payload would score that.

What the server holds, per ``secure.mode``:

- ``none``: every client's decoded payload.
- ``tee``: the aggregator's code receives every opened payload; the TEE here is a software emulation
  that opens payloads in the server process (``secure/tee.py``), so the operator of that process sees
  them too and the attack uses them (the same figures as ``none``). A real enclave would leave the
  operator with the aggregate only, i.e. the ``secagg`` rows.
- ``secagg`` / ``tee+secagg``: only the sum of the masked payloads, i.e. the aggregate. Every client is
  estimated from the aggregate, as if it had sent it.

The estimators (one per strategy, :data:`ESTIMATORS`); ``G`` is the global model the server sent last
(round 1: the public initial model), which it tracks itself from the aggregates:

- ``fedavg``: the payload is the model: estimate = payload (exact).
- ``fedavg-topk``: the payload is the sparse update (indices, values): estimate = G + update; the
  coordinates not sent are estimated by G.
- ``dp-fedavg``, ``dp-fedsam``: the payload is the clipped update Δ: estimate = G + Δ (the server
  does not know by how much Δ was scaled down).
- ``dp-blur-lus``: the clipped sparse update: estimate = G + update on the kept coordinates.
- ``trustformer``: the payload holds per layer the k×f centroids L of its r×f layer matrix
  (``core.centroids.layer_matrix``). Estimate, per row: ``R[row] + (L[c(row)] − mean of R over the
  rows of cluster c(row))``, where R is the server's reference: the public initial model before the
  first exchange, then the consensus model every client can compute (R shifted so that each cluster's
  mean is the global centroid sent). Memberships c: from the protocol's ``server_labels(initial,
  history, round)`` where it has one and it returns labels (the memberships the server derives from public
  information; ``history`` = the aggregates it sent before, as sent); else, when k = r, every row its
  own cluster in order (the k-means engine's solution for k = r in every mode); else **guessed**: each
  reference row is assigned to its nearest received centroid (squared L2, ties to the lowest index).
  The JSON's ``memberships_source`` says which was used. A guess is a lower bound on what the server
  can learn. A payload packed by the protocol is unpacked with its ``unpack_payload`` where it has one.
- ``local``, ``centralized``: nothing is received: estimate = the public initial model (the truth is
  the model after the last round, read from the clients' state kept on disk for this run).

Measured (``small`` translation preset, 3 clients × 300 pairs, 2 rounds, seed 0, one thread per run,
Trustformer under the default privacy floor ``min_cluster_rows = 2``; 8.4 min for the 24 runs), mean
over clients at the last exchange (round 2)::

    trustformer attack reconstruct --rounds 2 --clients 3 --set data.client_size=300 \\
        --strategies fedavg,trustformer,fedavg-topk --betas 0.1,0.5 \\
        --memberships rotating,focused,tracked,shared,local --secure-modes none,secagg --set runtime.threads=1

==================================  ==============  ==========  =========  ========
run                                 server sees     rel. error  recovered  init err
==================================  ==============  ==========  =========  ========
fedavg                              every payload   0.0000      1.0000     0.1269
trustformer β=0.1 rotating          every payload   0.0815      0.0001     0.1283
trustformer β=0.1 focused           every payload   0.0821      0.0001     0.1283
trustformer β=0.1 tracked           every payload   0.0826      0.0001     0.1283
trustformer β=0.1 shared            every payload   0.0832      0.0001     0.1283
trustformer β=0.1 local             every payload   0.1428      0.0001     0.1676
trustformer β=0.5 rotating          every payload   0.0549      0.0002     0.1278
trustformer β=0.5 focused           every payload   0.0526      0.0003     0.1278
trustformer β=0.5 tracked           every payload   0.0586      0.0002     0.1278
trustformer β=0.5 shared            every payload   0.0616      0.0002     0.1277
trustformer β=0.5 local             every payload   0.4701      0.0001     0.4840
fedavg-topk keep=0.1                every payload   0.0804      0.0344     0.1162
fedavg-topk keep=0.5                every payload   0.0197      0.3097     0.1258
fedavg +secagg                      aggregate only  0.0357      0.0005     0.1269
trustformer β=0.1 rotating +secagg  aggregate only  0.0840      0.0001     0.1283
trustformer β=0.1 focused +secagg   aggregate only  0.0844      0.0001     0.1283
trustformer β=0.1 tracked +secagg   aggregate only  0.0848      0.0001     0.1283
trustformer β=0.1 shared +secagg    aggregate only  0.0854      0.0001     0.1283
trustformer β=0.1 local +secagg     aggregate only  0.1495      0.0001     0.1676
trustformer β=0.5 rotating +secagg  aggregate only  0.0629      0.0002     0.1278
trustformer β=0.5 focused +secagg   aggregate only  0.0606      0.0002     0.1278
trustformer β=0.5 tracked +secagg   aggregate only  0.0653      0.0002     0.1278
trustformer β=0.5 shared +secagg    aggregate only  0.0677      0.0002     0.1277
trustformer β=0.5 local +secagg     aggregate only  0.4902      0.0001     0.4840
==================================  ==============  ==========  =========  ========

Every Trustformer mode but ``local`` had its memberships derived by the server (``server_labels``);
``local``'s were guessed. Before the floor (``min_cluster_rows = 1``, the paper's protocol) the same
command recovered 28% of every client's weights at β = 0.5 and 1.2% at β = 0.1 (singleton clusters).
``fedavg-topk`` recovers 10.0% / 50.0% in round 1, fewer in round 2 because error feedback adds last
round's residual to what is sent. Under ``tee`` (emulated: the payloads are opened inside the server
process) the attack gives the ``none`` figures, under ``tee+secagg`` the ``secagg`` ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, RunConfig, load_config
from ..core.centroids import layer_matrix
from ..core.dp import flatten, unflatten
from ..protocols import ProtocolObserver, bare, make_protocol, observe
from ..protocols.interface.base import Tensors
from ..registry import protocol_spec
from ..protocols.trustformer import MODES as MEMBERSHIP_MODES

log = logging.getLogger(__name__)

TOLERANCE = 1e-6  # a weight counts as recovered when |estimate − true| <= this
FAST_EVAL: dict[str, Any] = {"eval.meteor": False, "eval.bertscore": False}
"""The attack needs no final scores beyond what the run always computes: METEOR and BERTScore are off
unless ``--set`` turns them on."""
SECAGG_MODES = ("secagg", "tee+secagg")


# ------------------------------------------------------------------------------ what the run shows


def _fingerprint(tensors: Tensors) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Exchange:
    """One exchange round as the harness saw it."""

    round: int
    trained: dict[int, Tensors] = field(default_factory=dict)  # ground truth (never sent)
    num_examples: dict[int, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # fingerprint of a client's payload -> client
    sent_payloads: dict[int, Tensors] = field(default_factory=dict)  # client -> the payload it built
    received: dict[int, Tensors] | None = None  # what the aggregation received, by client (None: secagg)
    aggregate: Tensors | None = None  # what the server sent back


def _nearest(payload: Tensors, sent: dict[int, Tensors]) -> int | None:
    """The client whose sent payload (same names and shapes) is nearest to ``payload`` (L2), if any."""
    best, best_distance = None, float("inf")
    for client, candidate in sent.items():
        if set(candidate) != set(payload) or any(candidate[n].shape != payload[n].shape for n in payload):
            continue
        distance = sum(
            float((candidate[n].double() - payload[n].double()).pow(2).sum())
            for n in payload
            if candidate[n].is_floating_point()
        )
        if distance < best_distance:
            best, best_distance = client, distance
    return best


class RunRecorder(ProtocolObserver):
    """Records every exchange of an in-process run (see :func:`trustformer.protocols.observe`)."""

    def __init__(self) -> None:
        self.exchanges: dict[int, Exchange] = {}
        self._round = 0
        self.unmatched = 0  # received payloads that match no client's (should not happen)

    def _exchange(self, rnd: int) -> Exchange:
        return self.exchanges.setdefault(rnd, Exchange(rnd))

    def client_trained(self, rnd: int, client: int, trained: Tensors, num_examples: int) -> None:
        self._round = rnd
        ex = self._exchange(rnd)
        ex.trained[client] = trained
        ex.num_examples[client] = num_examples

    def client_sent(self, rnd: int, client: int, payload: Tensors) -> None:
        self._exchange(rnd).sent[_fingerprint(payload)] = client
        self._exchange(rnd).sent_payloads[client] = payload

    def server_received(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> None:
        ex = self._exchange(self._round)  # in process, the aggregation follows the round's clients
        received: dict[int, Tensors] = {}
        for payload in payloads:
            client = ex.sent.get(_fingerprint(payload))
            if client is None:  # coded payloads arrive decoded, within the coding error: the nearest one sent
                client = _nearest(payload, ex.sent_payloads)
            if client is None:
                self.unmatched += 1
                continue
            received[client] = {n: t.detach().cpu().clone() for n, t in payload.items()}
        ex.received = received  # the last call is the aggregation the round used

    def client_applied(self, rnd: int, client: int, aggregate: Tensors) -> None:
        ex = self._exchange(rnd)
        if ex.aggregate is None:
            ex.aggregate = aggregate


# ------------------------------------------------------------------------------ estimators


class Estimator:
    """The server's running state for one strategy: ``estimate`` one client's trained model from one
    payload (or from the aggregate under secure aggregation); ``advance`` after the exchange to the
    model every client now starts from."""

    memberships_source: str | None = None

    def __init__(self, cfg: RunConfig, initial: Tensors, protocol: Any) -> None:
        self.cfg = cfg
        self.initial = initial
        self.protocol = protocol
        self.global_model = {n: t.clone() for n, t in initial.items()}
        self.history: list[Tensors] = []  # the aggregates sent so far, as sent

    def begin(self, rnd: int) -> None:
        """Before the payloads of exchange ``rnd`` are estimated."""

    def estimate(self, payload: Tensors) -> Tensors:
        raise NotImplementedError

    def advance(self, aggregate: Tensors) -> None:
        self.history.append(aggregate)


class NothingReceived(Estimator):
    """local, centralized: the server receives nothing; the public initial model is its estimate."""

    def estimate(self, payload: Tensors) -> Tensors:
        return {n: t.clone() for n, t in self.initial.items()}


class WholeModel(Estimator):
    """fedavg: the payload is the model itself."""

    def estimate(self, payload: Tensors) -> Tensors:
        return {n: payload[n].to(self.initial[n].dtype).reshape(self.initial[n].shape) for n in self.initial}

    def advance(self, aggregate: Tensors) -> None:
        super().advance(aggregate)
        self.global_model = self.estimate(aggregate)


def _add_sparse(base: Tensors, indices: torch.Tensor, values: torch.Tensor) -> Tensors:
    flat = flatten(base).double()
    flat.index_add_(0, indices.to(torch.int64), values.double())
    return unflatten(flat, base)


def _add_update(base: Tensors, update: Tensors) -> Tensors:
    """G + a sparse (``indices``, ``values``) or dense (``values`` of the model's length, or per-tensor) update."""
    if "indices" in update:
        return _add_sparse(base, update["indices"], update["values"])
    if set(update) == {"values"} or set(update) == {"values", "dim"}:
        flat = flatten(base).double() + update["values"].double().reshape(-1)
        return unflatten(flat, base)
    return {n: (base[n].double() + update[n].double()).to(base[n].dtype) for n in base}


class GlobalPlusUpdate(Estimator):
    """fedavg-topk, dp-fedavg, dp-fedsam, dp-blur-lus: the payload is an update of the global model G
    the server sent (sparse or dense, clipped or not): estimate = G + update."""

    def estimate(self, payload: Tensors) -> Tensors:
        return _add_update(self.global_model, payload)

    def advance(self, aggregate: Tensors) -> None:
        super().advance(aggregate)
        self.global_model = _add_update(self.global_model, aggregate)


def nearest_centroid(rows: torch.Tensor, centroids: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """The index of the nearest centroid (squared L2; ties to the lowest index) of every row."""
    c = centroids.double()
    c_sq = (c * c).sum(1)
    out = torch.empty(rows.shape[0], dtype=torch.long)
    for start in range(0, rows.shape[0], chunk):
        x = rows[start : start + chunk].double()
        dist = c_sq.unsqueeze(0) - 2.0 * x @ c.T  # + |x|² is the same for every centroid
        out[start : start + chunk] = dist.argmin(1)
    return out


def centroid_estimate(reference: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``R[row] + (L[c(row)] − mean of R over cluster c(row))`` for an r×f reference R, k×f centroids L
    and r labels; float64. A cluster no row falls in contributes nothing."""
    r = reference.double()
    k = centroids.shape[0]
    labels = labels.to(torch.long)
    counts = torch.bincount(labels, minlength=k).clamp(min=1).unsqueeze(1).double()
    sums = torch.zeros(k, r.shape[1], dtype=torch.float64).index_add_(0, labels, r)
    shift = centroids.double() - sums / counts
    return r + shift.index_select(0, labels)


class Centroids(Estimator):
    """trustformer: per layer, the reference shifted so each cluster's mean is the received centroid."""

    def __init__(self, cfg: RunConfig, initial: Tensors, protocol: Any) -> None:
        super().__init__(cfg, initial, protocol)
        self.labels: dict[str, torch.Tensor] | None = None  # this exchange's, from the server's derivation
        self.sources: set[str] = set()
        self.round = 0
        self.exchanges: list[tuple[int, Tensors]] = []  # (round, aggregate sent), oldest first

    @property
    def memberships_source(self) -> str:  # type: ignore[override]
        return " + ".join(sorted(self.sources)) if self.sources else "none"

    def unpack(self, payload: Tensors) -> dict[str, torch.Tensor]:
        unpack = getattr(self.protocol, "unpack_payload", None)
        return dict(unpack(payload, self.initial)) if unpack is not None else dict(payload)

    def begin(self, rnd: int) -> None:
        self.round = rnd
        derive: Callable | None = getattr(self.protocol, "server_labels", None)
        self.labels = derive(self.initial, list(self.exchanges), rnd) if derive is not None else None

    def _labels(self, name: str, reference: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
        if self.labels is not None and self.labels.get(name) is not None:
            self.sources.add("server_labels")
            return self.labels[name].to(torch.long)
        if centroids.shape[0] == reference.shape[0]:
            self.sources.add("identity (k = r)")
            return torch.arange(reference.shape[0])
        self.sources.add("nearest-centroid guess")
        return nearest_centroid(reference, centroids)

    def estimate(self, payload: Tensors) -> Tensors:
        centroids = self.unpack(payload)
        out: Tensors = {}
        for name, ref in self.global_model.items():
            if name not in centroids:
                out[name] = ref.clone()
                continue
            matrix = layer_matrix(ref)
            c = centroids[name].reshape(-1, matrix.shape[1])
            est = centroid_estimate(matrix, c, self._labels(name, matrix, c))
            out[name] = est.to(ref.dtype).reshape(ref.shape)
        return out

    def advance(self, aggregate: Tensors) -> None:
        self.global_model = self.estimate(aggregate)  # the consensus every client can compute
        self.exchanges.append((self.round, aggregate))
        super().advance(aggregate)


ESTIMATORS: dict[str, type[Estimator]] = {  # a protocol's spec.estimator -> the server's estimator
    "model": WholeModel,
    "update": GlobalPlusUpdate,
    "centroids": Centroids,
    "none": NothingReceived,
}


def estimator_of(cfg: RunConfig) -> type[Estimator]:
    """The estimator the protocol's spec names (ConfigError when the attack does not cover it)."""
    kind = protocol_spec(cfg.federation.strategy).estimator
    if kind is None:
        raise ConfigError(
            f"the reconstruction attack does not cover federation.strategy = "
            f"{cfg.federation.strategy!r} (its spec declares no estimator)"
        )
    return ESTIMATORS[kind]


# ------------------------------------------------------------------------------ scoring


def score(estimate: Tensors, true: Tensors) -> tuple[float, float]:
    """(relative L2 error, fraction of weights within :data:`TOLERANCE`) over every trainable weight."""
    names = list(true)
    diff = torch.cat([(estimate[n].double() - true[n].double()).reshape(-1) for n in names])
    norm = torch.cat([true[n].double().reshape(-1) for n in names]).norm()
    error = float(diff.norm() / norm) if norm > 0 else float(diff.norm())
    return error, float((diff.abs() <= TOLERANCE).double().mean())


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def server_estimates(cfg: RunConfig, initial: Tensors, exchanges: Sequence[Exchange], protocol: Any):
    """Per exchange, oldest first: (the exchange, the server's estimate of every client's trained model from what
    it holds, the global model the server held before it). Under secure aggregation every client is estimated
    from the aggregate, as if it had sent it; a client dropped from a round has no estimate there."""
    estimator = estimator_of(cfg)(cfg, initial, protocol)
    secagg = cfg.secure.mode in SECAGG_MODES
    for ex in sorted(exchanges, key=lambda e: e.round):
        estimator.begin(ex.round)
        before = {n: t.clone() for n, t in estimator.global_model.items()}
        estimates = {}
        for client in sorted(ex.trained):
            if secagg:
                if ex.aggregate is None:
                    raise RuntimeError(f"round {ex.round}: no aggregate was sent")
                estimates[client] = estimator.estimate(ex.aggregate)
            elif ex.received is not None and client in ex.received:
                estimates[client] = estimator.estimate(ex.received[client])
        yield ex, estimates, before, estimator
        if ex.aggregate is not None:
            estimator.advance(ex.aggregate)


def attack(cfg: RunConfig, initial: Tensors, exchanges: Sequence[Exchange], protocol: Any) -> dict[str, Any]:
    """The server's estimates of every exchange, scored against the clients' true trained models."""
    secagg = cfg.secure.mode in SECAGG_MODES
    rounds, estimator = [], None
    for ex, estimates, _before, estimator in server_estimates(cfg, initial, exchanges, protocol):
        clients = sorted(ex.trained)
        errors, recovered, initial_errors = [], [], []
        for client in clients:
            if client not in estimates:
                continue  # dropped this round: the server received nothing from it
            error, fraction = score(estimates[client], ex.trained[client])
            errors.append(error)
            recovered.append(fraction)
            initial_errors.append(score(initial, ex.trained[client])[0])
        rounds.append(
            {
                "round": ex.round,
                "clients": clients,
                "relative_error": errors,
                "recovered_fraction": recovered,
                "relative_error_mean": _mean(errors),
                "recovered_fraction_mean": _mean(recovered),
                "initial_error_mean": _mean(initial_errors),
            }
        )
    if not rounds:
        raise RuntimeError("the run had no exchange round: nothing to attack")
    last = rounds[-1]
    return {
        "rounds": rounds,
        "headline": "last exchange round",
        "clients": last["clients"],
        "relative_error": last["relative_error"],
        "recovered_fraction": last["recovered_fraction"],
        "relative_error_mean": last["relative_error_mean"],
        "recovered_fraction_mean": last["recovered_fraction_mean"],
        "initial_error_mean": last["initial_error_mean"],
        "relative_error_mean_over_rounds": _mean([r["relative_error_mean"] for r in rounds]),
        "recovered_fraction_mean_over_rounds": _mean([r["recovered_fraction_mean"] for r in rounds]),
        "memberships_source": estimator.memberships_source,
        "server_sees": ("nothing" if not protocol.spec.exchanges else "aggregate only" if secagg else "every payload"),
    }


# ------------------------------------------------------------------------------ running


def _initial(cfg: RunConfig) -> Tensors:
    from ..protocols.interface.base import trainable_tensors
    from ..tasks.run import load_task

    return trainable_tensors(load_task(cfg).initial_model())


def _final_models(cfg: RunConfig, names: Sequence[str]) -> Exchange:
    """A run without exchanges: every client's model after the last round, from its state on disk."""
    from ..runtime.checkpoint import run_key
    from ..runtime.store import ROUND_END, DiskStore
    from ..core.shared import ALL_SHARDS

    store = DiskStore(Path(cfg.out) / "client-state" / run_key(cfg))
    pooled = protocol_spec(cfg.federation.strategy).pools_data
    clients = [ALL_SHARDS] if pooled else list(range(cfg.federation.clients))
    ex = Exchange(cfg.federation.rounds, received={})
    for client in clients:
        state = store.load(
            "all" if client == ALL_SHARDS else f"client-{client}", upto=(cfg.federation.rounds, ROUND_END)
        )
        if state is None:
            raise RuntimeError(f"client {client} left no state in {store.root}")
        ex.trained[client] = {n: state.model[n].detach().clone() for n in names}
        ex.received[client] = {}
    return ex


@dataclass
class ObservedRun:
    """A federation run in this process under the attack harness's observer: its summary and every exchange."""

    cfg: RunConfig
    summary: dict[str, Any]
    wall_s: float
    initial: Tensors
    exchanges: list[Exchange]
    protocol: Any  # the bare protocol (inside coding and differential privacy)
    unmatched: int = 0


def observed_run(cfg: RunConfig) -> ObservedRun:
    """Run the federation ``cfg`` in this process and record what every party held (see the module docstring)."""
    from ..engine.inprocess import run_in_process

    exchanges_model = make_protocol(cfg).spec.exchanges
    if not exchanges_model and cfg.runtime.store != "disk":  # the truth is read from the clients' state on disk
        cfg = load_config(cfg.preset, None, {**cfg.flat(), "runtime.store": "disk"})
    recorder = RunRecorder()
    started = time.perf_counter()
    with observe(recorder):
        summary = run_in_process(cfg)
    wall_s = time.perf_counter() - started
    initial = _initial(cfg)
    exchanges = list(recorder.exchanges.values()) if exchanges_model else [_final_models(cfg, list(initial))]
    return ObservedRun(cfg, summary, wall_s, initial, exchanges, bare(make_protocol(cfg)), recorder.unmatched)


def run_attack(cfg: RunConfig, run: ObservedRun | None = None) -> dict[str, Any]:
    """Run the federation ``cfg`` in this process (or take ``run``) and attack it; returns the result."""
    run = run if run is not None else observed_run(cfg)
    cfg, summary = run.cfg, run.summary
    result = attack(cfg, run.initial, run.exchanges, run.protocol)
    result.update(
        strategy=cfg.federation.strategy,
        secure=cfg.secure.mode,
        wall_s=run.wall_s,
        test_loss=summary.get("test_loss"),
        up_bytes_per_client_per_round=summary.get("bytes", {}).get("up_per_client_per_round"),
    )
    run_fields = protocol_spec(cfg.federation.strategy).run_fields
    if run_fields is not None:
        result.update(run_fields(cfg))
    if run.unmatched and cfg.secure.mode not in SECAGG_MODES:  # under secagg the aggregation sees only the mean
        result["unmatched_payloads"] = run.unmatched
    return result


@dataclass
class PlannedRun:
    label: str
    overrides: dict[str, Any]


def plan(
    cfg: RunConfig,
    strategies: Sequence[str] | None,
    betas: Sequence[float] | None,
    memberships: Sequence[str] | None,
    secure_modes: Sequence[str] | None,
) -> tuple[list[PlannedRun], list[str]]:
    """The runs of a sweep (strategy × β × memberships for trustformer, × secure mode; fedavg-topk at
    ``topk_keep`` = each β when --betas is given) and the combinations skipped, with why."""
    from ..config import SECURE_MODES, STRATEGIES

    fed = cfg.federation
    strategies = list(strategies or [fed.strategy])
    for s in strategies:
        if s not in STRATEGIES:
            raise ConfigError(f"--strategies: unknown strategy {s!r} (choose from {', '.join(STRATEGIES)})")
    modes = list(secure_modes or [cfg.secure.mode])
    for m in modes:
        if m not in SECURE_MODES:
            raise ConfigError(f"--secure-modes: unknown mode {m!r} (choose from {', '.join(SECURE_MODES)})")
    for m in memberships or []:
        if m not in MEMBERSHIP_MODES:
            raise ConfigError(f"--memberships: unknown mode {m!r} (choose from {', '.join(MEMBERSHIP_MODES)})")
    for b in betas or []:
        if not 0.0 < b <= 1.0:
            raise ConfigError(f"--betas: beta {b:g} must be in (0, 1]")
    runs: list[PlannedRun] = []
    skipped: list[str] = []
    for mode in modes:
        for strategy in strategies:
            base = {"federation.strategy": strategy, "secure.mode": mode}
            variants: list[tuple[str, dict[str, Any]]]
            sweep = protocol_spec(strategy).variants
            variants = (sweep(cfg, betas, memberships) if sweep is not None else None) or [(strategy, {})]
            for label, extra in variants:
                overrides = {**base, **extra}
                label = label if mode == "none" else f"{label} +{mode}"
                try:
                    load_config(cfg.preset, None, {**cfg.flat(), **overrides})
                except ConfigError as exc:
                    skipped.append(f"{label}: {exc}")
                    continue
                runs.append(PlannedRun(label, overrides))
    return runs, skipped


def _folder(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in label.replace("β=", "beta"))


def sweep(cfg: RunConfig, runs: Sequence[PlannedRun], *, progress: bool = True) -> list[dict[str, Any]]:
    """Every planned run, attacked, one after the other (progress lines with ETA on stderr)."""
    results = []
    started = time.perf_counter()
    out = Path(cfg.out)
    for i, run in enumerate(runs, start=1):
        run_cfg = load_config(cfg.preset, None, {**cfg.flat(), **run.overrides, "out": str(out / _folder(run.label))})
        result = run_attack(run_cfg)
        result["run"] = run.label
        result["overrides"] = run.overrides
        results.append(result)
        if progress:
            elapsed = time.perf_counter() - started
            eta = elapsed / i * (len(runs) - i)
            print(
                f"[{i}/{len(runs)}] {run.label}: relative error {result['relative_error_mean']:.4g} · "
                f"recovered {result['recovered_fraction_mean']:.4f} · {result['wall_s']:.0f} s · "
                f"elapsed {elapsed / 60:.1f} min · ETA {eta / 60:.1f} min",
                file=sys.stderr,
                flush=True,
            )
    return results


TABLE_NOTE = (
    f"relative error ||estimate - true|| / ||true|| and fraction of weights within {TOLERANCE:g}, mean over "
    "clients at the last exchange round; init err: the public initial model as the estimate"
)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'run':<40} {'server sees':<14} {'rel. error':>10} {'recovered':>9} {'init err':>8} "
        f"{'memberships':<24} {'wall s':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        source = r.get("memberships_source") or "-"
        lines.append(
            f"{r['run']:<40} {r['server_sees']:<14} {r['relative_error_mean']:>10.4f} "
            f"{r['recovered_fraction_mean']:>9.4f} {r['initial_error_mean']:>8.4f} {source:<24} "
            f"{r['wall_s']:>6.0f}"
        )
    return "\n".join(lines)


def write_json(path: str | Path, cfg: RunConfig, results: Sequence[dict[str, Any]], command: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "command": command,
        "setting": cfg.to_dict(),
        "tolerance": TOLERANCE,
        "headline": "mean over clients at the last exchange round",
        "runs": list(results),
    }
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False, allow_nan=True) + "\n", encoding="utf-8")


__all__ = [
    "ESTIMATORS",
    "Exchange",
    "RunRecorder",
    "attack",
    "format_table",
    "plan",
    "run_attack",
    "score",
    "sweep",
    "write_json",
]
