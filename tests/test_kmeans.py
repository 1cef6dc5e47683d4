"""Clustering engine (trustformer.core.kmeans): Lloyd against a plain reference, 1-D optimality,
alignment to init, chunking, memory sizing, warm starts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustformer.core import kmeans as km
from trustformer.core import kmeans_lloyd
from trustformer.core.kmeans import (
    KMeansResult,
    block_shape,
    choose_initial_rows,
    cluster_layers,
    iteration_memory_bytes,
    kmeans,
    lloyd_assign,
)
from trustformer.core.kmeans_1d import kmeans_1d

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FAST = settings(max_examples=40, deadline=None)


def reference_lloyd(x: np.ndarray, init: np.ndarray, max_iter: int = 500) -> tuple[np.ndarray, np.ndarray, int]:
    """Textbook Lloyd: full distance matrix, argmin (first), means, empty cluster keeps its init row;
    stops when no label changes."""
    c = init.copy()
    prev = None
    for it in range(1, max_iter + 1):
        d = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        labels = d.argmin(1)
        new = init.copy()
        for j in range(c.shape[0]):
            members = x[labels == j]
            if len(members):
                new[j] = members.mean(0)
        c = new
        if prev is not None and np.array_equal(labels, prev):
            return labels, c, it
        prev = labels
    return labels, c, max_iter


def blobs(n_per: int, centers: int, f: int, seed: int, spread: float = 0.05) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(centers, f, generator=g, dtype=torch.float64) * 3
    x = mu.repeat_interleave(n_per, 0) + spread * torch.randn(centers * n_per, f, generator=g, dtype=torch.float64)
    return x[torch.randperm(x.shape[0], generator=g)]


def brute_1d(values: np.ndarray, k: int) -> float:
    """Optimal 1-D inertia by trying every split of the sorted values into k contiguous groups."""
    s = np.sort(values)
    best = np.inf
    for cuts in itertools.combinations(range(1, len(s)), k - 1):
        bounds = (0,) + cuts + (len(s),)
        best = min(best, sum(((s[a:b] - s[a:b].mean()) ** 2).sum() for a, b in zip(bounds, bounds[1:], strict=False)))
    return float(best)


# ----------------------------------------------------------------------------------- Lloyd


@FAST
@given(seed=st.integers(0, 10_000), r=st.integers(3, 40), f=st.integers(1, 5), frac=st.floats(0.05, 0.95))
def test_lloyd_matches_numpy_reference(seed: int, r: int, f: int, frac: float) -> None:
    f = max(f, 2)  # f == 1 takes the 1-D path
    k = min(r - 1, max(1, int(r * frac)))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(r, f))
    init = x[choose_initial_rows(r, k, seed).numpy()] + rng.normal(scale=0.3, size=(k, f))
    ref_labels, ref_c, ref_it = reference_lloyd(x, init)
    res = kmeans(torch.from_numpy(x), torch.from_numpy(init), max_iter=500, tol=0.0, label_tol=0.0, method="lloyd")
    assert np.array_equal(res.labels.numpy(), ref_labels)
    np.testing.assert_allclose(res.centroids.numpy(), ref_c, rtol=1e-10, atol=1e-12)
    assert res.iterations == ref_it
    assert res.inertia == pytest.approx(((x - ref_c[ref_labels]) ** 2).sum(), rel=1e-10)


@FAST
@given(seed=st.integers(0, 10_000), r=st.integers(10, 120), frac=st.floats(0.05, 0.9))
def test_inertia_never_increases(seed: int, r: int, frac: float) -> None:
    k = max(1, int(r * frac))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, 3, generator=g, dtype=torch.float64)
    init = torch.randn(k, 3, generator=g, dtype=torch.float64)  # far from a good start: many iterations
    res = kmeans(x, init, max_iter=100, tol=0.0, label_tol=0.0)
    h = res.history
    assert len(h) == res.iterations
    assert all(b <= a * (1 + 1e-12) + 1e-12 for a, b in zip(h, h[1:], strict=False))
    assert res.inertia <= h[-1] * (1 + 1e-12) + 1e-12


def test_deterministic() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3000, 16, generator=g)
    init = x[choose_initial_rows(3000, 300, 7)]
    a = kmeans(x, init, seed=1, block_bytes=64 << 10)  # several row chunks, parallel spans
    b = kmeans(x, init, seed=1, block_bytes=64 << 10)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.centroids, b.centroids)
    assert a.iterations == b.iterations and a.inertia == b.inertia
    v = torch.randn(300, 1, generator=g)
    assert torch.equal(kmeans(v, v[:30]).centroids, kmeans(v, v[:30]).centroids)


def test_choose_initial_rows() -> None:
    rows = choose_initial_rows(1000, 100, 5)
    assert rows.dtype == torch.int64 and rows.shape == (100,)
    assert len(set(rows.tolist())) == 100 and int(rows.min()) >= 0 and int(rows.max()) < 1000
    assert torch.equal(rows, choose_initial_rows(1000, 100, 5))
    assert not torch.equal(rows, choose_initial_rows(1000, 100, 6))
    assert torch.equal(choose_initial_rows(17, 17, 3), torch.arange(17))
    with pytest.raises(ValueError):
        choose_initial_rows(5, 6, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_device_and_dtype_follow_x(device: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 8, generator=g).to(device, dtype)
    for k, xx in ((20, x), (20, x[:, :1]), (200, x)):
        res = kmeans(xx, xx[:k].clone())
        assert res.centroids.device == xx.device and res.centroids.dtype == dtype
        assert res.centroids.shape == (k, xx.shape[1])
        assert res.labels.device == xx.device and res.labels.dtype == torch.int64 and res.labels.shape == (200,)
        assert int(res.labels.min()) >= 0 and int(res.labels.max()) < k


def test_empty_cluster_keeps_init() -> None:
    x = blobs(50, 4, 6, seed=1)
    init = x[:5].clone()
    init[2] = 1e3  # no row ever comes near
    res = kmeans(x, init, block_bytes=4 << 10)
    assert not bool((res.labels == 2).any())
    assert torch.equal(res.centroids[2], init[2])
    assert bool((res.labels != 2).all())


def test_k_equals_r_is_identity() -> None:
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(64, 5, generator=g), torch.randn(64, 1, generator=g)):
        res = kmeans(x, x.flip(0))  # init irrelevant: the exact trivial solution
        assert torch.equal(res.labels, torch.arange(64)) and torch.equal(res.centroids, x)
        assert res.iterations == 0 and res.inertia == 0.0
        assert res.centroids.data_ptr() != x.data_ptr()  # a copy


def test_invalid_shapes_raise() -> None:
    x = torch.randn(10, 3)
    with pytest.raises(ValueError):
        kmeans(x, torch.randn(11, 3))
    with pytest.raises(ValueError):
        kmeans(x, torch.randn(4, 2))


# ----------------------------------------------------------------------------------- 1-D


@FAST
@given(
    values=st.lists(st.one_of(st.integers(-3, 3).map(float), st.floats(-10, 10)), min_size=1, max_size=9),
    data=st.data(),
)
def test_1d_exact_equals_brute_force(values: list[float], data: st.DataObject) -> None:
    r = len(values)
    k = data.draw(st.integers(1, r))
    x = torch.tensor(values, dtype=torch.float64).unsqueeze(1)
    init = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=k, max_size=k)), dtype=torch.float64)
    res = kmeans(x, init.unsqueeze(1))
    assert res.inertia == pytest.approx(brute_1d(np.array(values), k), rel=1e-9, abs=1e-9)
    c = res.centroids[:, 0]
    assert torch.allclose(c[res.labels], c[res.labels])  # labels index real centroids
    # centroid j is the mean of its rows
    for j in torch.unique(res.labels).tolist():
        assert float(c[j]) == pytest.approx(float(x[res.labels == j, 0].mean()), abs=1e-9)
    if k < r:
        # rank alignment: the q-th smallest centroid sits where the q-th smallest init value is
        slot = torch.from_numpy(np.argsort(init.numpy(), kind="stable"))
        assert bool((c[slot][1:] >= c[slot][:-1]).all())


def test_1d_sort_based_path_is_close_and_aligned() -> None:
    g = torch.Generator().manual_seed(4)
    v = torch.cat([torch.randn(400, generator=g), 5 + 0.1 * torch.randn(100, generator=g)]).double()
    init = v[choose_initial_rows(500, 50, 0)]
    exact = kmeans_1d(v, init)
    approx = kmeans_1d(v, init, exact_max_seconds=0.0)
    assert exact[2] == "dp1d" and approx[2] == "merge1d"

    def inertia(cen: torch.Tensor, labels: torch.Tensor) -> float:
        return float(((v - cen[labels]) ** 2).sum())

    assert inertia(*exact[:2]) <= inertia(*approx[:2]) <= 1.1 * inertia(*exact[:2])
    slot = torch.argsort(init, stable=True)
    assert bool((approx[0][slot].diff() >= 0).all())


# ----------------------------------------------------------------------------------- alignment


def test_two_perturbed_clients_get_corresponding_clusters() -> None:
    base = blobs(40, 12, 8, seed=2)  # 480 rows, 12 true groups
    g = torch.Generator().manual_seed(9)
    init = base[choose_initial_rows(480, 24, 0)].clone()  # same rows of the shared initial model
    a = kmeans(base + 1e-3 * torch.randn(base.shape, generator=g, dtype=base.dtype), init)
    b = kmeans(base + 1e-3 * torch.randn(base.shape, generator=g, dtype=base.dtype), init)
    assert float((a.labels == b.labels).double().mean()) >= 0.95
    # same index, same region: centroid j of client A is nearest to centroid j of client B
    assert torch.equal(torch.cdist(a.centroids, b.centroids).argmin(1), torch.arange(24))
    # 1-D: rank-aligned clusters of two perturbed bias vectors
    v = torch.randn(300, generator=g, dtype=torch.float64)
    i1 = v[choose_initial_rows(300, 30, 1)].unsqueeze(1)
    ca = kmeans((v + 1e-6 * torch.randn(300, generator=g, dtype=v.dtype)).unsqueeze(1), i1).centroids
    cb = kmeans((v + 1e-6 * torch.randn(300, generator=g, dtype=v.dtype)).unsqueeze(1), i1).centroids
    assert float((ca - cb).abs().max()) < 1e-3


# ----------------------------------------------------------------------------------- chunking and memory


def test_chunked_equals_unchunked(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(257, 6, generator=g, dtype=torch.float64)
    c = torch.randn(23, 6, generator=g, dtype=torch.float64)
    whole_labels, whole_partial = lloyd_assign(x, c, block_bytes=1 << 30, workers=1)
    monkeypatch.setattr(kmeans_lloyd, "UNTILED_MAX_K", 4)
    monkeypatch.setattr(kmeans_lloyd, "TILE", 5)  # 5 centroid tiles, the last one short
    rows, tile = block_shape(257, 23, 8, 8 * 5 * 10)
    assert (rows, tile) == (10, 5)  # 26 row chunks
    for workers in (1, 3):
        labels, partial = lloyd_assign(x, c, block_bytes=8 * 5 * 10, workers=workers)
        assert torch.equal(labels, whole_labels)
        assert torch.allclose(partial, whole_partial, rtol=0, atol=1e-12)
    small = kmeans(x, c, block_bytes=8 * 5 * 10, workers=2)
    monkeypatch.undo()
    big = kmeans(x, c, block_bytes=1 << 30, workers=1)
    assert torch.equal(small.labels, big.labels) and torch.allclose(small.centroids, big.centroids, atol=1e-12)
    # exclude_self never matches a row to itself, also across chunk/tile borders
    nn, _ = lloyd_assign(x, x, block_bytes=8 * 5 * 10, exclude_self=True)
    assert bool((nn != torch.arange(257)).all())


def test_block_shape_and_memory_bound() -> None:
    for r, k, size, budget in [
        (250_000, 25_000, 4, km.CPU_BLOCK_BYTES),
        (512, 51, 4, 1 << 20),
        (100, 3000, 8, 1000),
        (10, 5, 4, 1 << 30),
    ]:
        rows, tile = block_shape(r, k, size, budget)
        assert 1 <= rows <= r and 1 <= tile <= k
        assert rows * tile * size <= max(budget, tile * size)  # one row at least
        assert tile == (k if k <= km.UNTILED_MAX_K else km.TILE)
    # the paper's embedding at β = 0.1: far below 512 MB, and far below the dense r×k matrix
    bound = iteration_memory_bytes(250_000, 25_000, 256, workers=2)
    assert bound < 512 * 2**20 < 250_000 * 25_000 * 4


# ----------------------------------------------------------------------------------- warm start, batch API


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_warm_start_converges_in_at_most_3_iterations(beta: float) -> None:
    x = blobs(30, 20, 16, seed=6, spread=0.5)  # 600 rows
    k = int(600 * beta)
    cold = kmeans(x, x[choose_initial_rows(600, k, 0)])
    g = torch.Generator().manual_seed(1)
    moved = x + 0.01 * x.std() * torch.randn(x.shape, generator=g, dtype=x.dtype)
    warm = kmeans(moved, cold.centroids)
    assert warm.iterations <= 3
    assert warm.inertia <= 1.01 * kmeans(moved, x[choose_initial_rows(600, k, 0)]).inertia


def test_warm_start_from_memberships_follows_drifting_rows() -> None:
    """Between rounds every row drifts (here: scaled and shifted, as a whole layer may be); the previous
    memberships carry the partition over, the previous centroids alone lose most clusters."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(400, 8, generator=g, dtype=torch.float64)
    cold = kmeans(x, x[choose_initial_rows(400, 200, 0)])
    moved = 1.5 * x + 4.0
    warm = kmeans(moved, cold.centroids, init_labels=cold.labels)
    assert warm.iterations == 1 and torch.equal(warm.labels, cold.labels)
    assert warm.inertia == pytest.approx(2.25 * cold.inertia, rel=1e-9)
    assert torch.allclose(warm.centroids, 1.5 * cold.centroids + 4.0)
    stale = kmeans(moved, cold.centroids)  # centroids only: most clusters end up empty
    assert int((torch.bincount(stale.labels, minlength=200) == 0).sum()) > 100
    assert warm.inertia < stale.inertia
    # cluster_layers passes memberships per layer
    out = cluster_layers({"w": moved}, {"w": cold.centroids}, init_labels={"w": cold.labels})
    assert torch.equal(out["w"].labels, cold.labels)
    with pytest.raises(ValueError):
        kmeans(moved, cold.centroids, init_labels=torch.full((400,), 200))


def test_cluster_layers_all_layers_one_call() -> None:
    g = torch.Generator().manual_seed(8)
    layers = {
        "emb.weight": torch.randn(300, 16, generator=g),
        "conv.weight": torch.randn(40, 2, 3, generator=g),  # ≥3-D: rows = first dimension
        "ln.weight": torch.randn(64, generator=g),
        "ln.bias": torch.randn(64, generator=g),
        "fc.bias": torch.randn(64, generator=g),
        "tiny.bias": torch.randn(3, generator=g),
    }
    inits = {
        n: km.as_matrix(t)[choose_initial_rows(km.as_matrix(t).shape[0], max(1, t.shape[0] // 4), 0)]
        for n, t in layers.items()
    }
    inits["tiny.bias"] = layers["tiny.bias"].clone()  # k == r
    inits["fc.bias"] = inits["fc.bias"][:, 0]  # a 1-D init is accepted too
    out = cluster_layers(layers, inits)
    assert list(out) == list(layers)
    for name, res in out.items():
        assert isinstance(res, KMeansResult) and res.seconds >= 0
        assert res.labels.shape == (layers[name].shape[0],)
        single = kmeans(km.as_matrix(layers[name]), inits[name].reshape(inits[name].shape[0], -1))
        assert torch.equal(res.labels, single.labels) and torch.allclose(res.centroids, single.centroids)
    assert out["conv.weight"].centroids.shape == (10, 6)
    assert out["tiny.bias"].method == "identity"
    assert out["ln.bias"].method == "dp1d"


def test_opt_in_merge_is_a_valid_partition() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(200, 4, generator=g, dtype=torch.float64)
    init = x[choose_initial_rows(200, 150, 0)]
    res = kmeans(x, init, method="merge")
    assert res.method == "merge" and res.centroids.shape == (150, 4)
    counts = torch.bincount(res.labels, minlength=150)
    assert int(counts.sum()) == 200
    for j in torch.nonzero(counts).flatten().tolist():
        assert torch.allclose(res.centroids[j], x[res.labels == j].mean(0))


def test_empty_clusters_kept_or_relocated_to_the_farthest_rows() -> None:
    # 3 tight groups; init 2 sits far from every row, so its cluster is empty after the first E-step
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(40, 4, generator=g, dtype=torch.float64) * 0.1 + 3 * i for i in range(3)])
    init = torch.stack([x[0], x[45], torch.full((4,), 100.0, dtype=torch.float64)])
    kept = kmeans(x, init, tol=0.0, label_tol=0.0)
    assert int((kept.labels == 2).sum()) == 0 and torch.equal(kept.centroids[2], init[2])
    moved = kmeans(x, init, tol=0.0, label_tol=0.0, empty="farthest")
    sizes = torch.bincount(moved.labels, minlength=3)
    assert sorted(sizes.tolist()) == [40, 40, 40]  # one cluster per group
    assert moved.inertia < 0.05 * kept.inertia
    again = kmeans(x, init, tol=0.0, label_tol=0.0, empty="farthest")
    assert torch.equal(again.labels, moved.labels) and torch.equal(again.centroids, moved.centroids)
    # relocate_empty itself: the e empty clusters, in index order, go to the e farthest rows
    c = torch.zeros(3, 4, dtype=torch.float64)
    out = km.relocate_empty(x, c.clone(), torch.tensor([5, 0, 0]), torch.arange(120, dtype=torch.float64))
    assert torch.equal(out[1], x[119]) and torch.equal(out[2], x[118]) and torch.equal(out[0], c[0])
    with pytest.raises(ValueError, match="empty must be"):
        kmeans(x, init, empty="split")
