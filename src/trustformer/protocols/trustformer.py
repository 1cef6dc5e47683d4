"""Trustformer (paper Algorithms 1–5): clients exchange per-layer centroids, never weights.

Client, after local training (Algorithm 2): view every trainable tensor as an r×f matrix
(:func:`~trustformer.core.centroids.layer_matrix`), put its rows in k clusters and send the k×f
cluster means; keep the memberships. Server (Algorithm 3): element-wise mean of centroid j of layer
l over the round's clients (uniform as in Eq. 2, or data-size weighted). Client (Algorithms 4–5):
``W[i] += G[c(i)] − L[c(i)]``.

Privacy floor (``trustformer.min_cluster_rows`` = m, default 2): no centroid that leaves a client is
the mean of fewer than m rows of its layer, in every membership mode, 1-D tensors included:
k = clamp(floor(r·β), 1, floor(r/m)), memberships that break the floor are repaired
(:func:`~trustformer.core.centroids.enforce_min_rows`), a tensor with fewer than m rows is never
sent (it stays local), and the client checks the floor on the centroids it is about to send and
refuses to send otherwise. β above 1/m is refused at config load. With m = 1 and β = 1 every row is
its own cluster and the protocol is exactly FedAvg.

Cluster correspondence (``trustformer.memberships``): averaging centroid j across clients only
means something if cluster j is the same rows on every client.

- ``"shared"``: k-means once on the identical initial model, from the same seeded rows on every
  client; later exchanges send the means of the current rows over those fixed clusters. Every
  exchange is then a projection onto the consensus in the same fixed subspace.
- ``"tracked"``: every client keeps a reference model it derives identically with no extra
  communication: the initial model, shifted at every exchange so that each cluster's mean is the
  global centroid received (``R[i] += G[c(i)] − mean_c(R)``). At every exchange after the first
  (``rotating``'s), memberships are k-means (≤ ``trustformer.kmeans_warm_max_iter`` Lloyd iterations,
  from rows seeded per round) of how far each row of R has moved from the initial model, so rows that
  moved alike are averaged together. (k-means of R itself, warm from the previous memberships, kept the
  previous memberships: R moves by one shift per cluster, which leaves them a fixed point.) A client
  that misses an aggregate (dropped from a round) falls out of step with the others.
- ``"rotating"``: a fresh uniformly random balanced partition of every layer's rows at every
  exchange, seeded from (``seed``, round, layer): over ⌈1/β⌉ exchanges about every direction of the
  layer is synchronised once, and no k-means runs at all.
- ``"focused"``: as ``rotating``, but the rows are split by how much they have moved: every client
  keeps ``tracked``'s reference model and a per-row running mean of its squared shifts; at each exchange
  half of the k clusters are random groups of exactly m of the rows that moved most, the other half
  random balanced groups of the rest, so that the rows
  where clients are expected to disagree most are averaged in the smallest groups. The first exchange
  is ``rotating``'s. Like ``tracked``, it needs every aggregate.
- ``"local"``: the paper's Algorithm 2 as written — k-means of each client's own trained weights at
  every exchange (the first from the same seeded rows of the initial model, ≤ ``kmeans_max_iter``
  iterations; later ones warm from the previous global centroids, ≤ ``kmeans_warm_max_iter``).
  Centroid j then covers different rows on different clients.

The payload is one flat float array: every exchanged layer's centroids in parameter order
(:func:`~trustformer.wire.pack_flat`), so framing costs one array header per message.

Rotating is the default because it keeps the most of FedAvg's gain. What limits every mode: memberships that all
clients compute alike without communicating cannot depend on their updates, so an exchange removes in expectation
a share k/r = β of disagreement spread over the rows, as much per round as FedAvg every 1/β rounds. The measured
comparison of the modes, with its command, is in docs/protocols.md ("Trustformer").

What the server can learn is measured by ``trustformer attack reconstruct`` and ``attack membership`` (docs/privacy.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..config import ConfigError, RunConfig
from ..config.checks import check_at_least, check_choice, check_in_range
from ..core.aggregation import weighted_mean
from ..core.centroids import (
    check_floor,
    cluster_means,
    enforce_min_rows,
    estimate_global_weights,
    layer_matrix,
    num_clusters,
    random_partition,
)
from ..core.kmeans import choose_initial_rows, cluster_layers
from ..core.shared import derive_seed
from ..wire import TensorSpec, pack_flat, unpack_flat
from .interface.base import Aggregated, ClientSession, FederatedProtocol, Phases, ServerStart, Tensors
from .interface.parts import PayloadCoding, ServerHooks
from .interface.spec import ProtocolSpec

LABELS, LOCAL, GLOBAL, REFERENCE, MOVED = "labels/", "local/", "global/", "reference/", "moved/"
PAYLOAD = "centroids"
MODES = ("shared", "tracked", "rotating", "focused", "local")
MOVED_DECAY = 0.5  # focused: weight of the older shifts in the per-row running mean


@dataclass(frozen=True)
class TrustformerConfig:
    """Trustformer (protocols/trustformer.py): ``[trustformer]``, ``--set trustformer.beta=0.5``."""

    beta: float = 0.5  # clusters per layer = clamp(floor(rows * beta), 1, floor(rows / min_cluster_rows))
    weighting: str = "uniform"  # centroid mean: uniform (paper Eq. 2) | data_size
    # cluster memberships (docs/protocols.md "Trustformer": the measured comparison):
    # "rotating" (default) = a random balanced partition per round, the same on every client; "focused" =
    # as rotating, the rows that moved most in the smallest groups; "tracked" = k-means of how far each
    # row of a reference every client derives has moved; "shared" = k-means once on the initial model;
    # "local" = k-means of each client's own weights at every exchange (the paper's Algorithm 2)
    memberships: str = "rotating"
    # privacy floor: no centroid leaving a client is the mean of fewer rows than this
    # (1 = the paper, where singleton clusters send rows verbatim); caps beta at 1 / min_cluster_rows
    min_cluster_rows: int = 2
    kmeans_max_iter: int = 50  # Lloyd iterations at most per layer (cold: round 1, or memberships=shared)
    # memberships=local, exchanges after the first (warm from the previous global centroids): at most
    # this many Lloyd iterations (≤ kmeans_max_iter; why 3: docs/benchmarks.md "Clustering: design measurements")
    kmeans_warm_max_iter: int = 3
    kmeans_tol: float = 1e-4  # Lloyd stops when the centroids move less than this (relative to the data's variance)

    def validate(self) -> None:
        check_in_range("trustformer.beta", self.beta, 0.0, 1.0, lo_open=True)
        check_choice("trustformer.weighting", self.weighting, ("uniform", "data_size"))
        check_choice("trustformer.memberships", self.memberships, MODES)
        check_at_least("trustformer.min_cluster_rows", self.min_cluster_rows, 1)
        check_at_least("trustformer.kmeans_max_iter", self.kmeans_max_iter, 1)
        check_at_least("trustformer.kmeans_warm_max_iter", self.kmeans_warm_max_iter, 1)
        check_at_least("trustformer.kmeans_tol", self.kmeans_tol, 0.0)


def check_config(cfg: RunConfig) -> None:
    """β against the privacy floor, and client sampling against memberships a left-out client cannot follow."""
    tf = cfg.section("trustformer")
    if tf.beta * tf.min_cluster_rows > 1.0 + 1e-9:
        raise ConfigError(
            f"trustformer.beta = {tf.beta} asks for more clusters than trustformer.min_cluster_rows = "
            f"{tf.min_cluster_rows} allows: every centroid must be the mean of at least "
            f"{tf.min_cluster_rows} rows, so beta ≤ 1/{tf.min_cluster_rows} = {1 / tf.min_cluster_rows:.3g}; "
            f"lower trustformer.beta, or set trustformer.min_cluster_rows = 1 to let rows leave verbatim "
            f"(beta = 1 is then exactly FedAvg)"
        )
    fed = cfg.federation
    if fed.payload_bits != 32 and fed.payload_rounding == "nearest" and tf.memberships != "shared":
        raise ConfigError(
            f"federation.payload_rounding = 'nearest' needs error feedback to make up for its bias, and "
            f"trustformer.memberships = {tf.memberships!r} regroups the rows at every exchange (no feedback is "
            "kept): set trustformer.memberships = 'shared' or federation.payload_rounding = 'stochastic'"
        )
    if cfg.federation.clients_per_round and tf.memberships in ("tracked", "focused"):
        raise ConfigError(
            f"federation.clients_per_round needs memberships every client can compute from the "
            f"seed alone: trustformer.memberships = {tf.memberships!r} follows a reference model "
            "built from every aggregate, which a client left out of a round never receives; use "
            "'rotating', 'shared' or 'local'"
        )


class Trustformer(FederatedProtocol, ServerHooks, PayloadCoding):
    spec = ProtocolSpec(
        name="trustformer",
        factory=lambda cfg: Trustformer(cfg),
        check=check_config,
        mean_weighting="examples",
        estimator="centroids",
        variants=lambda cfg, betas, memberships: [
            (f"trustformer β={b:g} {m}", {"trustformer.beta": b, "trustformer.memberships": m})
            for b in (betas or [cfg.section("trustformer").beta])
            for m in (memberships or [cfg.section("trustformer").memberships])
        ],
        run_fields=lambda cfg: {
            "beta": cfg.section("trustformer").beta,
            "memberships": cfg.section("trustformer").memberships,
        },
        section=TrustformerConfig,
        renamed={f"federation.{f}": f for f in TrustformerConfig.__dataclass_fields__},
        summary="clients send per-layer k-means centroids; rows shift by (global - local) centroid",
    )

    # server, payload coding: the public reference model every party derives from the aggregates (advance_public)
    state_attrs = ("public",)
    start_attrs = ("_initial",)  # the initial model (server_begin)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        fed, tf = cfg.federation, cfg.section("trustformer")
        self.settings = tf
        self.beta = tf.beta
        self.min_rows = tf.min_cluster_rows
        self.weighting = tf.weighting
        self.memberships = tf.memberships
        self.spec = replace(
            self.spec,
            mean_weighting="examples" if tf.weighting == "data_size" else "uniform",
        )
        # payload coding: every party keeps the consensus reference model its reference centroids come from
        coded = fed.payload_bits != 32 or fed.download_bits != 32
        self.keeps_reference = coded and tf.memberships != "local"
        self.public: Tensors = {}  # server, payload coding: the public state (reference model, memberships)
        self._initial: Tensors = {}

    def server_begin(self, start: ServerStart) -> None:
        self._initial = start.initial

    def server_summary(self) -> dict[str, float]:
        return {"beta": self.beta}

    # ------------------------------------------------------------------ layout
    def clusters(self, initial: Tensors) -> dict[str, tuple[int, int]]:
        """(k, f) of every tensor that is exchanged, in parameter order; tensors with fewer rows than
        the floor are not exchanged."""
        out = {}
        for name, tensor in initial.items():
            rows, cols = layer_matrix(tensor).shape
            k = num_clusters(rows, self.beta, self.min_rows)
            if k:
                out[name] = (k, cols)
        return out

    def unpack_payload(self, payload: Tensors, initial: Tensors) -> Tensors:
        """The flat payload as {layer: k×f centroids}."""
        return unpack_flat(payload[PAYLOAD], self.clusters(initial))

    def expected_payload(self, initial: Tensors) -> TensorSpec:
        """One flat array: Σ k·f values over the exchanged tensors, in the parameters' dtype."""
        total = sum(k * f for k, f in self.clusters(initial).values())
        dtype = str(torch.empty(0, dtype=next(iter(initial.values())).dtype).numpy().dtype)
        return {PAYLOAD: ((total,), dtype)}

    def payload_spec(self, session: ClientSession) -> TensorSpec:
        return self.expected_payload(session.initial_tensors())

    # ------------------------------------------------------------------ memberships
    def _kmeans(self, matrices: dict[str, torch.Tensor], inits, max_iter: int, seed: int, init_labels=None):
        results = cluster_layers(
            matrices, inits, max_iter=max_iter, tol=self.settings.kmeans_tol, seed=seed, init_labels=init_labels
        )
        labels = {
            n: enforce_min_rows(matrices[n], r.labels, inits[n].shape[0], self.min_rows) for n, r in results.items()
        }
        return labels, [r.iterations for r in results.values()]

    def _seeded_rows(self, initial: dict[str, torch.Tensor], k: dict[str, int]) -> dict[str, torch.Tensor]:
        """The same seeded rows of the identical initial model on every client: k-means' cold start."""
        return {
            n: m.index_select(0, choose_initial_rows(m.shape[0], k[n], derive_seed(self.cfg.seed, "init-rows", n)))
            for n, m in initial.items()
        }

    def shared_labels(self, initial: Tensors) -> tuple[dict[str, torch.Tensor], list[int]]:
        """``shared``: k-means of the identical initial model."""
        layout = self.clusters(initial)
        mats = {n: layer_matrix(initial[n]).detach() for n in layout}
        inits = self._seeded_rows(mats, {n: k for n, (k, _) in layout.items()})
        return self._kmeans(mats, inits, self.settings.kmeans_max_iter, derive_seed(self.cfg.seed, "kmeans-shared"))

    def rotating_labels(
        self, layout: dict[str, tuple[int, int]], rows: dict[str, int], rnd: int
    ) -> dict[str, torch.Tensor]:
        """``rotating``: a balanced random partition per layer and round."""
        return {
            n: random_partition(rows[n], k, derive_seed(self.cfg.seed, "rotate", n, rnd))
            for n, (k, _) in layout.items()
        }

    def tracked_labels(
        self, layout: dict[str, tuple[int, int]], movement: dict[str, torch.Tensor], rnd: int
    ) -> tuple[dict[str, torch.Tensor], list[int]]:
        """``tracked``: k-means of how far each row of the shared reference has moved from the initial
        model, from rows seeded per round (≤ kmeans_warm_max_iter Lloyd iterations)."""
        inits = {
            n: x.index_select(
                0, choose_initial_rows(x.shape[0], layout[n][0], derive_seed(self.cfg.seed, "track", n, rnd))
            )
            for n, x in movement.items()
        }
        fed = self.settings
        return self._kmeans(
            movement,
            inits,
            min(fed.kmeans_max_iter, fed.kmeans_warm_max_iter),
            derive_seed(self.cfg.seed, "kmeans-tracked", rnd),
        )

    def focused_labels(
        self, layout: dict[str, tuple[int, int]], moved: dict[str, torch.Tensor], rnd: int
    ) -> dict[str, torch.Tensor]:
        """``focused``: half the clusters are random groups of m among the rows that moved most."""
        out = {}
        for name, (k, _f) in layout.items():
            r = moved[name].numel()
            loud_clusters = k // 2 if (r - (k // 2) * self.min_rows) >= (k - k // 2) * self.min_rows else 0
            order = torch.argsort(moved[name], descending=True, stable=True)
            n_loud = loud_clusters * self.min_rows
            labels = torch.empty(r, dtype=torch.int64)
            seed = derive_seed(self.cfg.seed, "focus", name, rnd)
            if loud_clusters:
                labels[order[:n_loud]] = random_partition(n_loud, loud_clusters, seed)
            labels[order[n_loud:]] = loud_clusters + random_partition(r - n_loud, k - loud_clusters, seed + 1)
            out[name] = labels
        return out

    def public_labels(self, initial: Tensors, public: Tensors, rnd: int) -> tuple[dict[str, torch.Tensor], list[int]]:
        """The memberships of the exchange of round ``rnd`` in every mode but ``local``, from public
        information only: the identical initial model and ``public`` (what :meth:`advance_public`
        derived from the earlier aggregates). Clients and the server run this same function."""
        layout = self.clusters(initial)
        rows = {n: layer_matrix(initial[n]).shape[0] for n in layout}
        none = [0] * len(layout)
        first = not all(REFERENCE + n in public for n in layout)
        if self.memberships == "shared":
            if all(LABELS + n in public for n in layout):
                return {n: public[LABELS + n] for n in layout}, none
            return self.shared_labels(initial)
        if self.memberships == "rotating" or first:
            return self.rotating_labels(layout, rows, rnd), none
        if self.memberships == "focused":
            return self.focused_labels(layout, {n: public[MOVED + n] for n in layout}, rnd), none
        movement = {n: public[REFERENCE + n] - layer_matrix(initial[n]).to(public[REFERENCE + n].dtype) for n in layout}
        return self.tracked_labels(layout, movement, rnd)

    def advance_public(
        self,
        initial: Tensors,
        public: Tensors,
        labels: dict[str, torch.Tensor],
        global_centroids: dict[str, torch.Tensor],
    ) -> None:
        """After an exchange, in place: the shared reference model shifted so that each cluster's mean
        is the global centroid (``R[i] += G[c(i)] − mean_c(R)``), the per-row running mean of its
        squared shifts (``focused``), and the memberships (``shared``)."""
        for name, glob in global_centroids.items():
            public[LABELS + name] = labels[name]
            if self.memberships not in ("tracked", "focused") and not self.keeps_reference:
                continue
            before = public.get(REFERENCE + name)
            if before is None:
                before = layer_matrix(initial[name]).detach().clone()
            means, _ = cluster_means(before, labels[name], glob.shape[0])
            after = estimate_global_weights(before, labels[name], means, glob.to(before.dtype))
            public[REFERENCE + name] = after
            step = (after - before).pow(2).sum(1)
            moved = public.get(MOVED + name)
            public[MOVED + name] = step if moved is None else MOVED_DECAY * moved + (1 - MOVED_DECAY) * step

    def _labels(
        self, session: ClientSession, matrices: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], list[int]]:
        state = session.protocol_state
        if self.memberships != "local":
            return self.public_labels(session.initial_tensors(), state, session.round)
        # local: the paper's Algorithm 2 on the client's own trained weights
        layout = self.clusters(session.initial_tensors())
        fed = self.settings
        warm = all(GLOBAL + n in state for n in matrices)
        if warm:
            inits = {n: state[GLOBAL + n].to(matrices[n].dtype) for n in matrices}
        else:
            initial = {n: layer_matrix(t).detach() for n, t in session.initial_tensors().items() if n in matrices}
            inits = self._seeded_rows(initial, {n: k for n, (k, _) in layout.items()})
        max_iter = min(fed.kmeans_max_iter, fed.kmeans_warm_max_iter) if warm else fed.kmeans_max_iter
        return self._kmeans(
            matrices, inits, max_iter, derive_seed(self.cfg.seed, "kmeans", session.client, session.round)
        )

    def server_labels(
        self, initial: Tensors, history: Sequence[tuple[int, Tensors]], rnd: int
    ) -> dict[str, torch.Tensor] | None:
        """The memberships every client uses at the exchange of round ``rnd``, as the server derives
        them from public information only: the run config, the identical initial model and the
        aggregates it sent before (``history``: (round, flat aggregate), oldest first). None in mode
        ``local``, whose memberships depend on each client's private weights."""
        if self.memberships == "local":
            return None
        layout = self.clusters(initial)
        public: Tensors = {}
        for past, aggregate in history:
            labels, _ = self.public_labels(initial, public, past)
            self.advance_public(initial, public, labels, unpack_flat(aggregate[PAYLOAD], layout))
        return self.public_labels(initial, public, rnd)[0]

    # ------------------------------------------------------------------ the three steps
    def client_payload(self, session: ClientSession) -> tuple[Tensors, Phases]:
        """Algorithm 2: memberships of every exchanged tensor's rows, then the cluster means, each of
        at least ``min_cluster_rows`` rows (checked here, before anything is sent)."""
        layout = self.clusters(session.initial_tensors())
        params = dict(session.model.named_parameters())
        matrices = {n: layer_matrix(params[n].detach()) for n in layout}
        started = time.perf_counter()
        labels, iterations = self._labels(session, matrices)
        memberships_s = time.perf_counter() - started
        state = session.protocol_state
        centroids = []
        for name, x in matrices.items():
            k = layout[name][0]
            means, counts = cluster_means(x, labels[name], k)
            check_floor(counts, self.min_rows, name)
            state[LABELS + name] = labels[name]
            state[LOCAL + name] = means
            centroids.append(means)
        payload = {PAYLOAD: pack_flat(centroids)}
        return payload, {
            "cluster_s": time.perf_counter() - started,  # memberships + centroid means (the paper's Table IV column)
            "memberships_s": memberships_s,
            "kmeans_iterations": sum(iterations) / max(len(iterations), 1),  # Lloyd iterations run this exchange
            # fewer rows than min_cluster_rows: never sent
            "tensors_kept_local": float(len(session.initial_tensors()) - len(layout)),
        }

    def aggregate(self, rnd: int, payloads: Sequence[Tensors], num_examples: Sequence[int]) -> Aggregated:
        """Algorithm 3 / Eq. 2: mean of centroid j of layer l over the clients (server sees centroids only)."""
        started = time.perf_counter()
        weights = [float(n) for n in num_examples] if self.weighting == "data_size" else [1.0] * len(payloads)
        mean = weighted_mean(payloads, weights)
        return Aggregated(mean, {"aggregate_s": time.perf_counter() - started})

    def exchange_done(self, rnd: int, delivered: Tensors | None) -> dict[str, float | None]:
        """Payload coding: the server advances the public reference with the centroids the clients received, as
        every client does in ``client_apply``."""
        if self.keeps_reference and delivered is not None:
            labels, _ = self.public_labels(self._initial, self.public, rnd)
            self.advance_public(self._initial, self.public, labels, self.unpack_payload(delivered, self._initial))
        return {}

    # ------------------------------------------------------------------ payload coding (protocols/wrappers/coding.py)
    def coding_view(self, payload: Tensors, initial: Tensors) -> tuple[Tensors, Tensors]:
        """The centroids as one k×f matrix per layer (one coding grid per centroid); nothing else is sent."""
        return self.unpack_payload(payload, initial), {n: t for n, t in payload.items() if n != PAYLOAD}

    def coding_unview(self, view: Tensors, rest: Tensors, initial: Tensors) -> Tensors:
        return {**rest, PAYLOAD: pack_flat([view[n] for n in self.clusters(initial)])}

    def _reference_centroids(self, initial: Tensors, public: Tensors, labels: dict[str, torch.Tensor]) -> Tensors:
        """The means of the consensus reference model over this exchange's clusters: what every party holds."""
        out = {}
        for name, (k, _f) in self.clusters(initial).items():
            reference = public.get(REFERENCE + name)
            matrix = layer_matrix(initial[name]).detach() if reference is None else reference
            out[name] = cluster_means(matrix.double(), labels[name], k)[0].float()
        return out

    def payload_reference(self, session: ClientSession) -> Tensors | None:
        if not self.keeps_reference:
            return None  # local memberships: the server cannot know the clusters
        state = session.protocol_state
        initial = session.initial_tensors()
        return self._reference_centroids(initial, state, {n: state[LABELS + n] for n in self.clusters(initial)})

    def server_payload_reference(self, rnd: int) -> Tensors | None:
        if not self.keeps_reference:
            return None
        labels, _ = self.public_labels(self._initial, self.public, rnd)
        return self._reference_centroids(self._initial, self.public, labels)

    def stable_payload_layout(self) -> bool:
        return self.memberships == "shared"  # every other mode regroups the rows at every exchange

    def client_apply(self, session: ClientSession, aggregate: Tensors) -> Phases:
        """Algorithms 4–5: shift every row by its cluster's (global − local) centroid difference."""
        started = time.perf_counter()
        params = dict(session.model.named_parameters())
        state = session.protocol_state
        initial = session.initial_tensors()
        glob = self.unpack_payload(aggregate, initial)
        labels = {n: state[LABELS + n] for n in glob}
        with torch.no_grad():
            for name, global_centroids in glob.items():
                param = params[name]
                moved = estimate_global_weights(
                    layer_matrix(param.detach()), labels[name], state[LOCAL + name], global_centroids
                )
                param.copy_(moved.reshape(param.shape))
                state[GLOBAL + name] = global_centroids
        if self.memberships != "local":
            self.advance_public(initial, state, labels, glob)
        return {"estimate_s": time.perf_counter() - started}


SPEC = Trustformer.spec
