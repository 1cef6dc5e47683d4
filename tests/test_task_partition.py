"""Client partitions: IID, FedPC's class-stratified imbalanced split, Dirichlet label skew."""

from __future__ import annotations

import numpy as np
import pytest

from trustformer.tasks import partition as P
from trustformer.tasks.partition import PartitionError

LABELS = np.repeat(np.arange(10), 100)[np.random.default_rng(0).permutation(1000)]


def assert_disjoint_cover(shards, n):
    joined = np.concatenate(shards)
    assert len(joined) == n and len(np.unique(joined)) == n  # every example exactly once
    for s in shards:
        assert np.all(np.diff(s) > 0)  # sorted, no duplicates


def test_iid_equal_disjoint_deterministic():
    shards = P.partition("iid", 3, seed=5, labels=LABELS)
    assert_disjoint_cover(shards, 1000)
    assert sorted(len(s) for s in shards) == [333, 333, 334]
    again = P.partition("iid", 3, seed=5, labels=LABELS)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    other = P.partition("iid", 3, seed=6, labels=LABELS)
    assert not np.array_equal(shards[0], other[0])


def test_imbalanced_shares_bounded_and_seeded():
    for seed in range(20):
        shares = P.imbalanced_shares(10, seed=seed, min_fraction=0.5, max_fraction=2.0)
        assert shares.sum() == pytest.approx(1.0)
        assert shares.min() >= 0.05 - 1e-12 and shares.max() <= 0.2 + 1e-12
    assert np.array_equal(P.imbalanced_shares(4, seed=1), P.imbalanced_shares(4, seed=1))
    shares = P.imbalanced_shares(3, seed=0)
    assert shares.max() - shares.min() > 0.01  # sizes really differ
    assert np.allclose(P.imbalanced_shares(3, seed=0, min_fraction=1.0, max_fraction=1.0), 1 / 3)


def test_stratified_divides_every_class_in_the_same_proportions():
    shards, shares = P.stratified_partition(LABELS, 4, seed=2)
    assert_disjoint_cover(shards, 1000)
    counts = P.class_counts(LABELS, shards, 10)  # 4 × 10
    for k in range(4):
        # each class (100 examples) is cut by the same shares, up to rounding
        assert np.all(np.abs(counts[k] - 100 * shares[k]) < 1.0)
        assert len(shards[k]) == pytest.approx(1000 * shares[k], abs=10)
    # within a shard the classes are balanced (as the full set): FedPC, Figure 2
    assert np.all(counts.max(axis=1) - counts.min(axis=1) <= 1)


def test_stratified_as_flwr_partitioner():
    from datasets import Dataset

    ds = Dataset.from_dict({"label": LABELS.tolist(), "x": list(range(1000))})
    partitioner = P.class_stratified_partitioner(3, "label", seed=4)
    partitioner.dataset = ds
    parts = [partitioner.load_partition(k) for k in range(3)]
    assert sum(len(p) for p in parts) == 1000
    direct, shares = P.stratified_partition(LABELS, 3, seed=4)
    assert parts[1]["x"] == direct[1].tolist()
    assert np.allclose(partitioner.shares, shares)
    with pytest.raises(PartitionError, match="partition_id 3"):
        partitioner.load_partition(3)


def test_dirichlet_uses_flwr_datasets_and_skews_labels():
    shards = P.partition("dirichlet", 5, seed=0, labels=LABELS, alpha=0.1)
    assert_disjoint_cover(shards, 1000)
    counts = P.class_counts(LABELS, shards, 10)
    # small alpha: most of a client's examples come from few classes
    top2 = np.sort(counts, axis=1)[:, -2:].sum(1) / counts.sum(1)
    assert top2.mean() > 0.5
    again = P.partition("dirichlet", 5, seed=0, labels=LABELS, alpha=0.1)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    # large alpha approaches the global mix
    wide = P.class_counts(LABELS, P.partition("dirichlet", 3, seed=0, labels=LABELS, alpha=1000.0), 10)
    frac = wide / wide.sum(1, keepdims=True)
    assert np.abs(frac - 0.1).max() < 0.05


def test_unlabelled_units_and_errors():
    shards = P.partition("stratified", 3, seed=0, n_items=30)
    assert_disjoint_cover(shards, 30)
    with pytest.raises(PartitionError, match="partition must be one of"):
        P.partition("shards", 3, seed=0, labels=LABELS)
    with pytest.raises(PartitionError, match="alpha must be a positive number"):
        P.partition("dirichlet", 3, seed=0, labels=LABELS, alpha=0)
    with pytest.raises(PartitionError, match="needs class labels"):
        P.partition("dirichlet", 3, seed=0, n_items=30)
    with pytest.raises(PartitionError, match="n_clients=5"):
        P.partition("iid", 5, seed=0, n_items=4)
    with pytest.raises(PartitionError, match="min_fraction"):
        P.imbalanced_shares(3, seed=0, min_fraction=1.5)
    with pytest.raises(PartitionError, match="max_fraction"):
        P.imbalanced_shares(3, seed=0, max_fraction=0.5)
