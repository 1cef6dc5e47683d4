import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.core.centroids import estimate_global_weights, layer_matrix, num_clusters


def slow_estimate(weights, labels, local, global_):
    """Algorithm 5 row by row, as written in the paper."""
    out = weights.clone()
    for i in range(weights.shape[0]):
        c = int(labels[i])
        for j in range(weights.shape[1]):
            out[i, j] = weights[i, j] + (global_[c, j] - local[c, j])
    return out


@settings(max_examples=30, deadline=None)
@given(r=st.integers(1, 20), f=st.integers(1, 6), k=st.integers(1, 8), seed=st.integers(0, 1000))
def test_estimate_global_weights_matches_row_by_row_reference(r, f, k, seed):
    g = torch.Generator().manual_seed(seed)
    k = min(k, r)
    w = torch.randn(r, f, generator=g)
    labels = torch.randint(0, k, (r,), generator=g)
    local = torch.randn(k, f, generator=g)
    global_ = torch.randn(k, f, generator=g)
    assert torch.allclose(estimate_global_weights(w, labels, local, global_), slow_estimate(w, labels, local, global_))


def test_estimate_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="differ in shape"):
        estimate_global_weights(
            torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), torch.zeros(2, 2), torch.zeros(3, 2)
        )
    with pytest.raises(ValueError, match="labels"):
        estimate_global_weights(
            torch.zeros(4, 2), torch.zeros(3, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 2)
        )


def test_num_clusters_is_eq_3():
    assert num_clusters(100, 0.29) == 29  # not 28 from 100 * 0.29 = 28.999...
    assert num_clusters(10, 1.0) == 10
    assert num_clusters(3, 0.1) == 1  # clamped to at least one cluster
    for r in (1, 7, 256, 4000):
        for beta in (0.05, 0.1, 0.25, 0.5, 0.9, 1.0):
            assert num_clusters(r, beta) == max(1, min(r, math.floor(r * beta + 1e-9)))
    with pytest.raises(ValueError):
        num_clusters(10, 0.0)


def test_layer_matrix_rows_are_the_first_dimension():
    assert layer_matrix(torch.zeros(7)).shape == (7, 1)  # biases and LayerNorm: r x 1, not skipped
    assert layer_matrix(torch.zeros(5, 3)).shape == (5, 3)
    assert layer_matrix(torch.zeros(4, 3, 2)).shape == (4, 6)
    t = torch.arange(24.0).reshape(4, 3, 2)
    assert torch.equal(layer_matrix(t)[1], t[1].reshape(-1))


def _sizes(labels, k):
    return torch.bincount(labels, minlength=k)


@settings(max_examples=40, deadline=None)
@given(
    r=st.integers(2, 60), f=st.integers(1, 5), m=st.integers(1, 4), beta=st.floats(0.01, 1.0), seed=st.integers(0, 99)
)
def test_partitions_respect_the_floor(r, f, m, beta, seed):
    from trustformer.core.centroids import balanced_partition, enforce_min_rows, random_partition

    k = num_clusters(r, min(beta, 1 / m), m)
    if k == 0:
        assert r < m
        return
    assert k * m <= r
    x = torch.randn(r, f, generator=torch.Generator().manual_seed(seed))
    for labels in (balanced_partition(x, k), random_partition(r, k, seed)):
        sizes = _sizes(labels, k)
        assert labels.shape == (r,) and int(sizes.min()) >= m and int(sizes.max()) - int(sizes.min()) <= 1
    # any memberships (here: random, with many tiny and empty clusters) are repaired to the floor
    raw = torch.randint(0, k, (r,), generator=torch.Generator().manual_seed(seed + 1)) ** 2 % k
    fixed = enforce_min_rows(x, raw, k, m)
    assert int(_sizes(fixed, k).min()) >= m
    kept = _sizes(raw, k) >= m  # clusters that met the floor keep all rows beyond those taken for the others
    assert all(int(((fixed == c) & (raw == c)).sum()) >= m for c in kept.nonzero()[:, 0].tolist())


def test_num_clusters_under_a_floor():
    assert num_clusters(100, 0.5, 2) == 50 and num_clusters(101, 0.5, 2) == 50
    assert num_clusters(10, 0.1, 2) == 1 and num_clusters(1, 0.5, 2) == 0  # a 1-row tensor never leaves
    assert num_clusters(7, 0.5, 3) == 2  # floor(7/3)
    assert num_clusters(100, 1.0, 1) == 100  # the paper's clamp when m = 1


def test_check_floor_names_the_option():
    from trustformer.core.centroids import FloorError, check_floor

    check_floor(torch.tensor([2, 3]), 2, "w")
    with pytest.raises(FloorError, match="min_cluster_rows = 2"):
        check_floor(torch.tensor([2, 1]), 2, "w")


def test_pack_flat_round_trips_and_rejects_wrong_lengths():
    from trustformer.wire import PayloadError, pack_flat, unpack_flat

    shapes = {"a": (3, 2), "b": (4, 1), "c": (1, 5)}
    tensors = [torch.randn(*s) for s in shapes.values()]
    flat = pack_flat(tensors)
    back = unpack_flat(flat, shapes)
    assert all(torch.equal(back[n], t) for n, t in zip(shapes, tensors, strict=True))
    for bad in (flat[:-1], torch.cat([flat, flat[:1]]), flat.reshape(1, -1)):
        with pytest.raises(PayloadError):
            unpack_flat(bad, shapes)
