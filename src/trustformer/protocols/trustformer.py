"""Trustformer (paper Algorithms 1–5): clients exchange per-layer centroids, never weights.

Client, after local training (Algorithm 2): for every trainable tensor, view it as an r×f matrix
(:func:`~trustformer.core.centroids.layer_matrix`), k = clamp(floor(r·β), 1, r) clusters of its rows;
send the k×f centroids, keep the memberships. Server (Algorithm 3): element-wise mean of centroid j
of layer l over the round's clients (uniform as in Eq. 2, or data-size weighted).
Client (Algorithms 4–5): ``W[i] += G[c(i)] − L[c(i)]``. With β = 1 every row is its own cluster and
the protocol is exactly FedAvg.

Cluster correspondence: averaging centroid j across clients is only meaningful if cluster j is the
same rows on every client. Two ways to get it (``federation.memberships``):

- ``"shared"`` (default): k-means runs once, on the identical initial model, from the same seeded
  rows on every client, so every client holds the same memberships; each exchange sends the means of
  the client's current rows over those clusters. Algorithm 5 is then a projection onto the consensus:
  ``W_i − W̄`` loses its cluster-mean component, so no client ever moves away from the FedAvg model
  (``tests/test_trustformer.py`` checks it), and at β = 0.5 the clusters are pairs of rows whose mean
  is averaged exactly.
- ``"local"``: the paper's Algorithm 2 as written — k-means of each client's own weights at every
  exchange, the first from the same seeded rows of the initial model (at most
  ``federation.kmeans_max_iter`` Lloyd iterations), later ones warm-started from the previous global
  centroids (which every client holds) for at most ``federation.kmeans_warm_max_iter`` (3); empty
  clusters keep their start. The clusters then follow each client's own drift, so centroid j covers
  different rows on different clients and the shift ``G[c] − L[c]`` is partly noise; the fewer
  iterations a warm start runs, the less the clusters drift apart.

Measured on the ``small`` preset (3 clients, 6 rounds, seed 0; FedAvg's final test loss 5.018 on every
client, no exchange ("local" strategy) 5.034 / 5.044 / 5.020), final test loss per client, mean
fedavg_distance after the last exchange, and ``cluster_s`` as a share of ``train_s``:

=====  ========================  =====  ===============================  =====  =====  ========================  =====  =====
β      shared                    dist.  local, warm ≤ 3 its (default)    dist.  clus.  local, warm ≤ 50 its      dist.  clus.
=====  ========================  =====  ===============================  =====  =====  ========================  =====  =====
0.1    5.035 / 5.043 / 5.019     0.134  5.074 / 5.070 / 5.044            0.125  0.7 %  5.170 / 5.102 / 5.076     0.137  1.2 %
0.5    5.025 / 5.025 / 5.022     0.079  5.075 / 5.064 / 5.063            0.114  1.1 %  5.109 / 5.069 / 5.065     0.117  3.1 %
0.9    5.018 / 5.020 / 5.018     0.032  5.036 / 5.043 / 5.037            0.108  1.2 %  5.043 / 5.040 / 5.045     0.112  6.0 %
=====  ========================  =====  ===============================  =====  =====  ========================  =====  =====

"local" memberships made the test loss *worse* than not exchanging at all at β ≤ 0.5 (capping the
warm k-means at 3 iterations narrowed that gap and cut its time 1.7–5×, but did not close it), and
on synthetic drift (random rows plus independent per-client noise) they moved clients *away* from
the FedAvg model at β ≤ 0.5; shared memberships track FedAvg and cost no k-means after the first
exchange (``cluster_s`` 0.1–0.3 % of the training time).

What the server can learn: in both modes it receives centroids only. With shared memberships it could
recompute the memberships (they follow from the public initial model and the seed), so it learns the
mean of known groups of ⌈1/β⌉ rows; with local memberships the rows behind centroid j are not given,
but the warm start ties centroid j to the region of initial row j, which the server also knows, so
that secrecy is weak too. Hiding each client's centroids from the server is the job of the secure
exchange (``--secure tee`` / ``secagg``), which works with either mode.

Also measured, not used: starting local k-means from the mean, now, of the rows that were in cluster
j at the last exchange (``init_labels`` of the k-means engine) gave lower inertia but moved clients
further from FedAvg (fedavg_distance after round 4 at β = 0.1: 0.158 against 0.109).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..config import RunConfig
from ..core.aggregation import weighted_mean
from ..core.centroids import estimate_global_weights, layer_matrix, num_clusters
from ..core.kmeans import choose_initial_rows, cluster_layers, lloyd_update
from ..wire import TensorSpec, spec_of
from ..workload import derive_seed
from .base import ClientSession, Tensors

LABELS, LOCAL, GLOBAL, INITIAL = "labels/", "local/", "global/", "initial/"


class Trustformer:
    name = "trustformer"
    exchanges = True

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.beta = cfg.federation.beta
        self.weighting = cfg.federation.weighting
        self.memberships = cfg.federation.memberships

    def initial_centroids(self, session: ClientSession, name: str, matrix: torch.Tensor) -> torch.Tensor:
        """Where layer ``name``'s k-means starts: the previous global centroids, else the same rows of
        the identical initial model on every client."""
        previous = session.protocol_state.get(GLOBAL + name)
        if previous is not None:
            return previous.to(matrix.dtype)
        k = num_clusters(matrix.shape[0], self.beta)
        rows = choose_initial_rows(matrix.shape[0], k, seed=derive_seed(self.cfg.seed, "init-rows", name))
        initial = layer_matrix(session.initial_tensors()[name])
        return initial.index_select(0, rows).clone()

    def client_payload(self, session: ClientSession) -> tuple[Tensors, dict[str, float]]:
        """Algorithm 2: cluster every trainable tensor; send centroids, keep memberships."""
        matrices = {n: layer_matrix(p.detach()) for n, p in session.model.named_parameters() if p.requires_grad}
        if self.memberships == "shared":
            return self._shared_payload(session, matrices)
        inits = {n: self.initial_centroids(session, n, m) for n, m in matrices.items()}
        fed = self.cfg.federation
        warm = any(GLOBAL + n in session.protocol_state for n in matrices)
        max_iter = min(fed.kmeans_max_iter, fed.kmeans_warm_max_iter) if warm else fed.kmeans_max_iter
        started = time.perf_counter()
        results = cluster_layers(
            matrices, inits, max_iter=max_iter, tol=fed.kmeans_tol,
            seed=derive_seed(self.cfg.seed, "kmeans", session.client, session.round),
        )
        cluster_s = time.perf_counter() - started
        payload: Tensors = {}
        for name, result in results.items():
            session.protocol_state[LABELS + name] = result.labels
            session.protocol_state[LOCAL + name] = result.centroids
            payload[name] = result.centroids
        iterations = [r.iterations for r in results.values()]
        return payload, {"cluster_s": cluster_s, "kmeans_iterations": sum(iterations) / max(len(iterations), 1)}

    def _shared_payload(self, session: ClientSession, matrices: dict[str, torch.Tensor]) -> tuple[Tensors, dict[str, float]]:
        """``memberships = "shared"``: cluster j is the same rows on every client — the k-means
        memberships of the identical initial model (computed once, the same on every client); each
        exchange sends the means of the client's current rows over those fixed clusters."""
        started = time.perf_counter()
        if not any(n.startswith(LABELS) for n in session.protocol_state):
            initial = {n: layer_matrix(t) for n, t in session.initial_tensors().items() if n in matrices}
            inits = {n: self.initial_centroids(session, n, m) for n, m in initial.items()}
            for name, result in cluster_layers(
                initial, inits, max_iter=self.cfg.federation.kmeans_max_iter, tol=self.cfg.federation.kmeans_tol,
                seed=derive_seed(self.cfg.seed, "kmeans-shared"),
            ).items():
                session.protocol_state[LABELS + name] = result.labels
                session.protocol_state[INITIAL + name] = result.centroids
        payload: Tensors = {}
        for name, x in matrices.items():
            state = session.protocol_state
            fallback = state.get(GLOBAL + name, state[INITIAL + name]).to(x.dtype)
            centroids = lloyd_update(x, state[LABELS + name], fallback)
            state[LOCAL + name] = centroids
            payload[name] = centroids
        return payload, {"cluster_s": time.perf_counter() - started, "kmeans_iterations": 0.0}

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """Per trainable tensor: its centroids, (clusters at β, columns of its layer matrix)."""
        out: TensorSpec = {}
        for name, tensor in initial.items():
            rows, cols = layer_matrix(tensor).shape
            out[name] = ((num_clusters(rows, self.beta), cols), spec_of({name: tensor})[name][1])
        return out

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return spec_of({n[len(LOCAL):]: t for n, t in session.protocol_state.items() if n.startswith(LOCAL)})

    def aggregate(self, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> tuple[Tensors, dict[str, float]]:
        """Algorithm 3 / Eq. 2: mean of centroid j of layer l over the clients (server sees centroids only)."""
        started = time.perf_counter()
        weights = [float(n) for n in num_examples] if self.weighting == "data_size" else [1.0] * len(payloads)
        mean = weighted_mean(payloads, weights)
        return mean, {"aggregate_s": time.perf_counter() - started}

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> dict[str, float]:
        """Algorithms 4–5: shift every row by its cluster's (global − local) centroid difference."""
        started = time.perf_counter()
        params = dict(session.model.named_parameters())
        with torch.no_grad():
            for name, global_centroids in aggregate.items():
                param = params[name]
                state = session.protocol_state
                moved = estimate_global_weights(
                    layer_matrix(param.detach()), state[LABELS + name], state[LOCAL + name], global_centroids
                )
                param.copy_(moved.reshape(param.shape))
                state[GLOBAL + name] = global_centroids
        return {"estimate_s": time.perf_counter() - started}
