"""The honest-but-curious server's estimators, one per kind a protocol's spec names (``spec.estimator``; described
in the module docstring of :mod:`trustformer.attack.reconstruct`): its estimate of a client's trained model from
one payload, or from the aggregate under secure aggregation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trustformer.config import ConfigError, RunConfig
from trustformer.core.centroids import layer_matrix
from trustformer.core.dp import flatten, unflatten
from trustformer.protocols.interface.base import Tensors
from trustformer.registry import protocol_spec


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


__all__ = [
    "ESTIMATORS",
    "Centroids",
    "Estimator",
    "GlobalPlusUpdate",
    "NothingReceived",
    "WholeModel",
    "centroid_estimate",
    "estimator_of",
    "nearest_centroid",
]
