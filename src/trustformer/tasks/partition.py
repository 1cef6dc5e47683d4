"""How a training set is divided among clients: IID, FedPC's class-stratified imbalanced split, Dirichlet.

All three return, for ``n`` clients, ``n`` disjoint sorted index arrays into the training set, and
are deterministic for a seed.

- ``iid``: a seeded permutation cut into ``n`` shards of equal size (±1).
- ``stratified`` (FedPC, Section 5.2.2, Figures 2-3): "We first randomly generate the percentage
  values, each corresponding to the data percentage that each worker will process. The percentage
  values sum to 100 … [they] are then used to distribute the samples of each class … to various
  workers", with "the range of random variables" controlled "to avoid the extreme imbalance
  scenarios". Here the shares are ``p_k = lo + (1 − n·lo)·d_k`` with ``d ~ Dirichlet(1, …, 1)``
  (uniform on the simplex) and ``lo = min_fraction / n``, redrawn while some ``p_k`` exceeds
  ``max_fraction / n``; every class is then cut in the same proportions (largest-remainder rounding),
  so shard sizes differ while each shard has the global class mix. Implemented as a flwr-datasets
  :class:`~flwr_datasets.partitioner.Partitioner` (:class:`ClassStratifiedPartitioner`).
- ``dirichlet`` (label skew, FedPC Section 5.2.3, Figure 5): flwr-datasets'
  :class:`~flwr_datasets.partitioner.DirichletPartitioner` — for every class, the proportions going
  to each client are drawn from ``Dirichlet(alpha)``; small ``alpha`` gives clients few classes.

Data without classes (segmentation) is split over units (patients, or slices) with ``labels=None``:
``stratified`` then uses a single class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import TrustformerError

SCHEMES = ("iid", "stratified", "dirichlet")


class PartitionError(TrustformerError, ValueError):
    """A partition cannot be made as asked (bad parameter, too few examples)."""


def _check_common(n_items: int, n_clients: int) -> None:
    if not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise PartitionError(f"n_clients must be a positive integer; got {n_clients!r}")
    if n_items < n_clients:
        raise PartitionError(f"cannot split {n_items} examples among n_clients={n_clients}")


def iid_partition(n_items: int, n_clients: int, *, seed: int) -> list[np.ndarray]:
    """Equal random shards (sizes differ by at most one): a seeded permutation cut in ``n_clients``."""
    _check_common(n_items, n_clients)
    order = np.random.default_rng(seed).permutation(n_items)
    return [np.sort(part) for part in np.array_split(order, n_clients)]


def imbalanced_shares(
    n_clients: int, *, seed: int, min_fraction: float = 0.5, max_fraction: float = 2.0, max_tries: int = 10_000
) -> np.ndarray:
    """FedPC's random client shares (Section 5.2.2), each within ``[min_fraction/n, max_fraction/n]``.

    ``p = lo + (1 − n·lo)·d``, ``d ~ Dirichlet(1…1)``, ``lo = min_fraction/n``; redrawn while a share
    exceeds ``max_fraction/n``. ``min_fraction = max_fraction = 1`` gives equal shares.
    """
    if not 0.0 <= min_fraction <= 1.0:
        raise PartitionError(f"min_fraction must be in [0, 1] (a fraction of the equal share 1/n); got {min_fraction}")
    if max_fraction < 1.0:
        raise PartitionError(f"max_fraction must be ≥ 1 (a multiple of the equal share 1/n); got {max_fraction}")
    if not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise PartitionError(f"n_clients must be a positive integer; got {n_clients!r}")
    n = int(n_clients)
    lo, hi = min_fraction / n, max_fraction / n
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        shares = lo + (1.0 - n * lo) * rng.dirichlet(np.ones(n))
        if shares.max() <= hi + 1e-12:
            return shares
    raise PartitionError(
        f"no shares within [{lo:.4f}, {hi:.4f}] after {max_tries} draws: raise max_fraction ({max_fraction}) "
        f"or min_fraction ({min_fraction})"
    )


def _largest_remainder(count: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``count`` closest to ``count·shares`` (Hamilton's method)."""
    exact = count * shares
    counts = np.floor(exact).astype(np.int64)
    remainder = count - int(counts.sum())
    if remainder:
        order = np.argsort(-(exact - counts), kind="stable")
        counts[order[:remainder]] += 1
    return counts


def stratified_partition(
    labels: np.ndarray | None,
    n_clients: int,
    *,
    seed: int,
    min_fraction: float = 0.5,
    max_fraction: float = 2.0,
    n_items: int | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """FedPC's class-stratified imbalanced split; returns (shards, shares)."""
    if labels is None:
        if n_items is None:
            raise PartitionError("stratified_partition needs labels or n_items")
        labels = np.zeros(n_items, dtype=np.int64)
    labels = np.asarray(labels)
    _check_common(len(labels), n_clients)
    shares = imbalanced_shares(n_clients, seed=seed, min_fraction=min_fraction, max_fraction=max_fraction)
    rng = np.random.default_rng([seed, 1])
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        bounds = np.concatenate([[0], np.cumsum(_largest_remainder(len(members), shares))])
        for k in range(n_clients):
            parts[k].append(members[bounds[k] : bounds[k + 1]])
    shards = [np.sort(np.concatenate(p)) for p in parts]
    if any(len(s) == 0 for s in shards):
        raise PartitionError(f"a client got no example: {len(labels)} examples are too few for {n_clients} clients")
    return shards, shares


def _label_dataset(labels: np.ndarray, column: str):
    from datasets import Dataset

    return Dataset.from_dict({column: np.asarray(labels).astype(np.int64), "index": np.arange(len(labels))})


def _make_partitioner_class():
    from flwr_datasets.partitioner import Partitioner

    class ClassStratifiedPartitioner(Partitioner):
        """FedPC's split (Section 5.2.2) as a flwr-datasets partitioner over ``partition_by``."""

        def __init__(
            self,
            num_partitions: int,
            partition_by: str,
            *,
            seed: int = 0,
            min_fraction: float = 0.5,
            max_fraction: float = 2.0,
        ) -> None:
            super().__init__()
            if num_partitions < 1:
                raise PartitionError(f"num_partitions must be ≥ 1; got {num_partitions}")
            self._num_partitions = int(num_partitions)
            self._partition_by = partition_by
            self._seed, self._min_fraction, self._max_fraction = seed, min_fraction, max_fraction
            self._indices: list[np.ndarray] | None = None
            self.shares: np.ndarray | None = None

        @property
        def num_partitions(self) -> int:
            return self._num_partitions

        def partition_indices(self) -> list[np.ndarray]:
            if self._indices is None:
                labels = np.asarray(self.dataset[self._partition_by])
                self._indices, self.shares = stratified_partition(
                    labels,
                    self._num_partitions,
                    seed=self._seed,
                    min_fraction=self._min_fraction,
                    max_fraction=self._max_fraction,
                )
            return self._indices

        def load_partition(self, partition_id: int):
            if not 0 <= partition_id < self._num_partitions:
                raise PartitionError(f"partition_id {partition_id} out of range 0..{self._num_partitions - 1}")
            return self.dataset.select(self.partition_indices()[partition_id])

    return ClassStratifiedPartitioner


def class_stratified_partitioner(num_partitions: int, partition_by: str = "label", **kwargs):
    """A :class:`ClassStratifiedPartitioner` (flwr-datasets ``Partitioner`` subclass) for FedPC's split."""
    return _make_partitioner_class()(num_partitions, partition_by, **kwargs)


def dirichlet_partition(
    labels: np.ndarray,
    n_clients: int,
    *,
    alpha: float,
    seed: int,
    min_partition_size: int = 10,
    self_balancing: bool = False,
) -> list[np.ndarray]:
    """Label-skewed shards from flwr-datasets' ``DirichletPartitioner`` over a ``datasets.Dataset``.

    For each class, ``Dirichlet(alpha)`` proportions decide how its examples go to the clients; the
    draw is repeated (by flwr-datasets) until every client holds ``min_partition_size`` examples.
    """
    if not (isinstance(alpha, (int, float)) and np.isfinite(alpha) and alpha > 0):
        raise PartitionError(f"alpha must be a positive number; got {alpha!r}")
    labels = np.asarray(labels)
    _check_common(len(labels), n_clients)
    if min_partition_size < 0:
        raise PartitionError(f"min_partition_size must be ≥ 0; got {min_partition_size}")
    from flwr_datasets.partitioner import DirichletPartitioner

    partitioner = DirichletPartitioner(
        num_partitions=int(n_clients),
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=int(min_partition_size),
        self_balancing=self_balancing,
        shuffle=True,
        seed=int(seed),
    )
    partitioner.dataset = _label_dataset(labels, "label")
    try:
        shards = [np.sort(np.asarray(partitioner.load_partition(k)["index"], dtype=np.int64)) for k in range(n_clients)]
    except ValueError as exc:
        raise PartitionError(
            f"Dirichlet split (alpha={alpha}) failed for {len(labels)} examples and {n_clients} clients: {exc}"
        ) from exc
    return shards


def partition(
    scheme: str,
    n_clients: int,
    *,
    seed: int,
    labels: Sequence[int] | np.ndarray | None = None,
    n_items: int | None = None,
    alpha: float = 0.5,
    min_fraction: float = 0.5,
    max_fraction: float = 2.0,
    min_partition_size: int = 10,
) -> list[np.ndarray]:
    """Client shards (sorted index arrays) under ``scheme`` = ``iid`` | ``stratified`` | ``dirichlet``."""
    if scheme not in SCHEMES:
        raise PartitionError(f"partition must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    if labels is not None:
        labels = np.asarray(labels)
        if labels.ndim != 1:
            raise PartitionError(f"labels must be one-dimensional; got shape {labels.shape}")
        n_items = len(labels)
    if n_items is None:
        raise PartitionError("partition needs labels or n_items")
    if scheme == "iid":
        return iid_partition(n_items, n_clients, seed=seed)
    if scheme == "stratified":
        return stratified_partition(
            labels, n_clients, seed=seed, min_fraction=min_fraction, max_fraction=max_fraction, n_items=n_items
        )[0]
    if labels is None:
        raise PartitionError("partition 'dirichlet' skews labels: it needs class labels (not for segmentation)")
    return dirichlet_partition(labels, n_clients, alpha=alpha, seed=seed, min_partition_size=min_partition_size)


def class_counts(labels: np.ndarray, shards: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """``n_clients × num_classes`` matrix of examples per client and class (for plots and the summary)."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[s], minlength=num_classes) for s in shards])


__all__ = [
    "PartitionError",
    "SCHEMES",
    "class_counts",
    "class_stratified_partitioner",
    "dirichlet_partition",
    "iid_partition",
    "imbalanced_shares",
    "partition",
    "stratified_partition",
]
