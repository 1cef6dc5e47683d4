"""Deterministic, disjoint corpus splits."""

from __future__ import annotations

import pytest

from trustformer.data.split import Splits, split_corpus


def make_corpus(n: int) -> list[tuple[str, str]]:
    """n distinct pairs whose length in words grows with the index."""
    return [(f"предложение {i} " + "слово " * (i % 7), f"sentence {i} " + "word " * (i % 5)) for i in range(n)]


def sources(pairs: list[tuple[str, str]]) -> set[str]:
    return {source for source, _ in pairs}


def parts(splits: Splits) -> list[list[tuple[str, str]]]:
    return [splits.test, splits.public, *splits.clients]


def test_sizes_as_requested() -> None:
    splits = split_corpus(make_corpus(1000), n_clients=3, client_size=200, test_size=100, public_size=150, seed=1)
    assert splits.sizes() == {"public": 150, "clients": [200, 200, 200], "test": 100}


def test_parts_are_pairwise_disjoint_by_source() -> None:
    corpus = make_corpus(600)
    # the same source with another translation must not end up in two parts
    corpus += [(source, target + " (alternative)") for source, target in corpus[:300]]
    splits = split_corpus(corpus, n_clients=4, client_size=None, test_size=50, public_size=50, seed=3)
    seen: set[str] = set()
    for part in parts(splits):
        part_sources = sources(part)
        assert len(part_sources) == len(part)
        assert not part_sources & seen
        seen |= part_sources
    assert len(seen) == 600


def test_remainder_shared_equally() -> None:
    splits = split_corpus(make_corpus(1003), n_clients=4, client_size=None, test_size=100, public_size=100, seed=0)
    assert splits.sizes()["clients"] == [200, 200, 200, 200]


def test_deterministic_for_a_seed_and_independent_of_input_order() -> None:
    corpus = make_corpus(500)
    first = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    again = split_corpus(list(reversed(corpus)), n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    assert first == again


def test_other_seed_gives_other_split() -> None:
    corpus = make_corpus(500)
    first = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=7)
    other = split_corpus(corpus, n_clients=2, client_size=100, test_size=50, public_size=50, seed=8)
    assert first.test != other.test and first.clients != other.clients


def test_does_not_use_global_random_state() -> None:
    import random

    corpus = make_corpus(300)
    random.seed(1)
    first = split_corpus(corpus, n_clients=2, client_size=50, test_size=20, public_size=20, seed=5)
    random.seed(2)
    again = split_corpus(corpus, n_clients=2, client_size=50, test_size=20, public_size=20, seed=5)
    assert first == again


def test_test_set_does_not_depend_on_client_sizes() -> None:
    corpus = make_corpus(800)
    small = split_corpus(corpus, n_clients=2, client_size=50, test_size=40, public_size=30, seed=2)
    large = split_corpus(corpus, n_clients=5, client_size=100, test_size=40, public_size=30, seed=2)
    assert small.test == large.test and small.public == large.public


def test_max_words_filter() -> None:
    corpus = make_corpus(700)
    splits = split_corpus(corpus, n_clients=2, client_size=None, test_size=20, public_size=20, seed=0, max_words=4)
    for part in parts(splits):
        assert all(len(s.split()) <= 4 and len(t.split()) <= 4 for s, t in part)
    assert sum(len(part) for part in parts(splits)) < 700


def test_too_small_corpus_raises_with_numbers() -> None:
    with pytest.raises(ValueError) as info:
        split_corpus(make_corpus(100), n_clients=3, client_size=40, test_size=10, public_size=10, seed=0)
    message = str(info.value)
    assert "100 usable pairs" in message and "140" in message


def test_too_small_for_equal_shares_raises() -> None:
    with pytest.raises(ValueError, match="corpus too small"):
        split_corpus(make_corpus(12), n_clients=3, client_size=None, test_size=5, public_size=5, seed=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_clients": 0, "client_size": 10, "test_size": 1, "public_size": 1},
        {"n_clients": 1, "client_size": 0, "test_size": 1, "public_size": 1},
        {"n_clients": 1, "client_size": 10, "test_size": -1, "public_size": 1},
    ],
)
def test_invalid_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        split_corpus(make_corpus(100), seed=0, **kwargs)


# ----------------------------------------------------------------------------- non-IID partitions


def labelled_corpus(n: int, domains: tuple[str, ...] = ("calc", "writer", "impress", "math", "base")):
    pairs = make_corpus(n)
    return pairs, [domains[i % len(domains)] if i % 3 else domains[0] for i in range(n)]


def test_domain_partition_gives_each_client_whole_disjoint_domains() -> None:
    pairs, domains = labelled_corpus(2000)
    splits = split_corpus(
        pairs,
        n_clients=3,
        client_size=None,
        test_size=200,
        public_size=100,
        seed=0,
        domains=domains,
        partition="domain",
    )
    held = [set(d) for d in splits.client_domains]
    assert all(held) and not (held[0] & held[1]) and not (held[0] & held[2]) and not (held[1] & held[2])
    assert set().union(*held) == set(domains)  # every domain of the pool went to somebody
    assert [sum(d.values()) for d in splits.client_domains] == [len(s) for s in splits.clients]
    assert set(splits.test_domains) == set(domains)  # the shared test set covers every domain
    seen: set[str] = set()
    for part in parts(splits):
        assert not sources(part) & seen
        seen |= sources(part)


def test_domain_partition_truncates_to_requested_sizes_or_says_which_option() -> None:
    pairs, domains = labelled_corpus(2000)
    splits = split_corpus(
        pairs,
        n_clients=3,
        client_size=None,
        test_size=200,
        public_size=100,
        seed=0,
        domains=domains,
        partition="domain",
        client_sizes=[50, 80, 120],
    )
    assert splits.sizes()["clients"] == [50, 80, 120]
    with pytest.raises(ValueError, match="data.client_size"):
        split_corpus(
            pairs,
            n_clients=3,
            client_size=1500,
            test_size=200,
            public_size=100,
            seed=0,
            domains=domains,
            partition="domain",
        )
    with pytest.raises(ValueError, match="at least as many domains as clients"):
        split_corpus(
            pairs,
            n_clients=6,
            client_size=None,
            test_size=200,
            public_size=100,
            seed=0,
            domains=domains,
            partition="domain",
        )


def test_dirichlet_skews_domains_with_small_alpha_and_is_deterministic() -> None:
    pairs, domains = labelled_corpus(3000)
    kw = dict(
        n_clients=4, client_size=None, test_size=200, public_size=100, seed=5, domains=domains, partition="dirichlet"
    )
    skewed = split_corpus(pairs, alpha=0.1, **kw)
    assert skewed == split_corpus(pairs, alpha=0.1, **kw)
    even = split_corpus(pairs, alpha=1000.0, **kw)

    def skew(splits):  # mean total-variation distance of a client's domain mix from the whole pool's
        pool: dict[str, int] = {}
        for d in splits.client_domains:
            for k, v in d.items():
                pool[k] = pool.get(k, 0) + v
        n = sum(pool.values())
        return sum(
            0.5 * sum(abs(d.get(k, 0) / sum(d.values()) - pool[k] / n) for k in pool) for d in splits.client_domains
        ) / len(splits.client_domains)

    assert skew(skewed) > 0.3 and skew(even) < 0.05
    assert sum(len(s) for s in skewed.clients) == 3000 - 300  # the whole pool, disjointly
    seen: set[str] = set()
    for part in parts(skewed):
        assert not sources(part) & seen
        seen |= sources(part)


def test_non_iid_partitions_need_domains() -> None:
    with pytest.raises(ValueError, match="third column `domain`"):
        split_corpus(
            make_corpus(500), n_clients=2, client_size=None, test_size=50, public_size=50, seed=0, partition="dirichlet"
        )


def test_unequal_iid_sizes() -> None:
    splits = split_corpus(
        make_corpus(1000),
        n_clients=3,
        client_size=None,
        test_size=100,
        public_size=100,
        seed=0,
        client_sizes=[100, 300, 50],
    )
    assert splits.sizes()["clients"] == [100, 300, 50]
    with pytest.raises(ValueError, match="corpus too small"):
        split_corpus(
            make_corpus(1000),
            n_clients=2,
            client_size=None,
            test_size=100,
            public_size=100,
            seed=0,
            client_sizes=[500, 500],
        )
